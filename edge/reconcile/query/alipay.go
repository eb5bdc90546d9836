package query

import (
	"bytes"
	"context"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
	_ "time/tzdata" // Alipay reads the request's timestamp as Beijing time: never depend on the host's zone files

	"github.com/go-pay/gopay"
	"github.com/go-pay/gopay/alipay"
	"github.com/go-pay/gopay/pkg/xhttp"
)

// AlipayConfig configures the Alipay querier.
type AlipayConfig struct {
	AppID string
	// AppPrivateKey is the app's private key: PKCS#1 or PKCS#8, PEM or
	// bare base64. gopay signs every request with it (RSA2).
	AppPrivateKey string
	// PublicKeys are Alipay's public keys (several during a rotation); an
	// answer must verify with one of them.
	PublicKeys []*rsa.PublicKey
	// NotAfter is optional, parallel to PublicKeys: a key past its entry
	// verifies nothing (zero: no expiry).
	NotAfter []time.Time
	// SellerID is put into the stored body when set: Alipay's answer is
	// scoped to our app, so the seller is ours.
	SellerID string
	// AppCert, RootCert and AlipayCert are the public-key-certificate
	// mode's certificates (PEM): the app's public key certificate, Alipay's
	// root certificate, and Alipay's public key certificate (whose key is
	// among PublicKeys). With AppCert set, every request carries
	// app_cert_sn and alipay_root_cert_sn, as Alipay requires in that mode.
	AppCert, RootCert, AlipayCert []byte
	// BaseURL is the full gateway URL (default
	// "https://openapi.alipay.com/gateway.do").
	BaseURL string
	// Timeout bounds one query (default DefaultTimeout); BillTimeout
	// fetching one statement (default DefaultBillTimeout).
	Timeout, BillTimeout time.Duration
	// Now is the clock for key expiry (default time.Now).
	Now func() time.Time
	// Transport carries the requests (default a clone of
	// http.DefaultTransport, which verifies TLS; gopay's own default
	// client does not).
	Transport http.RoundTripper
}

// DefaultAlipayBaseURL is Alipay's gateway.
const DefaultAlipayBaseURL = "https://openapi.alipay.com/gateway.do"

// alipayZone is the zone of the request's timestamp.
const alipayZone = "Asia/Shanghai"

// Alipay asks Alipay about orders with gopay: gopay signs each request
// (RSA2) and extracts the signed part of each answer, which gopay's
// VerifySyncSign checks against the configured Alipay public keys.
type Alipay struct {
	cfg    AlipayConfig
	client *alipay.Client
	// keys are PublicKeys as base64 DER, the form VerifySyncSign takes.
	keys []string
	// download fetches a statement's zip from the URL Alipay hands out
	// (another host than the gateway; not rewritten).
	download *http.Client
}

var _ Querier = (*Alipay)(nil)

// NewAlipay returns the Alipay querier for cfg.
func NewAlipay(cfg AlipayConfig) (*Alipay, error) {
	if cfg.AppID == "" {
		return nil, errors.New("alipay query: no app id")
	}
	if len(cfg.PublicKeys) == 0 {
		return nil, errors.New("alipay query: no Alipay public key")
	}
	if len(cfg.NotAfter) > len(cfg.PublicKeys) {
		return nil, errors.New("alipay query: more NotAfter entries than public keys")
	}
	// gopay puts a key it cannot parse into its error: parse it here, and
	// hand gopay only the re-encoded key it reads (bare base64 PKCS#1).
	key, err := ParsePrivateKey(cfg.AppPrivateKey)
	if err != nil {
		return nil, fmt.Errorf("alipay query: app %w", err)
	}
	keys := make([]string, len(cfg.PublicKeys))
	for i, k := range cfg.PublicKeys {
		if k == nil {
			return nil, fmt.Errorf("alipay query: public key %d is nil", i+1)
		}
		der, err := x509.MarshalPKIXPublicKey(k)
		if err != nil {
			return nil, fmt.Errorf("alipay query: public key %d: %w", i+1, err)
		}
		keys[i] = base64.StdEncoding.EncodeToString(der)
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultAlipayBaseURL
	}
	to, err := parseBase(cfg.BaseURL, true)
	if err != nil {
		return nil, fmt.Errorf("alipay query: %w", err)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.BillTimeout <= 0 {
		cfg.BillTimeout = DefaultBillTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if _, err := time.LoadLocation(alipayZone); err != nil {
		return nil, fmt.Errorf("alipay query: %w", err)
	}
	client, err := alipay.NewClient(cfg.AppID, base64.StdEncoding.EncodeToString(x509.MarshalPKCS1PrivateKey(key)), true)
	if err != nil {
		return nil, errors.New("alipay query: gopay refused the app private key") // its error quotes the key
	}
	client.DebugSwitch = gopay.DebugOff // its debug log prints requests, answers and signed content
	if len(cfg.AppCert) > 0 {
		if len(cfg.RootCert) == 0 || len(cfg.AlipayCert) == 0 {
			return nil, errors.New("alipay query: certificate mode needs the app certificate, Alipay's root certificate and Alipay's public key certificate")
		}
		// gopay computes the serial numbers Alipay expects (app_cert_sn,
		// alipay_root_cert_sn: the root chain's RSA certificates) and sends
		// them with every request.
		if err := client.SetCertSnByContent(cfg.AppCert, cfg.RootCert, cfg.AlipayCert); err != nil {
			return nil, fmt.Errorf("alipay query: certificate mode: %w", err)
		}
	}
	client.SetLocation(alipayZone)
	// gopay's default HTTP client skips TLS verification: replace it
	// whole, transport included.
	hc := xhttp.NewClient()
	hc.HttpClient = newHTTPClient(to, cfg.Transport, cfg.Timeout)
	hc.SetBodySize(maxAnswer >> 20)
	client.SetHttpClient(hc)
	download := newClient(orDefault(cfg.Transport), 0)
	return &Alipay{cfg: cfg, client: client, keys: keys, download: download}, nil
}

// Query asks Alipay about orderNo (alipay.trade.query by out_trade_no).
func (a *Alipay) Query(ctx context.Context, orderNo string) (Answer, error) {
	if err := validOrderNo(orderNo); err != nil {
		return Answer{}, fmt.Errorf("alipay query: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	raw := &capture{}
	ctx = context.WithValue(ctx, captureKey{}, raw)
	_, err := a.client.TradeQuery(ctx, make(gopay.BodyMap).Set("out_trade_no", orderNo))
	if err != nil {
		if bizErr, ok := alipay.IsBizError(err); ok {
			return a.refused(orderNo, bizErr, raw.body)
		}
		if errors.Is(err, gopay.UnmarshalErr) { // its message holds the whole answer
			return Answer{}, fmt.Errorf("alipay query %s: the answer is not an alipay_trade_query_response", orderNo)
		}
		return Answer{}, fmt.Errorf("alipay query %s: %w", orderNo, err)
	}
	// The signed text is taken from the raw answer, the response member
	// exactly as sent, and checked with gopay's VerifySyncSign: gopay's own
	// extraction (SignData) finds nothing when the answer carries
	// alipay_cert_sn (certificate mode) unless gopay verifies it itself.
	// The fields are then read from the verified text, not from gopay's
	// decoding of the whole body.
	content, sign, serr := alipaySigned(raw.body, "alipay_trade_query_response")
	if serr != nil {
		return Answer{}, fmt.Errorf("alipay query %s: %w: %v", orderNo, ErrUnverified, serr)
	}
	if err := a.verify(content, sign); err != nil {
		return Answer{}, fmt.Errorf("alipay query %s: %w", orderNo, err)
	}
	var t alipay.TradeQuery
	if err := json.Unmarshal([]byte(content), &t); err != nil {
		return Answer{}, fmt.Errorf("alipay query %s: the signed answer does not decode: %w", orderNo, err)
	}
	switch {
	case t.Code != "10000":
		return Answer{}, fmt.Errorf("alipay query %s: the signed answer says code %q", orderNo, printable(t.Code))
	case t.OutTradeNo != orderNo:
		return Answer{}, fmt.Errorf("alipay query %s: the answer is about another order", orderNo)
	}
	switch t.TradeStatus {
	case "TRADE_SUCCESS", "TRADE_FINISHED":
		if t.TradeNo == "" || t.TotalAmount == "" {
			return Answer{}, fmt.Errorf("alipay query %s: a paid answer without trade_no or total_amount", orderNo)
		}
		return Answer{State: Paid, ChannelState: t.TradeStatus, Body: a.storedBody(&t)}, nil
	case "WAIT_BUYER_PAY":
		return Answer{State: Pending, ChannelState: t.TradeStatus}, nil
	case "TRADE_CLOSED":
		// Closed unpaid, or paid and then refunded in full: a trade that
		// was paid says when (send_pay_date) and has its trade_no. Such a
		// trade is never applied as a payment.
		if t.SendPayDate != "" && t.TradeNo != "" && t.TotalAmount != "" {
			return Answer{State: Refunded, ChannelState: t.TradeStatus, Body: a.storedBody(&t)}, nil
		}
		return Answer{State: Closed, ChannelState: t.TradeStatus}, nil
	}
	return Answer{}, fmt.Errorf("alipay query %s: unexpected trade_status %q", orderNo, printable(t.TradeStatus))
}

// refused handles an answer whose code is not 10000, which gopay returns
// as a *BizErr without extracting or verifying anything. An unknown trade
// (40004 ACQ.TRADE_NOT_EXIST) is a normal answer, and counts only once its
// signature verifies: its signed text is taken from the raw answer here and
// checked with gopay's VerifySyncSign as a paid one is.
func (a *Alipay) refused(orderNo string, bizErr *alipay.BizErr, raw []byte) (Answer, error) {
	if bizErr.Code != "40004" || bizErr.SubCode != "ACQ.TRADE_NOT_EXIST" {
		return Answer{}, fmt.Errorf("alipay query %s: %s %s: %s", orderNo, printable(bizErr.Code),
			printable(bizErr.SubCode), clip(bizErr.SubMsg))
	}
	content, sign, err := alipaySigned(raw, "alipay_trade_query_response")
	if err != nil {
		return Answer{}, fmt.Errorf("alipay query %s: ACQ.TRADE_NOT_EXIST: %w: %v", orderNo, ErrUnverified, err)
	}
	if err := a.verify(content, sign); err != nil {
		return Answer{}, fmt.Errorf("alipay query %s: ACQ.TRADE_NOT_EXIST: %w", orderNo, err)
	}
	var e alipay.TradeQuery
	if err := json.Unmarshal([]byte(content), &e); err != nil || e.Code != "40004" || e.SubCode != "ACQ.TRADE_NOT_EXIST" {
		return Answer{}, fmt.Errorf("alipay query %s: the signed answer is not ACQ.TRADE_NOT_EXIST", orderNo)
	}
	if e.OutTradeNo != "" && e.OutTradeNo != orderNo {
		return Answer{}, fmt.Errorf("alipay query %s: the answer is about another order", orderNo)
	}
	return Answer{State: NotFound, ChannelState: e.SubCode}, nil
}

// verify checks sign over content with each configured key still valid,
// through gopay's VerifySyncSign (RSA2: SHA256withRSA, base64).
func (a *Alipay) verify(content, sign string) error {
	if content == "" || sign == "" {
		return fmt.Errorf("%w: no signed content or no sign", ErrUnverified)
	}
	now := a.cfg.Now()
	tried := 0
	for i, k := range a.keys {
		if i < len(a.cfg.NotAfter) && !a.cfg.NotAfter[i].IsZero() && now.After(a.cfg.NotAfter[i]) {
			continue // an expired key verifies nothing
		}
		tried++
		if ok, err := alipay.VerifySyncSign(k, content, sign); ok && err == nil {
			return nil
		}
	}
	if tried == 0 {
		return fmt.Errorf("%w: every Alipay public key has expired", ErrUnverified)
	}
	return fmt.Errorf("%w: sign does not verify with any of %d Alipay public keys", ErrUnverified, tried)
}

// storedBody is the stored delivery of a paid answer: the form of a
// notification, which channel.Alipay.Redrive maps as the trade's payment
// notification (same trade_no, out_trade_no, total_amount as sent).
func (a *Alipay) storedBody(t *alipay.TradeQuery) []byte {
	form := url.Values{}
	form.Set("notify_type", "trade_query")
	form.Set("trade_no", t.TradeNo)
	form.Set("out_trade_no", t.OutTradeNo)
	form.Set("trade_status", t.TradeStatus)
	form.Set("total_amount", t.TotalAmount)
	form.Set("app_id", a.cfg.AppID)
	if a.cfg.SellerID != "" {
		form.Set("seller_id", a.cfg.SellerID)
	}
	form.Set("charset", "utf-8")
	if t.SendPayDate != "" {
		form.Set("gmt_payment", t.SendPayDate)
	}
	return []byte(form.Encode())
}

// alipaySigned returns the exact text of the top-level member name (the
// text Alipay signs) and the top-level sign. A repeated member is refused:
// which one was signed would be ambiguous.
func alipaySigned(raw []byte, name string) (content, sign string, err error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", "", errors.New("the answer is not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", "", errors.New("the answer is not a JSON object")
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return "", "", errors.New("the answer is not a JSON object")
		}
		if key != name && key != "sign" {
			continue
		}
		if seen[key] {
			return "", "", fmt.Errorf("%s appears twice", key)
		}
		seen[key] = true
		if key == name {
			content = string(v)
		} else if err := json.Unmarshal(v, &sign); err != nil {
			return "", "", errors.New("sign is not a string")
		}
	}
	if content == "" || sign == "" {
		return "", "", fmt.Errorf("no %s or no sign", name)
	}
	return content, sign, nil
}
