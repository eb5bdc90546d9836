package querytest

import (
	"cmp"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/notifyedge/notifyedge/edge/channel/channeltest"
)

// WeChatFakeConfig configures a WeChatFake.
type WeChatFakeConfig struct {
	// MchID is the merchant the fake serves: the Authorization header's
	// mchid and the mchid query parameter must name it.
	MchID string
	// MerchantKey and MerchantSerial are the merchant's public key and
	// its certificate's serial: every request must be signed with the
	// private key (serial_no = MerchantSerial).
	MerchantKey    *rsa.PublicKey
	MerchantSerial string
	// Platform signs the answers (Wechatpay-* headers).
	Platform *channeltest.WeChatPaySigner
	// AppID is the trades' appid unless a Trade names one (default
	// "wx-fake-app").
	AppID string
	// TLS serves https with a self-signed certificate.
	TLS bool
}

// WeChatFake serves WeChat Pay's order query by out_trade_no on loopback
// (GET /v3/pay/transactions/out-trade-no/{out_trade_no}?mchid=...), and
// its trade bill (GET /v3/bill/tradebill, then the file's download). It
// checks each request's WECHATPAY2-SHA256-RSA2048 signature as WeChat Pay
// does (401 SIGN_ERROR otherwise), and signs its answers with the platform
// key as WeChat Pay does, the 404 ORDER_NOT_EXIST included. Safe for
// concurrent use.
type WeChatFake struct {
	fake
	cfg WeChatFakeConfig

	smu      sync.Mutex
	platform *channeltest.WeChatPaySigner
}

// NewWeChatFake starts a fake on a free loopback port; Close stops it.
func NewWeChatFake(cfg WeChatFakeConfig) *WeChatFake {
	if cfg.AppID == "" {
		cfg.AppID = "wx-fake-app"
	}
	f := &WeChatFake{cfg: cfg, platform: cfg.Platform}
	f.start(http.HandlerFunc(f.serve), cfg.TLS)
	return f
}

// SetPlatform signs the answers from now on with s (a platform key
// rotation).
func (f *WeChatFake) SetPlatform(s *channeltest.WeChatPaySigner) {
	f.smu.Lock()
	defer f.smu.Unlock()
	f.platform = s
}

// QueryPath is the path prefix of the query by out_trade_no.
const QueryPath = "/v3/pay/transactions/out-trade-no/"

func (f *WeChatFake) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == TradeBillPath || r.URL.Path == BillFilePath {
		f.serveBill(w, r)
		return
	}
	orderNo, ok := strings.CutPrefix(r.URL.Path, QueryPath)
	if !ok || r.Method != http.MethodGet || orderNo == "" || strings.Contains(orderNo, "/") {
		f.answer(w, http.StatusNotFound, map[string]string{"code": "NOT_FOUND", "message": "no such API"}, false)
		return
	}
	mchid, reason := f.authenticate(r)
	if reason != "" {
		f.answer(w, http.StatusUnauthorized, map[string]string{"code": "SIGN_ERROR", "message": reason}, false)
		return
	}
	if q := r.URL.Query()["mchid"]; len(q) != 1 || q[0] != mchid {
		f.answer(w, http.StatusBadRequest, map[string]string{"code": "PARAM_ERROR", "message": "mchid does not match the signing merchant"}, true)
		return
	}
	t, ok := f.trade(orderNo)
	if !ok {
		f.answer(w, http.StatusNotFound, map[string]string{"code": "ORDER_NOT_EXIST", "message": "订单不存在"}, true)
		return
	}
	f.answer(w, http.StatusOK, f.transaction(orderNo, t), true)
}

// authenticate checks the Authorization header as WeChat Pay does: scheme
// WECHATPAY2-SHA256-RSA2048, the merchant's mchid and serial_no, a
// timestamp within 5 minutes, and a signature by the merchant key over
// "{method}\n{request URI as sent}\n{timestamp}\n{nonce_str}\n{body}\n". It
// returns the mchid, or why the request is refused.
func (f *WeChatFake) authenticate(r *http.Request) (mchid, reason string) {
	const scheme = "WECHATPAY2-SHA256-RSA2048 "
	h := r.Header.Values("Authorization")
	if len(h) != 1 || !strings.HasPrefix(h[0], scheme) {
		return "", "missing or malformed Authorization"
	}
	params := map[string]string{}
	for _, part := range strings.Split(h[0][len(scheme):], ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
			return "", "malformed Authorization parameter"
		}
		if _, dup := params[k]; dup {
			return "", "repeated Authorization parameter"
		}
		params[k] = v[1 : len(v)-1]
	}
	if params["mchid"] != f.cfg.MchID {
		return "", "mchid is not a merchant of this fake"
	}
	if params["serial_no"] != f.cfg.MerchantSerial {
		return "", "serial_no is not the merchant certificate's"
	}
	ts, err := strconv.ParseInt(params["timestamp"], 10, 64)
	if err != nil || time.Since(time.Unix(ts, 0)).Abs() > 5*time.Minute {
		return "", "timestamp missing or more than 5 minutes from now"
	}
	if params["nonce_str"] == "" {
		return "", "nonce_str missing"
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return "", "the body does not read"
	}
	msg := r.Method + "\n" + r.RequestURI + "\n" + params["timestamp"] + "\n" + params["nonce_str"] + "\n" + string(body) + "\n"
	sig, err := base64.StdEncoding.DecodeString(params["signature"])
	sum := sha256.Sum256([]byte(msg))
	if err != nil || rsa.VerifyPKCS1v15(f.cfg.MerchantKey, crypto.SHA256, sum[:], sig) != nil {
		return "", "signature does not verify with the merchant key"
	}
	return params["mchid"], ""
}

// transaction renders t as WeChat Pay's query answer does: an unpaid trade
// has no transaction_id, payer or success_time.
func (f *WeChatFake) transaction(orderNo string, t Trade) map[string]any {
	out := map[string]any{
		"mchid": cmp.Or(t.MchID, f.cfg.MchID), "appid": cmp.Or(t.AppID, f.cfg.AppID),
		"out_trade_no": cmp.Or(t.OutTradeNo, orderNo), "trade_type": "JSAPI",
		"trade_state": t.State, "trade_state_desc": wechatStateDesc[t.State],
		"amount": map[string]any{"total": t.Amount, "currency": cmp.Or(t.Currency, "CNY"), "payer_currency": cmp.Or(t.Currency, "CNY")},
	}
	switch t.State {
	case "SUCCESS", "REFUND", "PAYERROR":
		if t.TxnID != "" {
			out["transaction_id"] = t.TxnID
		}
		out["bank_type"] = "OTHERS"
		out["payer"] = map[string]string{"openid": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"}
		out["amount"].(map[string]any)["payer_total"] = t.Amount
		if t.State != "PAYERROR" {
			out["success_time"] = t.PaidAt.In(beijing).Format(time.RFC3339)
		}
	}
	return out
}

var wechatStateDesc = map[string]string{
	"SUCCESS": "支付成功", "REFUND": "转入退款", "NOTPAY": "未支付", "CLOSED": "已关闭",
	"REVOKED": "已撤销", "USERPAYING": "用户支付中", "PAYERROR": "支付失败",
}

// beijing is the zone WeChat Pay and Alipay write their times in.
var beijing = time.FixedZone("CST", 8*3600)

// answer writes v as JSON with status, signed with the platform key when
// signed (WeChat Pay signs the answers to authenticated requests).
func (f *WeChatFake) answer(w http.ResponseWriter, status int, v any, signed bool) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "08F0"+strconv.FormatInt(time.Now().UnixNano(), 16))
	if signed {
		f.smu.Lock()
		p := f.platform
		f.smu.Unlock()
		h, err := p.Sign(body, time.Now())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if f.badSignature() {
			h["Wechatpay-Signature"] = flip(h["Wechatpay-Signature"])
		}
		for k, v := range h {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(status)
	w.Write(body)
}
