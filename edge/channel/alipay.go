package channel

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"
)

// The Alipay asynchronous notification channel: an
// application/x-www-form-urlencoded POST, signed by Alipay (sign_type RSA2:
// SHA256withRSA, base64 "sign") over the parameters except sign and
// sign_type, empty ones left out, sorted by name, as "k=v&k=v" of the
// decoded values. The acknowledgement is the bare body "success"; anything
// else ("failure") makes Alipay retry.

// AlipayConfig configures an Alipay channel.
type AlipayConfig struct {
	Name string
	// PublicKeys are Alipay's public keys (several during a rotation).
	PublicKeys []*rsa.PublicKey
	// NotAfter, when set, is the expiry of each of PublicKeys that came as
	// a certificate (zero: a bare key): a signature only such a key
	// verifies, past it, is refused.
	NotAfter []time.Time
	// AppIDs and SellerID are this merchant's (several apps may share one
	// seller id); a notification for others is a MERCHANT_MISMATCH review
	// case. Empty: not checked.
	AppIDs   []string
	SellerID string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Alipay is the Alipay channel.
type Alipay struct{ cfg AlipayConfig }

var _ Channel = (*Alipay)(nil)

// NewAlipay returns the Alipay channel for cfg.
func NewAlipay(cfg AlipayConfig) (*Alipay, error) {
	if !ValidChannelName(cfg.Name) {
		return nil, fmt.Errorf("channel %q: name must match [a-z0-9_]{1,32}", cfg.Name)
	}
	if len(cfg.PublicKeys) == 0 {
		return nil, fmt.Errorf("channel %s: no Alipay public key", cfg.Name)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Alipay{cfg: cfg}, nil
}

// Name returns the channel name.
func (a *Alipay) Name() string { return a.cfg.Name }

var mediaForm = []byte("application/x-www-form-urlencoded")

// Parse verifies and maps a notification.
func (a *Alipay) Parse(req *Request, d *Delivery) *Reject {
	if !isMedia(req.ContentType, mediaForm) {
		return badRequest("content-type: must be application/x-www-form-urlencoded")
	}
	form, rej := parseForm(req.Body)
	if rej != nil {
		return rej
	}
	get := func(k string) string { return form.Get(k) }
	sig, err := base64.StdEncoding.DecodeString(get("sign"))
	if err != nil || len(sig) == 0 || get("sign_type") != "RSA2" {
		return unauthorized("missing sign, or sign_type is not RSA2")
	}
	sum := sha256.Sum256([]byte(AlipaySignedContent(form)))
	verified := false
	for i, k := range a.cfg.PublicKeys {
		if i < len(a.cfg.NotAfter) && !a.cfg.NotAfter[i].IsZero() && a.cfg.Now().After(a.cfg.NotAfter[i]) {
			continue // an expired certificate verifies nothing
		}
		if rsa.VerifyPKCS1v15(k, crypto.SHA256, sum[:], sig) == nil {
			verified = true
			break
		}
	}
	if !verified {
		return unauthorized("sign does not verify")
	}
	return a.mapForm(form, d)
}

// Redrive decides again a notification stored in a review row: its
// signature was verified when it arrived (and may have expired with a key
// rotated out since), so only the mapping runs.
func (a *Alipay) Redrive(body []byte, d *Delivery) *Reject {
	form, rej := parseForm(body)
	if rej != nil {
		return rej
	}
	return a.mapForm(form, d)
}

// parseForm parses the form body; a repeated parameter is refused.
func parseForm(body []byte) (url.Values, *Reject) {
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, badRequest("body: not a form")
	}
	for k, vs := range form {
		if len(vs) != 1 {
			return nil, badRequest("%s: repeated parameter", printable([]byte(k)))
		}
	}
	return form, nil
}

// mapForm maps a verified notification onto the business fields.
func (a *Alipay) mapForm(form url.Values, d *Delivery) *Reject {
	get := func(k string) string { return form.Get(k) }
	if cs := strings.ToLower(get("charset")); cs != "" && cs != "utf-8" {
		return badRequest("charset: only utf-8 is supported")
	}
	// A notification that carries out_biz_no and refund_fee is a refund of
	// trade_no keyed by out_biz_no, whatever its trade_status (a partial
	// refund leaves it TRADE_SUCCESS): never a replay of the payment.
	// refund_fee is the trade's refunded total so far, so durable raises
	// the order's refunded amount to it (refunds out of order or twice
	// never refund twice).
	bizNo, refundFee := get("out_biz_no"), get("refund_fee")
	switch status := get("trade_status"); {
	case bizNo != "" || refundFee != "":
		if bizNo == "" || refundFee == "" {
			return badRequest("out_biz_no and refund_fee: a refund carries both")
		}
		fee, ok := ParseYuan(refundFee)
		if !ok {
			return badRequest("refund_fee: must be yuan with at most two decimals, e.g. 19.99")
		}
		d.Event, d.RefundID, d.RefundAmount, d.Cumulative = eventRefundSuccess, d.keep(bizNo), fee, true
		if !printableASCII(d.RefundID, 64) {
			return badRequest("out_biz_no: must be 1 to 64 printable ASCII characters")
		}
	case status == "TRADE_SUCCESS" || status == "TRADE_FINISHED":
		d.Event = eventPaySuccess
	case status == "TRADE_CLOSED": // an unpaid trade closed, or a paid one fully refunded
		d.Event = eventTradeClosed
	default:
		return badRequest("trade_status %q is not an event notifyedge acts on", status)
	}
	d.TxnID, d.OrderNo, d.Currency = d.keep(get("trade_no")), d.keep(get("out_trade_no")), d.keep("CNY")
	if !printableASCII(d.TxnID, 64) || !printableASCII(d.OrderNo, 64) {
		return badRequest("trade_no, out_trade_no: must be 1 to 64 printable ASCII characters")
	}
	amount, ok := ParseYuan(get("total_amount"))
	if !ok {
		return badRequest("total_amount: must be yuan with at most two decimals, e.g. 19.99")
	}
	if d.Cumulative && d.RefundAmount > amount {
		return badRequest("refund_fee: at most total_amount")
	}
	d.Amount = amount
	d.Finish(a.cfg.Name)
	if (len(a.cfg.AppIDs) > 0 && !slices.Contains(a.cfg.AppIDs, get("app_id"))) || (a.cfg.SellerID != "" && get("seller_id") != a.cfg.SellerID) {
		return &Reject{Kind: MerchantMismatch, Message: "app_id or seller_id is not this channel's: held for review"}
	}
	return nil
}

// AlipaySignedContent is the content Alipay's signature of a notification
// covers, built as Alipay's own SDK builds it when it checks one
// (alipay-sdk-java, AlipaySignature.getSignCheckContentV1 behind
// rsaCheckV1): sign and sign_type removed, every parameter whose key or
// value is empty or white space only left out (StringUtils.areNotEmpty),
// the keys sorted, "k=v" joined by "&", values as decoded from the form.
// (go-pay/gopay leaves out only empty values; smartwalle/alipay keeps them:
// on a notification with an empty parameter it would compute another
// content than Alipay's.)
func AlipaySignedContent(form url.Values) string {
	keys := make([]string, 0, len(form))
	for k, vs := range form {
		if k != "sign" && k != "sign_type" && !javaBlank(k) && len(vs) > 0 && !javaBlank(vs[0]) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(form.Get(k))
	}
	return b.String()
}

// javaBlank reports what the Java SDK's StringUtils.isEmpty reports: s is
// empty or every character is Java white space (Character.isWhitespace:
// the space separators but the no-break ones, and \t \n \v \f \r and
// \x1c-\x1f).
func javaBlank(s string) bool {
	for _, r := range s {
		switch {
		case r == '\u00a0' || r == '\u2007' || r == '\u202f':
			return false
		case r >= '\t' && r <= '\r', r >= 0x1c && r <= 0x1f, unicode.IsSpace(r), unicode.Is(unicode.Zs, r),
			r == '\u2028', r == '\u2029':
		default:
			return false
		}
	}
	return true
}

// ParseYuan converts a decimal yuan amount ("19.99", "0.1", "5") to fen
// exactly, never through a float: digits, at most two decimals, positive,
// at most 2^53-1 fen. "1e3", "19.999", "-1", "01.5" and "" are refused.
func ParseYuan(s string) (int64, bool) {
	whole, frac, dot := strings.Cut(s, ".")
	if whole == "" || len(whole) > 1 && whole[0] == '0' || dot && (len(frac) == 0 || len(frac) > 2) {
		return 0, false
	}
	var n int64
	for _, c := range whole + frac {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
		if n > maxSafeInteger {
			return 0, false
		}
	}
	for range 2 - len(frac) {
		n *= 10
	}
	if n <= 0 || n > maxSafeInteger {
		return 0, false
	}
	return n, true
}

var (
	alipaySuccess = []byte("success")
	alipayFailure = []byte("failure")
)

// Render answers "success" for a SUCCESS verdict and "failure" (with the
// verdict's status) for everything else: Alipay reads only the body.
func (a *Alipay) Render(dst []byte, v *Verdict) ([]byte, string) {
	if v.Success {
		return append(dst, alipaySuccess...), "text/plain; charset=utf-8"
	}
	return append(dst, alipayFailure...), "text/plain; charset=utf-8"
}
