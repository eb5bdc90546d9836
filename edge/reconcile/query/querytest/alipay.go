package querytest

import (
	"cmp"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/notifyedge/notifyedge/edge/channel/channeltest"
)

// AlipayFakeConfig configures an AlipayFake.
type AlipayFakeConfig struct {
	// AppID is the app the fake serves: a request for another is refused
	// (40002 isv.invalid-app-id).
	AppID string
	// AppKey is the app's public key: every request's sign must verify
	// with it (40002 isv.invalid-signature otherwise).
	AppKey *rsa.PublicKey
	// Alipay signs the answers with its key (RSA2).
	Alipay *channeltest.AlipaySigner
	// TLS serves https with a self-signed certificate.
	TLS bool
	// AppCertSN and RootCertSN, when set, put the fake in public-key
	// certificate mode: every request must carry them as app_cert_sn and
	// alipay_root_cert_sn (40002 isv.invalid-app-cert-sn otherwise), and
	// every answer carries AlipayCertSN as alipay_cert_sn, between the
	// response and the sign, as Alipay writes it.
	AppCertSN, RootCertSN, AlipayCertSN string
}

// AlipayFake serves Alipay's gateway for alipay.trade.query and
// alipay.data.dataservice.bill.downloadurl.query (with the bill files at
// the URLs it hands out) on loopback, as
// gopay calls it: a POST of the signed request form (sorted k=v of the
// non-empty parameters but sign, SHA256withRSA with the app key). It
// answers as Alipay does: {"alipay_trade_query_response":{...},"sign":...},
// the sign over the exact text of the response object, an unknown trade
// being code 40004 sub_code ACQ.TRADE_NOT_EXIST (signed too). Safe for
// concurrent use.
type AlipayFake struct {
	fake
	cfg AlipayFakeConfig

	smu    sync.Mutex
	signer *channeltest.AlipaySigner
}

// NewAlipayFake starts a fake on a free loopback port; Close stops it.
func NewAlipayFake(cfg AlipayFakeConfig) *AlipayFake {
	f := &AlipayFake{cfg: cfg, signer: cfg.Alipay}
	f.start(http.HandlerFunc(f.serve), cfg.TLS)
	return f
}

// SetSigner signs the answers from now on with s (an Alipay key rotation).
func (f *AlipayFake) SetSigner(s *channeltest.AlipaySigner) {
	f.smu.Lock()
	defer f.smu.Unlock()
	f.signer = s
}

// GatewayPath is the path the fake serves; URL()+GatewayPath is the
// gateway URL to configure.
const GatewayPath = "/gateway.do"

// GatewayURL returns the full gateway URL of the fake.
func (f *AlipayFake) GatewayURL() string { return f.URL() + GatewayPath }

// alipayAnswer is a response object, its members in Alipay's order (code
// and msg first).
type alipayAnswer struct {
	Code           string `json:"code"`
	Msg            string `json:"msg"`
	SubCode        string `json:"sub_code,omitempty"`
	SubMsg         string `json:"sub_msg,omitempty"`
	BuyerLogonID   string `json:"buyer_logon_id,omitempty"`
	BuyerPayAmount string `json:"buyer_pay_amount,omitempty"`
	InvoiceAmount  string `json:"invoice_amount,omitempty"`
	OutTradeNo     string `json:"out_trade_no,omitempty"`
	PointAmount    string `json:"point_amount,omitempty"`
	ReceiptAmount  string `json:"receipt_amount,omitempty"`
	SendPayDate    string `json:"send_pay_date,omitempty"`
	TotalAmount    string `json:"total_amount,omitempty"`
	TradeNo        string `json:"trade_no,omitempty"`
	TradeStatus    string `json:"trade_status,omitempty"`
}

func (f *AlipayFake) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == AlipayBillPath {
		f.serveBillFile(w, r)
		return
	}
	if r.URL.Path != GatewayPath {
		http.NotFound(w, r)
		return
	}
	params, ok := requestParams(r)
	if !ok {
		f.answer(w, invalid("isv.invalid-parameter", "参数无效"), false)
		return
	}
	get := func(k string) string { return params.Get(k) }
	switch {
	case get("method") != "alipay.trade.query" && get("method") != BillMethod:
		f.answer(w, invalid("isv.invalid-method", "不存在的方法名"), false)
		return
	case get("app_id") != f.cfg.AppID:
		f.answer(w, invalid("isv.invalid-app-id", "无效的AppID参数"), false)
		return
	case get("sign_type") != "RSA2":
		f.answer(w, invalid("isv.invalid-signature-type", "无效的签名类型"), false)
		return
	case !f.signedByApp(params):
		f.answer(w, invalid("isv.invalid-signature", "验签出错"), false)
		return
	case !recent(get("timestamp")):
		f.answer(w, invalid("isv.invalid-timestamp", "非法的时间戳参数"), false)
		return
	case f.cfg.AppCertSN != "" && (get("app_cert_sn") != f.cfg.AppCertSN || get("alipay_root_cert_sn") != f.cfg.RootCertSN):
		f.answer(w, invalid("isv.invalid-app-cert-sn", "应用公钥证书序列号不匹配"), false)
		return
	}
	if get("method") == BillMethod {
		f.billURL(w, get("biz_content"))
		return
	}
	var biz struct {
		OutTradeNo string `json:"out_trade_no"`
		TradeNo    string `json:"trade_no"`
	}
	if json.Unmarshal([]byte(get("biz_content")), &biz) != nil || biz.OutTradeNo == "" {
		f.answer(w, invalid("isv.missing-parameter", "缺少必选参数 out_trade_no"), true)
		return
	}
	t, ok := f.trade(biz.OutTradeNo)
	if !ok {
		f.answer(w, alipayAnswer{Code: "40004", Msg: "Business Failed", SubCode: "ACQ.TRADE_NOT_EXIST", SubMsg: "交易不存在",
			BuyerPayAmount: "0.00", InvoiceAmount: "0.00", OutTradeNo: biz.OutTradeNo, PointAmount: "0.00", ReceiptAmount: "0.00"}, true)
		return
	}
	a := alipayAnswer{Code: "10000", Msg: "Success", BuyerLogonID: cmp.Or(t.BuyerLogonID, "159****5620"),
		OutTradeNo: cmp.Or(t.OutTradeNo, biz.OutTradeNo), TotalAmount: cmp.Or(t.AmountText, yuan(t.Amount)),
		TradeNo: t.TxnID, TradeStatus: t.State, BuyerPayAmount: "0.00", InvoiceAmount: "0.00", PointAmount: "0.00", ReceiptAmount: "0.00"}
	if t.State == "TRADE_SUCCESS" || t.State == "TRADE_FINISHED" || t.State == "TRADE_CLOSED" && t.WasPaid {
		a.SendPayDate = t.PaidAt.In(beijing).Format("2006-01-02 15:04:05")
		a.BuyerPayAmount, a.InvoiceAmount, a.ReceiptAmount = a.TotalAmount, a.TotalAmount, a.TotalAmount
	}
	f.answer(w, a, true)
}

// requestParams reads the request's parameters as Alipay's gateway does:
// the POSTed form, and the URL's query for what the form lacks (gopay
// posts the form to gateway.do?charset=utf-8); a GET carries them all in
// the query.
func requestParams(r *http.Request) (url.Values, bool) {
	if err := r.ParseForm(); err != nil {
		return nil, false
	}
	params := url.Values{}
	for k, vs := range r.PostForm {
		params[k] = vs
	}
	for k, vs := range r.URL.Query() {
		if _, ok := params[k]; !ok {
			params[k] = vs
		}
	}
	for _, vs := range params {
		if len(vs) != 1 {
			return nil, false
		}
	}
	return params, true
}

// signedByApp checks the request's sign: SHA256withRSA by the app key over
// the parameters but sign, empty ones left out, sorted, "k=v" joined by
// "&" (sign_type is signed in a request, unlike in a notification).
func (f *AlipayFake) signedByApp(params url.Values) bool {
	keys := make([]string, 0, len(params))
	for k := range params {
		if k != "sign" && params.Get(k) != "" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(k + "=" + params.Get(k))
	}
	sig, err := base64.StdEncoding.DecodeString(params.Get("sign"))
	sum := sha256.Sum256([]byte(b.String()))
	return err == nil && rsa.VerifyPKCS1v15(f.cfg.AppKey, crypto.SHA256, sum[:], sig) == nil
}

// recent reports whether the request's timestamp, read as Beijing time, is
// within 15 minutes of now.
func recent(ts string) bool {
	t, err := time.ParseInLocation("2006-01-02 15:04:05", ts, beijing)
	return err == nil && time.Since(t).Abs() <= 15*time.Minute
}

// invalid is the answer to a request the gateway refuses.
func invalid(subCode, subMsg string) alipayAnswer {
	return alipayAnswer{Code: "40002", Msg: "Invalid Arguments", SubCode: subCode, SubMsg: subMsg}
}

// answer writes {"alipay_trade_query_response":a,"sign":...}, the sign
// over the exact text of a; an unsigned answer has no sign.
func (f *AlipayFake) answer(w http.ResponseWriter, a alipayAnswer, signed bool) {
	f.answerAs(w, "alipay_trade_query_response", a, signed)
}

// answerAs writes {name:a,"sign":...} as answer does.
func (f *AlipayFake) answerAs(w http.ResponseWriter, name string, a any, signed bool) {
	obj, err := json.Marshal(a)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var b strings.Builder
	b.WriteString(`{"` + name + `":`)
	b.Write(obj)
	if f.cfg.AlipayCertSN != "" {
		b.WriteString(`,"alipay_cert_sn":"` + f.cfg.AlipayCertSN + `"`)
	}
	if signed {
		f.smu.Lock()
		s := f.signer
		f.smu.Unlock()
		sum := sha256.Sum256(obj)
		raw, err := rsa.SignPKCS1v15(rand.Reader, s.Key, crypto.SHA256, sum[:])
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		sig := base64.StdEncoding.EncodeToString(raw)
		if f.badSignature() {
			sig = flip(sig)
		}
		b.WriteString(`,"sign":"` + sig + `"`)
	}
	b.WriteString("}")
	w.Header().Set("Content-Type", "text/html;charset=utf-8")
	w.Write([]byte(b.String()))
}
