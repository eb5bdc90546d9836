package query

import (
	"context"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/wechatpay-apiv3/wechatpay-go/core"
	"github.com/wechatpay-apiv3/wechatpay-go/core/auth/validators"
	"github.com/wechatpay-apiv3/wechatpay-go/core/auth/verifiers"
	"github.com/wechatpay-apiv3/wechatpay-go/core/option"
	"github.com/wechatpay-apiv3/wechatpay-go/services/payments/jsapi"

	"github.com/notifyedge/notifyedge/edge/channel"
)

// WeChatConfig configures the WeChat Pay querier.
type WeChatConfig struct {
	// MchID is the merchant id; an answer for another merchant is an
	// error.
	MchID string
	// MerchantKey is the merchant's API private key (apiclient_key.pem;
	// ParsePrivateKey reads it) and MerchantSerial its certificate's
	// serial: the SDK signs every request with them.
	MerchantKey    *rsa.PrivateKey
	MerchantSerial string
	// PlatformKeys are WeChat Pay's public keys by Wechatpay-Serial, as the
	// callback adapter holds them: certificate serials or PUB_KEY_ID_...
	// public-key ids, several during a rotation.
	PlatformKeys map[string]*rsa.PublicKey
	// NotAfter is the optional expiry by serial: a key past it verifies
	// nothing.
	NotAfter map[string]time.Time
	// BaseURL is scheme and host of the API (default
	// "https://api.mch.weixin.qq.com").
	BaseURL string
	// Timeout bounds one query (default DefaultTimeout); BillTimeout
	// fetching and reading one statement (default DefaultBillTimeout).
	Timeout, BillTimeout time.Duration
	// Now is the clock for key expiry (default time.Now). The SDK checks
	// the answer's timestamp against the system clock.
	Now func() time.Time
	// Transport carries the requests (default a clone of
	// http.DefaultTransport, which verifies TLS).
	Transport http.RoundTripper
}

// DefaultWeChatBaseURL is WeChat Pay's API.
const DefaultWeChatBaseURL = "https://api.mch.weixin.qq.com"

// WeChat asks WeChat Pay about orders with wechatpay-go: the SDK signs each
// request (WECHATPAY2-SHA256-RSA2048) and verifies each answer against the
// platform keys configured here; it never downloads certificates.
type WeChat struct {
	cfg       WeChatConfig
	svc       jsapi.JsapiApiService
	validator *validators.WechatPayResponseValidator
	// download fetches a statement's file: the request signed, the
	// answer not (WeChat Pay does not sign files; their SHA-1 is checked).
	download *core.Client
}

var _ Querier = (*WeChat)(nil)

// NewWeChat returns the WeChat Pay querier for cfg.
func NewWeChat(cfg WeChatConfig) (*WeChat, error) {
	switch {
	case cfg.MchID == "":
		return nil, errors.New("wechat pay query: no merchant id")
	case cfg.MerchantKey == nil || cfg.MerchantSerial == "":
		return nil, errors.New("wechat pay query: no merchant key or merchant certificate serial")
	case len(cfg.PlatformKeys) == 0:
		return nil, errors.New("wechat pay query: no platform public key")
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultWeChatBaseURL
	}
	to, err := parseBase(cfg.BaseURL, false)
	if err != nil {
		return nil, fmt.Errorf("wechat pay query: %w", err)
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
	v, err := newPlatformVerifier(cfg.PlatformKeys, cfg.NotAfter, cfg.Now)
	if err != nil {
		return nil, fmt.Errorf("wechat pay query: %w", err)
	}
	client, err := core.NewClient(context.Background(),
		option.WithMerchantCredential(cfg.MchID, cfg.MerchantSerial, cfg.MerchantKey),
		option.WithVerifier(v),
		option.WithHTTPClient(newHTTPClient(to, cfg.Transport, cfg.Timeout)),
	)
	if err != nil {
		return nil, fmt.Errorf("wechat pay query: %w", err)
	}
	download, err := core.NewClient(context.Background(),
		option.WithMerchantCredential(cfg.MchID, cfg.MerchantSerial, cfg.MerchantKey),
		option.WithoutValidator(),
		option.WithHTTPClient(newStreamClient(to, cfg.Transport)),
	)
	if err != nil {
		return nil, fmt.Errorf("wechat pay query: %w", err)
	}
	return &WeChat{
		cfg:       cfg,
		svc:       jsapi.JsapiApiService{Client: client},
		validator: validators.NewWechatPayResponseValidator(v),
		download:  download,
	}, nil
}

// Query asks WeChat Pay about orderNo (GET
// /v3/pay/transactions/out-trade-no/{out_trade_no}?mchid=...).
func (w *WeChat) Query(ctx context.Context, orderNo string) (Answer, error) {
	if err := validOrderNo(orderNo); err != nil {
		return Answer{}, fmt.Errorf("wechat pay query: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	// The SDK reports a refused answer as a plain error; the verifier
	// notes in the context whether a signature verified, which tells a
	// refused answer from one that verified and then did not decode.
	note := &verifyNote{}
	ctx = context.WithValue(ctx, verifyNoteKey{}, note)
	txn, result, err := w.svc.QueryOrderByOutTradeNo(ctx, jsapi.QueryOrderByOutTradeNoRequest{
		OutTradeNo: core.String(orderNo),
		Mchid:      core.String(w.cfg.MchID),
	})
	if err != nil {
		var apiErr *core.APIError
		switch {
		case errors.As(err, &apiErr):
			return w.refused(ctx, orderNo, apiErr, result)
		case result == nil || result.Response == nil:
			return Answer{}, fmt.Errorf("wechat pay query %s: %w", orderNo, err)
		case !note.verified:
			return Answer{}, unverified("wechat pay query "+orderNo, err)
		default:
			return Answer{}, fmt.Errorf("wechat pay query %s: the answer is not a transaction: %w", orderNo, err)
		}
	}
	// The SDK leaves the verified body readable after decoding it: the
	// stored delivery carries the transaction exactly as it came.
	raw, err := io.ReadAll(result.Response.Body)
	if err != nil {
		return Answer{}, fmt.Errorf("wechat pay query %s: reading the answer: %w", orderNo, err)
	}
	state := deref(txn.TradeState)
	switch {
	case deref(txn.OutTradeNo) != orderNo:
		return Answer{}, fmt.Errorf("wechat pay query %s: the answer is about another order", orderNo)
	case deref(txn.Mchid) != w.cfg.MchID:
		return Answer{}, fmt.Errorf("wechat pay query %s: the answer is for another merchant", orderNo)
	}
	switch state {
	case "SUCCESS", "REFUND":
		// A refunded trade is keyed as its payment would be, for the
		// review it opens.
		if deref(txn.TransactionId) == "" || txn.Amount == nil || txn.Amount.Total == nil {
			return Answer{}, fmt.Errorf("wechat pay query %s: a paid answer without transaction_id or amount.total", orderNo)
		}
		body, err := json.Marshal(wechatQueried{
			ID:           "query-" + deref(txn.TransactionId),
			EventType:    channel.WeChatQueriedEvent,
			ResourceType: "order-query",
			Summary:      "the order query's answer",
			Resource:     raw,
		})
		if err != nil {
			return Answer{}, fmt.Errorf("wechat pay query %s: the stored delivery: %w", orderNo, err)
		}
		if state == "REFUND" {
			return Answer{State: Refunded, ChannelState: state, Body: body}, nil
		}
		return Answer{State: Paid, ChannelState: state, Body: body}, nil
	case "NOTPAY", "USERPAYING", "PAYERROR":
		return Answer{State: Pending, ChannelState: state}, nil
	case "CLOSED", "REVOKED":
		return Answer{State: Closed, ChannelState: state}, nil
	}
	return Answer{}, fmt.Errorf("wechat pay query %s: unexpected trade_state %q", orderNo, printable(state))
}

// refused handles a non-2xx answer. The SDK verifies only 2xx answers, so
// the 404 that says the order does not exist is verified here, with the
// SDK's own response validator, before it counts: an unsigned "no such
// order" must not close anything.
func (w *WeChat) refused(ctx context.Context, orderNo string, apiErr *core.APIError, result *core.APIResult) (Answer, error) {
	if apiErr.StatusCode == http.StatusNotFound && apiErr.Code == "ORDER_NOT_EXIST" {
		if result == nil || result.Response == nil {
			return Answer{}, fmt.Errorf("wechat pay query %s: a 404 without its response", orderNo)
		}
		if err := w.validator.Validate(ctx, result.Response); err != nil {
			return Answer{}, unverified("wechat pay query "+orderNo+": ORDER_NOT_EXIST", err)
		}
		return Answer{State: NotFound, ChannelState: apiErr.Code}, nil
	}
	// The SDK's own message lists every response header: say only what
	// the channel answered.
	return Answer{}, fmt.Errorf("wechat pay query %s: HTTP %d %s: %s", orderNo, apiErr.StatusCode,
		printable(apiErr.Code), clip(apiErr.Message))
}

// wechatQueried is the stored delivery of a paid answer: the envelope of a
// notification whose resource is the transaction in clear, the form
// channel.WeChatPay.Redrive maps.
type wechatQueried struct {
	ID           string          `json:"id"`
	EventType    string          `json:"event_type"`
	ResourceType string          `json:"resource_type"`
	Summary      string          `json:"summary"`
	Resource     json.RawMessage `json:"resource"`
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// unverified wraps err as ErrUnverified (once), with the reason in a few
// words: the SDK's own text (header dumps, request ids) stays out of what
// an operator reads.
func unverified(what string, err error) error {
	return fmt.Errorf("%s: %w (%s)", what, ErrUnverified, verifyReason(err))
}

// verifyReason names why an answer failed verification.
func verifyReason(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "unknown Wechatpay-Serial"):
		return "signed with a platform key this channel does not hold: add it to the platform keys"
	case strings.Contains(msg, "expired at"):
		return "signed with a platform key past its expiry: add its successor"
	case strings.Contains(msg, "is empty in header") || strings.Contains(msg, "not found in header"):
		return "not signed: a Wechatpay-* header is missing, so the answer did not come from WeChat Pay"
	case strings.Contains(msg, "timestamp"):
		return "its timestamp is too far from now: check this host's clock"
	}
	return "the signature does not verify with the platform keys"
}

// verifyNoteKey is the context key of a query's verifyNote.
type verifyNoteKey struct{}

// verifyNote records that a signature of the query's answer verified.
type verifyNote struct{ verified bool }

// platformVerifier is the auth.Verifier the SDK's response validator
// calls: it picks the platform key by the answer's Wechatpay-Serial and
// hands the check to the SDK's verifier for that one key (the SDK's
// public-key verifier holds one key; its certificate verifier wants
// certificates, while the keys come here as public keys, certificate
// serials and PUB_KEY_ID_ ids alike).
type platformVerifier struct {
	bySerial map[string]*verifiers.SHA256WithRSAPubkeyVerifier
	notAfter map[string]time.Time
	now      func() time.Time
	accept   string
}

func newPlatformVerifier(keys map[string]*rsa.PublicKey, notAfter map[string]time.Time, now func() time.Time) (*platformVerifier, error) {
	v := &platformVerifier{bySerial: make(map[string]*verifiers.SHA256WithRSAPubkeyVerifier, len(keys)),
		notAfter: make(map[string]time.Time, len(notAfter)), now: now}
	serials := make([]string, 0, len(keys))
	for serial, k := range keys {
		if serial == "" || k == nil {
			return nil, errors.New("a platform key without a serial, or a serial without a key")
		}
		v.bySerial[serial] = verifiers.NewSHA256WithRSAPubkeyVerifier(serial, *k)
		serials = append(serials, serial)
	}
	for serial, t := range notAfter {
		v.notAfter[serial] = t
	}
	v.accept = acceptSerial(serials, v.notAfter)
	return v, nil
}

// acceptSerial is the serial sent as the request's Wechatpay-Serial (the
// key the answer may be signed with): a public-key id when there is one
// (WeChat's current scheme), else the certificate that lasts longest.
func acceptSerial(serials []string, notAfter map[string]time.Time) string {
	sort.Strings(serials)
	best := ""
	for _, s := range serials {
		switch {
		case best == "":
			best = s
		case strings.HasPrefix(s, "PUB_KEY_ID_") != strings.HasPrefix(best, "PUB_KEY_ID_"):
			if strings.HasPrefix(s, "PUB_KEY_ID_") {
				best = s
			}
		case laterThan(notAfter, s, best):
			best = s
		}
	}
	return best
}

// laterThan reports whether a expires after b (no expiry is latest).
func laterThan(notAfter map[string]time.Time, a, b string) bool {
	ta, oka := notAfter[a]
	tb, okb := notAfter[b]
	switch {
	case !oka:
		return okb
	case !okb:
		return false
	}
	return ta.After(tb)
}

// Verify checks signature over message with the platform key named serial.
func (v *platformVerifier) Verify(ctx context.Context, serial, message, signature string) error {
	k, ok := v.bySerial[serial]
	if !ok {
		return fmt.Errorf("%w: unknown Wechatpay-Serial %q", ErrUnverified, printable(serial))
	}
	if na, ok := v.notAfter[serial]; ok && v.now().After(na) {
		return fmt.Errorf("%w: the platform key %s expired at %s", ErrUnverified, serial, na.Format(time.RFC3339))
	}
	if err := k.Verify(ctx, serial, message, signature); err != nil {
		return fmt.Errorf("%w: %v", ErrUnverified, err)
	}
	if n, ok := ctx.Value(verifyNoteKey{}).(*verifyNote); ok {
		n.verified = true
	}
	return nil
}

// GetSerial returns the serial the request names as the one it can verify.
func (v *platformVerifier) GetSerial(context.Context) (string, error) {
	return v.accept, nil
}
