// Package channel holds the payment channels' adapters. Each one verifies a
// callback's authenticity, maps the channel's own format onto the business
// fields (txn id, event, order, amount, currency), computes the idempotency
// key and the digest, and renders answers in the channel's own format. The
// adapters only verify: the signers that build callbacks as the channels do
// live in channeltest. They know nothing of HTTP statuses, metrics or the
// request flow: a refusal is a Reject of a kind, which the edge answers.
package channel

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"
)

// HeaderReader reads request headers. *fasthttp.RequestHeader satisfies it;
// the returned bytes are valid only while the request is being handled.
type HeaderReader interface {
	// Peek returns the first value of the header (nil when absent).
	Peek(name string) []byte
	// PeekAll returns every value of the header, so that an adapter can
	// refuse a repeated security header instead of silently taking the
	// first one.
	PeekAll(name string) [][]byte
}

// single returns the header's value when it appears exactly once; a
// repeated header is ambiguous (which one was signed?) and refused.
func single(h HeaderReader, name string) ([]byte, bool) {
	all := h.PeekAll(name)
	switch len(all) {
	case 0:
		return nil, true
	case 1:
		return all[0], true
	}
	return nil, false
}

// Request is the transport-neutral view of one callback. Every byte slice
// it holds (and that HeaderReader returns) is request-scoped: valid only
// until the handler returns.
type Request struct {
	// Channel is the {channel} path segment.
	Channel []byte
	// ContentType is the Content-Type header.
	ContentType []byte
	// Body is the raw body as received.
	Body []byte
	// Header reads the other headers.
	Header HeaderReader
}

// Delivery is what a channel adapter extracts from a Request: the business
// fields, the idempotency key and the digest. Adapters fill it in place; the
// flow resets it between requests. Field slices may alias the request body
// or the Delivery's own scratch, so they are request-scoped.
type Delivery struct {
	// TxnID is the channel's transaction id: the trade the event names
	// (for a refund, the trade being refunded).
	TxnID    []byte
	OrderNo  []byte
	Event    []byte // the event name, e.g. PAY_SUCCESS
	Amount   int64  // the order's total, minor units
	Currency []byte
	// RefundID names the refund (refund events; empty for a refund
	// without one, which is a full refund of the trade). RefundAmount is
	// this refund's amount, or, when Cumulative, the trade's refunded
	// total so far (Alipay's refund_fee); for a refund without RefundID it
	// is Amount.
	RefundID     []byte
	RefundAmount int64
	Cumulative   bool
	// ReviewBody, when set, is what a review row keeps instead of the raw
	// body: for channels that encrypt the body, the decrypted content, so
	// that an operator can read it (and re-drive it).
	ReviewBody []byte
	// Key is "{channel}:{txn id}:{event}" ("{channel}:{refund id}:{event}"
	// for a refund that has a RefundID) and Digest the lower-case hex
	// SHA-256 of the business fields; Finish computes both.
	Key    []byte
	Digest [64]byte
	// Sum is the raw digest (the cache's form).
	Sum [sha256.Size]byte

	scratch  []byte   // adapters' decode space (escaped JSON strings, decrypted resources)
	keys     [][]byte // top-level JSON keys seen, to refuse repeats
	digestIn []byte   // the digest's preimage
	macs     [maxSecrets][sha256.Size]byte
}

// maxSecrets is how many secrets a channel may hold at once (rotation).
const maxSecrets = 8

// Reset empties d for reuse, keeping its buffers.
func (d *Delivery) Reset() {
	d.TxnID, d.OrderNo, d.Event, d.Currency, d.Amount = nil, nil, nil, nil, 0
	d.RefundID, d.RefundAmount, d.Cumulative, d.ReviewBody = nil, 0, false, nil
	d.Key, d.scratch, d.keys, d.digestIn = d.Key[:0], d.scratch[:0], d.keys[:0], d.digestIn[:0]
}

// keep copies s into d's scratch and returns the copy (request-scoped, like
// every Delivery field).
func (d *Delivery) keep(s string) []byte {
	start := len(d.scratch)
	d.scratch = append(d.scratch, s...)
	return d.scratch[start:len(d.scratch):len(d.scratch)]
}

// Finish computes the key and the digest from the business fields, for
// channel name ch:
//
//	biz_key = "{channel}:{channel_txn_id}:{event_type}"
//	          "{channel}:{refund_id}:{event_type}" for a refund with a refund id
//	digest  = hex(sha256(txn "\n" event "\n" order_no "\n" amount "\n" currency
//	                     [ "\n" refund_id "\n" refund_amount ]))
//
// The refund part is there only when the refund has a refund id, so a full
// refund without one keys and digests as it always did. Every build
// computes the same digest, so a rolling deploy never turns a retry into a
// conflict.
func (d *Delivery) Finish(ch string) {
	name := d.TxnID
	if len(d.RefundID) > 0 {
		name = d.RefundID
	}
	d.Key = append(d.Key[:0], ch...)
	d.Key = append(d.Key, ':')
	d.Key = append(d.Key, name...)
	d.Key = append(d.Key, ':')
	d.Key = append(d.Key, d.Event...)
	in := append(d.digestIn[:0], d.TxnID...)
	in = append(in, '\n')
	in = append(in, d.Event...)
	in = append(in, '\n')
	in = append(in, d.OrderNo...)
	in = append(in, '\n')
	in = strconv.AppendInt(in, d.Amount, 10)
	in = append(in, '\n')
	in = append(in, d.Currency...)
	if len(d.RefundID) > 0 {
		in = append(in, '\n')
		in = append(in, d.RefundID...)
		in = append(in, '\n')
		in = strconv.AppendInt(in, d.RefundAmount, 10)
	}
	d.digestIn = in
	d.Sum = sha256.Sum256(in)
	hex.Encode(d.Digest[:], d.Sum[:])
}

// IsRefund reports whether the event is a refund's (REFUND_SUCCESS or
// REFUND_FAILED): only those carry a refund id and amount.
func IsRefund(event []byte) bool {
	return string(event) == string(eventRefundSuccess) || string(event) == string(eventRefundFailed)
}

// RejectKind is why an adapter refused a request. The edge maps each kind
// to its answer; adapters know nothing of HTTP statuses or metrics.
type RejectKind uint8

// The kinds of refusal.
const (
	// BadRequest: the body or a header breaks the field rules (400).
	BadRequest RejectKind = iota
	// BadSignature: missing or wrong signature, stale timestamp, or a
	// resource that does not decrypt (401).
	BadSignature
	// MerchantMismatch: authentic, but for another merchant or app id
	// (422, and a review row).
	MerchantMismatch
)

// String names the kind.
func (k RejectKind) String() string {
	switch k {
	case BadSignature:
		return "bad signature"
	case MerchantMismatch:
		return "merchant mismatch"
	}
	return "bad request"
}

// Reject is an adapter's refusal of a request: a 4xx answer that stores
// nothing (or, for a merchant mismatch, a review row).
type Reject struct {
	Kind    RejectKind
	Message string
}

func (r *Reject) Error() string { return r.Kind.String() + ": " + r.Message }

// badRequest returns the 400 rejection for a malformed field.
func badRequest(format string, args ...any) *Reject {
	return &Reject{Kind: BadRequest, Message: fmt.Sprintf(format, args...)}
}

// unauthorized returns the 401 rejection.
func unauthorized(msg string) *Reject {
	return &Reject{Kind: BadSignature, Message: msg}
}

// Channel is one configured payment channel: its adapter. Implementations
// are one file each (<kind>.go); the flow does not change when one is
// added.
type Channel interface {
	// Name is the channel's name as in the path and biz_key.
	Name() string
	// Parse authenticates req and fills d, then calls d.Finish. It returns
	// a *Reject for a request to refuse (401, 400, 422 merchant mismatch).
	// It must not keep req or d's slices after it returns.
	Parse(req *Request, d *Delivery) *Reject
	// Redrive fills d from a body stored in a review row, as Parse would
	// from the request that brought it, without authenticating it again:
	// it was authenticated when it arrived, and signatures expire.
	Redrive(body []byte, d *Delivery) *Reject
	// Render appends the channel's acknowledgement of v to dst and returns
	// it with the content type. It must be deterministic: replays of a
	// stored result render byte for byte the first answer.
	Render(dst []byte, v *Verdict) (body []byte, contentType string)
}

// WebhookTolerance is how far webhook-timestamp may be from now.
const WebhookTolerance = 5 * time.Minute

// parseUnixSeconds parses 1 to 12 decimal digits (no allocation, unlike
// strconv on a converted string).
func parseUnixSeconds(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 12 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// ValidChannelName reports whether s is [a-z0-9_]{1,32}.
func ValidChannelName[T ~string | ~[]byte](s T) bool {
	if len(s) == 0 || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// isMedia reports whether the Content-Type value ct names media type want
// (case-insensitive, parameters such as charset allowed).
func isMedia(ct, want []byte) bool {
	if i := bytes.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return bytes.EqualFold(bytes.TrimSpace(ct), want)
}

// The events a channel delivers: every adapter maps its notifications onto
// these names, and the generic channel takes exactly these as event_type.
// durable decides them; edge's tests keep this list and durable's equal.
const (
	PaySuccess    = "PAY_SUCCESS"
	PayClosed     = "PAY_CLOSED"
	RefundSuccess = "REFUND_SUCCESS"
	RefundFailed  = "REFUND_FAILED"
	TradeClosed   = "TRADE_CLOSED"
)

// Events lists the event names a channel delivers.
var Events = []string{PaySuccess, PayClosed, RefundSuccess, RefundFailed, TradeClosed}

var (
	newline            = []byte("\n")
	eventPaySuccess    = []byte(PaySuccess)
	eventRefundSuccess = []byte(RefundSuccess)
	eventRefundFailed  = []byte(RefundFailed)
	eventTradeClosed   = []byte(TradeClosed)
)

// channelEvent reports whether b names an event a channel may send.
func channelEvent(b []byte) bool {
	switch string(b) { // no allocation: the compiler compares in place
	case PaySuccess, PayClosed, RefundSuccess, RefundFailed, TradeClosed:
		return true
	}
	return false
}

// printable renders a field name for a message (field names are the
// sender's bytes: keep them short and harmless).
func printable(b []byte) string {
	if len(b) > 40 || !printableASCII(b, 40) {
		return "a field"
	}
	return string(b)
}

func printableASCII(b []byte, maxLen int) bool {
	if len(b) == 0 || len(b) > maxLen {
		return false
	}
	for _, c := range b {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

func isCurrency(b []byte) bool {
	return len(b) == 3 && isUpper(b[0]) && isUpper(b[1]) && isUpper(b[2])
}

func isUpper(c byte) bool { return 'A' <= c && c <= 'Z' }

// Verdict is one answer before a channel renders it.
type Verdict struct {
	// HTTP is the status code.
	HTTP int
	// Success is true for a SUCCESS answer (code "SUCCESS"), false for FAIL.
	Success bool
	// Outcome is the body's outcome ("" to omit it): applied, skipped,
	// premature, conflict, amount_mismatch, merchant_mismatch, unknown_order.
	Outcome string
	// Status is the order's state ("" to omit it).
	Status string
	// Message says why, for a FAIL ("" to omit it).
	Message string
}

// Code returns "SUCCESS" or "FAIL".
func (v *Verdict) Code() string {
	if v.Success {
		return "SUCCESS"
	}
	return "FAIL"
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// AppendVerdictJSON appends {"code":..,"outcome":..,"status":..,"message":..},
// keys in that order, empty ones omitted: the generic channel's answer.
func AppendVerdictJSON(dst []byte, v *Verdict) []byte {
	dst = append(dst, `{"code":`...)
	dst = appendJSONString(dst, v.Code())
	if v.Outcome != "" {
		dst = append(dst, `,"outcome":`...)
		dst = appendJSONString(dst, v.Outcome)
	}
	if v.Status != "" {
		dst = append(dst, `,"status":`...)
		dst = appendJSONString(dst, v.Status)
	}
	if v.Message != "" {
		dst = append(dst, `,"message":`...)
		dst = appendJSONString(dst, v.Message)
	}
	return append(dst, '}')
}
