// Package query asks the payment channels about one order: the cold path of
// reconciliation, for an order still PENDING_PAY whose callbacks may have
// been lost. Every call goes through the channel's maintained SDK, which
// signs the request and verifies the answer (wechatpay-go for WeChat Pay,
// gopay for Alipay); an answer that fails verification applies nothing.
//
// A paid answer carries a stored delivery (Answer.Body) that the channel's
// adapter in package channel maps as it maps the trade's payment callback:
// same key, same digest, same merchant checks. Whichever of the two arrives
// second is then a replay.
//
// Key material never reaches a log or an error message: both SDKs put the
// keys they cannot parse into their errors, so keys are parsed here first
// and the SDKs' construction errors are never passed on.
package query

import (
	"bytes"
	"context"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// State is what a channel says about an order, in the channels' common
// terms.
type State string

// The states a verified answer maps to.
const (
	// Paid: WeChat trade_state SUCCESS; Alipay TRADE_SUCCESS or
	// TRADE_FINISHED.
	Paid State = "paid"
	// Refunded: paid, then refunded at the channel: WeChat REFUND; Alipay
	// TRADE_CLOSED whose answer says when it was paid (send_pay_date).
	// Never applied as a payment.
	Refunded State = "refunded"
	// Pending: not paid yet. WeChat NOTPAY, USERPAYING, PAYERROR; Alipay
	// WAIT_BUYER_PAY.
	Pending State = "pending"
	// Closed: WeChat CLOSED, REVOKED; Alipay TRADE_CLOSED of a trade never
	// paid.
	Closed State = "closed"
	// NotFound: the channel has no such order. WeChat HTTP 404
	// ORDER_NOT_EXIST; Alipay 40004 ACQ.TRADE_NOT_EXIST.
	NotFound State = "not_found"
)

// Answer is a channel's verified answer about one order.
type Answer struct {
	State State
	// ChannelState is the channel's own word: trade_state or
	// trade_status, or the error code for NotFound.
	ChannelState string
	// Body, for Paid and Refunded: a stored delivery that the channel's adapter
	// (channel.Channel.Redrive of package edge/channel) maps exactly as it
	// maps the payment callback of the same trade: same key, same digest,
	// same merchant checks.
	Body []byte
}

// ErrUnverified means the channel answered, but the answer failed
// verification (a wrong or missing signature, an unknown or expired key, a
// stale timestamp): it applies nothing.
var ErrUnverified = errors.New("the answer failed verification")

// Querier asks one channel about one order. An error means the channel
// could not be asked (network, timeout, 5xx, an unexpected answer) or its
// answer failed verification (errors.Is(err, ErrUnverified)).
type Querier interface {
	Query(ctx context.Context, orderNo string) (Answer, error)
}

// DefaultTimeout bounds one query when the configuration sets none.
const DefaultTimeout = 5 * time.Second

// maxAnswer bounds an answer's body: a query's answer is a few kilobytes,
// and both SDKs read whatever comes into memory.
const maxAnswer = 1 << 20

// ParsePrivateKey reads an RSA private key: PKCS#1 or PKCS#8, as PEM or as
// bare base64 DER (the forms apiclient_key.pem and Alipay's key tool hand
// out). Its errors say what is wrong, never what the text holds.
func ParsePrivateKey(s string) (*rsa.PrivateKey, error) {
	s = strings.TrimSpace(s)
	var der []byte
	if strings.HasPrefix(s, "-----BEGIN ") {
		block, rest := pem.Decode([]byte(s))
		if block == nil {
			return nil, errors.New("private key: a PEM block that does not parse")
		}
		if len(bytes.TrimSpace(rest)) != 0 {
			return nil, errors.New("private key: text after the PEM block (want one key)")
		}
		switch block.Type {
		case "RSA PRIVATE KEY", "PRIVATE KEY":
		case "ENCRYPTED PRIVATE KEY":
			return nil, errors.New("private key: encrypted keys are not supported")
		default:
			return nil, fmt.Errorf("private key: PEM block type %q, want PRIVATE KEY or RSA PRIVATE KEY", printable(block.Type))
		}
		if _, encrypted := block.Headers["Proc-Type"]; encrypted {
			return nil, errors.New("private key: encrypted keys are not supported")
		}
		der = block.Bytes
	} else {
		compact := strings.Join(strings.Fields(s), "")
		var err error
		if der, err = base64.StdEncoding.DecodeString(compact); err != nil || len(der) == 0 {
			return nil, errors.New("private key: neither PEM nor base64")
		}
	}
	key, err := parsePrivateDER(der)
	if err != nil {
		return nil, err
	}
	if err := key.Validate(); err != nil {
		return nil, errors.New("private key: the RSA key is inconsistent")
	}
	return key, nil
}

// parsePrivateDER reads PKCS#1, then PKCS#8. The parsers' own errors are
// not passed on: they may quote the bytes they stumbled on.
func parsePrivateDER(der []byte) (*rsa.PrivateKey, error) {
	if k, err := x509.ParsePKCS1PrivateKey(der); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, errors.New("private key: neither a PKCS#1 nor a PKCS#8 private key")
	}
	rk, ok := k.(*rsa.PrivateKey)
	if !ok {
		return nil, errors.New("private key: PKCS#8, but not an RSA key")
	}
	return rk, nil
}

// printable returns s when it is short printable ASCII (safe to quote in a
// message), else a placeholder.
func printable(s string) string {
	if !printableASCII(s, 40) {
		return "(unprintable)"
	}
	return s
}

func printableASCII(s string, maxLen int) bool {
	if len(s) == 0 || len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

// validOrderNo reports whether orderNo can be asked about: the rules the
// channel adapters apply to out_trade_no (1 to 64 printable ASCII
// characters).
func validOrderNo(orderNo string) error {
	if !printableASCII(orderNo, 64) {
		return errors.New("order number: must be 1 to 64 printable ASCII characters")
	}
	return nil
}

// endpoint is where a channel's requests go instead of the SDK's fixed
// host.
type endpoint struct {
	scheme, host string
	// path replaces the request's path when set (Alipay's gateway); empty
	// keeps it (WeChat Pay's API, whose signature covers the path).
	path, rawPath string
	query         string
}

// parseBase reads a configured base URL; withPath says whether it may
// name a path (Alipay's gateway) or must be scheme and host only (WeChat
// Pay, whose request signature covers the path: a prefix would break it).
func parseBase(raw string, withPath bool) (endpoint, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return endpoint{}, fmt.Errorf("base URL: %w", err)
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return endpoint{}, errors.New("base URL: scheme must be https (or http for a local fake)")
	}
	if u.Host == "" || u.User != nil || u.Fragment != "" {
		return endpoint{}, errors.New("base URL: want scheme://host[:port] with no user or fragment")
	}
	e := endpoint{scheme: u.Scheme, host: u.Host}
	if !withPath {
		if (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			return endpoint{}, errors.New("base URL: scheme and host only (the request signature covers the path)")
		}
		return e, nil
	}
	e.path, e.rawPath, e.query = u.Path, u.RawPath, u.RawQuery
	if e.path == "" {
		e.path = "/"
	}
	return e, nil
}

// rewriter sends each request to the configured endpoint: the SDKs have
// fixed base URLs. Only scheme, host (and, for a gateway, path) change; a
// WeChat Pay signature covers method, path and query, not the host, so it
// still verifies.
type rewriter struct {
	to   endpoint
	next http.RoundTripper
	// stream hands the answer's body on as it arrives (a statement's
	// file); otherwise it is read whole, at most maxAnswer bytes.
	stream bool
}

// RoundTrip implements http.RoundTripper on a copy of req (a RoundTripper
// must not change the request it is given).
func (t *rewriter) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.URL.Scheme, r.URL.Host, r.Host = t.to.scheme, t.to.host, t.to.host
	if t.to.path != "" {
		r.URL.Path, r.URL.RawPath = t.to.path, t.to.rawPath
	}
	if t.to.query != "" {
		r.URL.RawQuery = joinQuery(t.to.query, r.URL.RawQuery)
	}
	resp, err := t.next.RoundTrip(r)
	if err != nil || t.stream {
		return resp, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	if len(body) > maxAnswer {
		return nil, fmt.Errorf("the answer is larger than %d bytes", maxAnswer)
	}
	if c, ok := req.Context().Value(captureKey{}).(*capture); ok {
		c.body = body
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	return resp, nil
}

// joinQuery appends the request's query to the base URL's.
func joinQuery(base, req string) string {
	if req == "" {
		return base
	}
	return base + "&" + req
}

// captureKey is the context key under which a query asks the rewriter for
// the raw answer: gopay does not hand out the bytes of an answer it
// refuses as a business error, and those bytes are what Alipay signed.
type captureKey struct{}

// capture receives the raw body of a query's answer.
type capture struct{ body []byte }

// newHTTPClient returns the client both SDKs are given: the rewriter over
// next (default a clone of http.DefaultTransport, which verifies TLS as
// usual), no redirects (an answer comes from the endpoint or is an error),
// and the query's timeout as a backstop to the context's.
func newHTTPClient(to endpoint, next http.RoundTripper, timeout time.Duration) *http.Client {
	return newClient(&rewriter{to: to, next: orDefault(next)}, timeout)
}

// newStreamClient is newHTTPClient for a statement's file: its body is
// streamed, and the caller's context bounds it.
func newStreamClient(to endpoint, next http.RoundTripper) *http.Client {
	return newClient(&rewriter{to: to, next: orDefault(next), stream: true}, 0)
}

func orDefault(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		return http.DefaultTransport.(*http.Transport).Clone()
	}
	return next
}

func newClient(t http.RoundTripper, timeout time.Duration) *http.Client {
	return &http.Client{
		Transport: t,
		Timeout:   timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// clip shortens a channel-supplied text for an error message.
func clip(s string) string {
	const n = 120
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
