package channel

import (
	"bytes"
	"cmp"
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// The WeChat Pay API v3 channel. A notification is JSON whose "resource" is
// the transaction (or refund), encrypted with AEAD_AES_256_GCM under the
// merchant's APIv3 key; the request is signed by WeChat (SHA256-RSA2048,
// PKCS#1 v1.5, base64) over "{Wechatpay-Timestamp}\n{Wechatpay-Nonce}\n{body}\n"
// with the platform key named by Wechatpay-Serial. Success is acknowledged
// with 200 and an empty body; failure with 4xx/5xx and
// {"code":"FAIL","message":...}.

// WeChatPayConfig configures a WeChat Pay channel.
type WeChatPayConfig struct {
	Name string
	// APIv3Key is the merchant's 32-byte APIv3 key (EDGE_SECRET_<CHANNEL>).
	APIv3Key string
	// PlatformKeys are WeChat's platform public keys by serial
	// (Wechatpay-Serial); several at once during a rotation.
	PlatformKeys map[string]*rsa.PublicKey
	// NotAfter is the expiry of the keys that came as certificates, by
	// serial: a signature by one past it is refused like an unknown serial.
	NotAfter map[string]time.Time
	// MchID is this merchant's id and AppIDs its apps' (a mini program, an
	// app and an official account may share one mchid); a notification for
	// others is a MERCHANT_MISMATCH review case. Empty: not checked.
	MchID  string
	AppIDs []string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// WeChatPay is the WeChat Pay API v3 channel.
type WeChatPay struct {
	cfg  WeChatPayConfig
	aead cipher.AEAD
}

var _ Channel = (*WeChatPay)(nil)

// NewWeChatPay returns the WeChat Pay channel for cfg.
func NewWeChatPay(cfg WeChatPayConfig) (*WeChatPay, error) {
	if !ValidChannelName(cfg.Name) {
		return nil, fmt.Errorf("channel %q: name must match [a-z0-9_]{1,32}", cfg.Name)
	}
	if len(cfg.APIv3Key) != 32 {
		return nil, fmt.Errorf("channel %s: the APIv3 key must be 32 bytes, got %d", cfg.Name, len(cfg.APIv3Key))
	}
	if len(cfg.PlatformKeys) == 0 {
		return nil, fmt.Errorf("channel %s: no platform public key", cfg.Name)
	}
	block, err := aes.NewCipher([]byte(cfg.APIv3Key))
	if err != nil {
		return nil, fmt.Errorf("channel %s: %w", cfg.Name, err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("channel %s: %w", cfg.Name, err)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &WeChatPay{cfg: cfg, aead: aead}, nil
}

// Name returns the channel name.
func (w *WeChatPay) Name() string { return w.cfg.Name }

// wechatNotification is the notification envelope.
type wechatNotification struct {
	ID        string `json:"id"`
	EventType string `json:"event_type"`
	Resource  struct {
		Algorithm      string `json:"algorithm"`
		Ciphertext     string `json:"ciphertext"`
		AssociatedData string `json:"associated_data"`
		Nonce          string `json:"nonce"`
		OriginalType   string `json:"original_type"`
	} `json:"resource"`
}

// wechatResource is the decrypted transaction or refund.
type wechatResource struct {
	MchID         string `json:"mchid"`
	AppID         string `json:"appid"`
	OutTradeNo    string `json:"out_trade_no"`
	TransactionID string `json:"transaction_id"`
	TradeState    string `json:"trade_state"`
	RefundID      string `json:"refund_id"`
	RefundStatus  string `json:"refund_status"`
	Amount        struct {
		Total    *int64 `json:"total"`
		Refund   *int64 `json:"refund"`
		Currency string `json:"currency"`
	} `json:"amount"`
}

// WeChatQueriedEvent is the event_type of a stored delivery built from the
// answer of WeChat's order query (reconciliation) rather than from a
// callback: its resource is the transaction as the query returned it. A
// trade_state of SUCCESS, or REFUND (paid, then refunded), is the payment
// its TRANSACTION.SUCCESS callback would have announced, and maps to the
// same key and digest, so that whichever of the two arrives second is a
// replay.
const WeChatQueriedEvent = "TRANSACTION.QUERIED"

// WeChatSignatureProbe prefixes the signatures WeChat sends to check that a
// merchant verifies them: always an authentication failure.
const WeChatSignatureProbe = "WECHATPAY/SIGNTEST/"

// Parse verifies, decrypts and maps a notification.
func (w *WeChatPay) Parse(req *Request, d *Delivery) *Reject {
	ts, ok1 := single(req.Header, "Wechatpay-Timestamp")
	nonce, ok2 := single(req.Header, "Wechatpay-Nonce")
	sig, ok3 := single(req.Header, "Wechatpay-Signature")
	serial, ok4 := single(req.Header, "Wechatpay-Serial")
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return unauthorized("a Wechatpay-* header is repeated")
	}
	if len(ts) == 0 || len(nonce) == 0 || len(sig) == 0 || len(serial) == 0 {
		return unauthorized("missing Wechatpay-Timestamp, -Nonce, -Signature or -Serial")
	}
	if bytes.HasPrefix(sig, []byte(WeChatSignatureProbe)) {
		return unauthorized("signature probe")
	}
	sec, ok := parseUnixSeconds(ts)
	if !ok {
		return unauthorized("Wechatpay-Timestamp: not unix seconds")
	}
	if age := w.cfg.Now().Sub(time.Unix(sec, 0)); age > WebhookTolerance || age < -WebhookTolerance {
		return unauthorized("Wechatpay-Timestamp: more than 5 minutes from now")
	}
	key, ok := w.cfg.PlatformKeys[string(serial)]
	if !ok {
		return unauthorized("unknown Wechatpay-Serial")
	}
	if na, ok := w.cfg.NotAfter[string(serial)]; ok && w.cfg.Now().After(na) {
		return unauthorized("Wechatpay-Serial: the platform certificate has expired")
	}
	h := sha256.New()
	for _, part := range [][]byte{ts, newline, nonce, newline, req.Body, newline} {
		h.Write(part)
	}
	raw, err := base64.StdEncoding.DecodeString(string(sig))
	if err != nil || rsa.VerifyPKCS1v15(key, crypto.SHA256, h.Sum(nil), raw) != nil {
		return unauthorized("Wechatpay-Signature does not verify")
	}
	if !isMedia(req.ContentType, mediaJSON) {
		return badRequest("content-type: must be application/json")
	}
	var n wechatNotification
	if err := json.Unmarshal(req.Body, &n); err != nil {
		return badRequest("body: not a WeChat Pay notification")
	}
	plain, rej := w.decrypt(&n)
	if rej != nil {
		return rej
	}
	return w.mapResource(req.Body, n.EventType, plain, d)
}

// Redrive decides again a notification stored in a review row: the
// envelope with its resource decrypted in place (the form review rows
// keep), or, from rows an earlier build wrote, still encrypted. Its
// signature was verified when it arrived, so only the mapping runs.
func (w *WeChatPay) Redrive(body []byte, d *Delivery) *Reject {
	var env struct {
		EventType string          `json:"event_type"`
		Resource  json.RawMessage `json:"resource"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return badRequest("body: not a stored WeChat Pay notification")
	}
	plain := []byte(env.Resource)
	var n wechatNotification
	if json.Unmarshal(body, &n) == nil && n.Resource.Ciphertext != "" {
		var rej *Reject
		if plain, rej = w.decrypt(&n); rej != nil {
			return rej
		}
	}
	return w.mapResource(body, env.EventType, plain, d)
}

// decrypt opens the notification's resource with the APIv3 key.
func (w *WeChatPay) decrypt(n *wechatNotification) ([]byte, *Reject) {
	if n.Resource.Algorithm != "AEAD_AES_256_GCM" {
		return nil, badRequest("resource.algorithm: must be AEAD_AES_256_GCM")
	}
	ct, err := base64.StdEncoding.DecodeString(n.Resource.Ciphertext)
	if err != nil || len(n.Resource.Nonce) != w.aead.NonceSize() {
		return nil, unauthorized("resource does not decrypt")
	}
	plain, err := w.aead.Open(nil, []byte(n.Resource.Nonce), ct, []byte(n.Resource.AssociatedData))
	if err != nil {
		return nil, unauthorized("resource does not decrypt") // tampered, or another key
	}
	return plain, nil
}

// mapResource maps a decrypted transaction or refund of event eventType
// onto the business fields; body is the envelope as received, for the
// review row.
func (w *WeChatPay) mapResource(body []byte, eventType string, plain []byte, d *Delivery) *Reject {
	n := struct{ EventType string }{eventType}
	var r wechatResource
	if err := json.Unmarshal(plain, &r); err != nil {
		return badRequest("resource: not a transaction or refund")
	}
	var amount *int64
	switch {
	case n.EventType == "TRANSACTION.SUCCESS" && r.TradeState == "SUCCESS",
		n.EventType == WeChatQueriedEvent && (r.TradeState == "SUCCESS" || r.TradeState == "REFUND"):
		d.Event, amount = eventPaySuccess, r.Amount.Total
	case n.EventType == "REFUND.SUCCESS" && r.RefundStatus == "SUCCESS",
		(n.EventType == "REFUND.ABNORMAL" || n.EventType == "REFUND.CLOSED") && r.RefundStatus == n.EventType[len("REFUND."):]:
		// A refund of the trade transaction_id, keyed by refund_id, for
		// amount.refund of amount.total; ABNORMAL and CLOSED mean the
		// buyer did not get the money: a human must look.
		d.Event, amount = eventRefundSuccess, r.Amount.Total
		if n.EventType != "REFUND.SUCCESS" {
			d.Event = eventRefundFailed
		}
		d.RefundID = d.keep(r.RefundID)
		if !printableASCII(d.RefundID, 64) {
			return badRequest("refund_id: must be 1 to 64 printable ASCII characters")
		}
		if r.Amount.Refund == nil || *r.Amount.Refund <= 0 || r.Amount.Total == nil || *r.Amount.Refund > *r.Amount.Total {
			return badRequest("amount.refund: must be a positive integer in fen, at most amount.total")
		}
		d.RefundAmount = *r.Amount.Refund
	default:
		return badRequest("event_type %q with this state is not an event notifyedge acts on", n.EventType)
	}
	d.TxnID = d.keep(r.TransactionID)
	d.OrderNo = d.keep(r.OutTradeNo)
	d.Currency = d.keep(cmp.Or(r.Amount.Currency, "CNY"))
	if !printableASCII(d.TxnID, 64) || !printableASCII(d.OrderNo, 64) {
		return badRequest("transaction_id, out_trade_no: must be 1 to 64 printable ASCII characters")
	}
	if amount == nil || *amount <= 0 || *amount > maxSafeInteger {
		return badRequest("amount.total: must be a positive integer in fen")
	}
	if !isCurrency(d.Currency) {
		return badRequest("amount.currency: must be three upper-case letters")
	}
	d.ReviewBody = reviewBody(body, plain)
	d.Amount = *amount
	d.Finish(w.cfg.Name)
	if (w.cfg.MchID != "" && r.MchID != w.cfg.MchID) || (len(w.cfg.AppIDs) > 0 && r.AppID != "" && !slices.Contains(w.cfg.AppIDs, r.AppID)) {
		return &Reject{Kind: MerchantMismatch, Message: "mchid or appid is not this channel's: held for review"}
	}
	return nil
}

// reviewBody is the notification with its encrypted resource replaced by
// the decrypted one, for the review row: an operator must be able to read
// what was paid or refunded, and a re-drive decides it again. Key material
// is never in it: the resource is the transaction or refund itself.
func reviewBody(body, plain []byte) []byte {
	var env map[string]json.RawMessage
	if json.Unmarshal(body, &env) != nil || !json.Valid(plain) {
		return nil
	}
	env["resource"] = plain
	out, err := json.Marshal(env)
	if err != nil {
		return nil
	}
	return out
}

// Render: success is 200 with an empty body; failure
// {"code":"FAIL","message":...}.
func (w *WeChatPay) Render(dst []byte, v *Verdict) ([]byte, string) {
	if v.Success {
		return dst[:0], ""
	}
	msg := v.Message
	if msg == "" {
		msg = v.Outcome
	}
	dst = append(dst, `{"code":"FAIL","message":`...)
	dst = appendJSONString(dst, msg)
	return append(dst, '}'), "application/json"
}
