package channel_test

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/channel/channeltest"
)

var testKeys struct {
	once   sync.Once
	wx     *channeltest.WeChatPaySigner
	ali    *channeltest.AlipaySigner
	wxChan *channel.WeChatPay
	aliCh  *channel.Alipay
	now    time.Time
}

func channels(tb testing.TB) (*channeltest.WeChatPaySigner, *channel.WeChatPay, *channeltest.AlipaySigner, *channel.Alipay, time.Time) {
	testKeys.once.Do(func() {
		testKeys.now = time.Unix(1796200000, 0)
		testKeys.wx, _ = channeltest.NewWeChatPaySigner()
		testKeys.ali, _ = channeltest.NewAlipaySigner()
		testKeys.wxChan, _ = channel.NewWeChatPay(channel.WeChatPayConfig{Name: "wx", APIv3Key: testKeys.wx.APIv3Key,
			PlatformKeys: map[string]*rsa.PublicKey{testKeys.wx.Serial: &testKeys.wx.PlatformKey.PublicKey},
			MchID:        "1900000109", Now: func() time.Time { return testKeys.now }})
		testKeys.aliCh, _ = channel.NewAlipay(channel.AlipayConfig{Name: "ali", PublicKeys: []*rsa.PublicKey{&testKeys.ali.Key.PublicKey}, AppIDs: []string{"2021"}})
	})
	return testKeys.wx, testKeys.wxChan, testKeys.ali, testKeys.aliCh, testKeys.now
}

// checkParsed asserts what every adapter guarantees of a Parse: a refusal
// is an authentication, body or merchant failure, and an accepted delivery
// satisfies the field rules.
func checkParsed(t *testing.T, rej *channel.Reject, d *channel.Delivery) {
	if rej != nil {
		switch rej.Kind {
		case channel.BadSignature, channel.BadRequest, channel.MerchantMismatch:
		default:
			t.Fatalf("rejection kind %v", rej.Kind)
		}
		return
	}
	if !channel.FieldRulesHold(d) {
		t.Fatalf("accepted a delivery that breaks the field rules: %q %q %q %d %q", d.TxnID, d.OrderNo, d.Currency, d.Amount, d.Event)
	}
}

// FuzzWeChat: mode 0 sends the input as the body, unsigned headers as
// given; mode 1 signs it; mode 2 encrypts it as the resource of a signed
// envelope, so the fuzzer reaches the transaction mapping.
func FuzzWeChat(f *testing.F) {
	signer, ch, _, _, now := channels(f)
	txn, _ := json.Marshal(map[string]any{"mchid": "1900000109", "out_trade_no": "O1", "transaction_id": "T1", "trade_state": "SUCCESS",
		"amount": map[string]any{"total": 100, "currency": "CNY"}})
	_, env, _ := signer.Notify("TRANSACTION.SUCCESS", json.RawMessage(txn), now)
	f.Add(env, uint8(1), "TRANSACTION.SUCCESS")
	f.Add(txn, uint8(2), "TRANSACTION.SUCCESS")
	f.Add([]byte(`{"refund_id":"R1","out_trade_no":"O1","refund_status":"SUCCESS","amount":{"refund":1}}`), uint8(2), "REFUND.SUCCESS")
	f.Add([]byte(`{"resource":{"algorithm":"AEAD_AES_256_GCM","nonce":"123456789012","ciphertext":"AAAA"}}`), uint8(1), "")
	f.Add([]byte(`not json`), uint8(0), "")
	block, _ := aes.NewCipher([]byte(signer.APIv3Key))
	aead, _ := cipher.NewGCM(block)
	f.Fuzz(func(t *testing.T, in []byte, mode uint8, event string) {
		body := in
		if mode%3 == 2 {
			env := map[string]any{"event_type": event, "resource": map[string]string{"algorithm": "AEAD_AES_256_GCM",
				"nonce": "abcdefghijkl", "associated_data": "transaction",
				"ciphertext": base64.StdEncoding.EncodeToString(aead.Seal(nil, []byte("abcdefghijkl"), in, []byte("transaction")))}}
			body, _ = json.Marshal(env)
		}
		h := headerMap{"Wechatpay-Timestamp": "1796200000", "Wechatpay-Nonce": "n", "Wechatpay-Signature": "AAAA", "Wechatpay-Serial": signer.Serial}
		if mode%3 != 0 {
			sh, _ := signer.Sign(body, now)
			h = headerMap(sh)
		}
		req := channel.Request{Channel: []byte("wx"), ContentType: []byte("application/json"), Body: body, Header: h}
		var d channel.Delivery
		checkParsed(t, ch.Parse(&req, &d), &d)
	})
}

// FuzzAlipay: with sign set, the input's parameters are signed as channel.Alipay
// would, so the fuzzer reaches the mapping.
func FuzzAlipay(f *testing.F) {
	_, _, signer, ch, _ := channels(f)
	f.Add("trade_no=T1&out_trade_no=O1&total_amount=19.99&trade_status=TRADE_SUCCESS&app_id=2021", true)
	f.Add("trade_no=T1&out_trade_no=O1&total_amount=1e3&trade_status=TRADE_CLOSED&app_id=2021", true)
	f.Add("total_amount=0.1&trade_status=WAIT_BUYER_PAY", true)
	f.Add("sign=AAAA&sign_type=RSA2&trade_no=T1", false)
	f.Add("%zz", false)
	f.Fuzz(func(t *testing.T, in string, sign bool) {
		body := []byte(in)
		if sign {
			form, err := url.ParseQuery(in)
			if err != nil {
				return
			}
			params := map[string]string{}
			for k, v := range form {
				params[k] = v[0]
			}
			body, _ = signer.Notify(params)
		}
		req := channel.Request{Channel: []byte("ali"), ContentType: []byte("application/x-www-form-urlencoded"), Body: body, Header: headerMap{}}
		var d channel.Delivery
		checkParsed(t, ch.Parse(&req, &d), &d)
	})
}

// Parse+verify per adapter, and the RSA verification alone: it dominates.
func BenchmarkChannelParse(b *testing.B) {
	wx, wxCh, ali, aliCh, now := channels(b)
	gen, _ := channel.NewGeneric(channel.GenericConfig{Name: "acme", Secrets: []string{fuzzSecret}, Now: func() time.Time { return now }})
	txn := map[string]any{"mchid": "1900000109", "appid": "wx1", "out_trade_no": "O202612020001", "transaction_id": "4200001234202612020000001",
		"trade_state": "SUCCESS", "amount": map[string]any{"total": 1999, "currency": "CNY"}}
	wh, wbody, _ := wx.Notify("TRANSACTION.SUCCESS", txn, now)
	abody, _ := ali.Notify(map[string]string{"trade_no": "2026120222001", "out_trade_no": "O202612020001", "total_amount": "19.99",
		"trade_status": "TRADE_SUCCESS", "app_id": "2021", "notify_id": "ac05099524730693a8b330c5ecf72da9786", "charset": "utf-8"})
	gbody := []byte(`{"channel_txn_id":"4200001234202612020000001","event_type":"PAY_SUCCESS","order_no":"O202612020001","amount":1999,"currency":"CNY"}`)
	gsig, _ := channel.SignWebhook(fuzzSecret, "msg_1", now.Unix(), gbody)
	cases := []struct {
		name string
		ch   channel.Channel
		req  channel.Request
	}{
		{"generic", gen, channel.Request{ContentType: []byte("application/json"), Body: gbody,
			Header: headerBytes{"webhook-id": []byte("msg_1"), "webhook-timestamp": []byte("1796200000"), "webhook-signature": []byte(gsig)}}},
		{"wechatpay", wxCh, channel.Request{ContentType: []byte("application/json"), Body: wbody, Header: headerMap(wh)}},
		{"alipay", aliCh, channel.Request{ContentType: []byte("application/x-www-form-urlencoded"), Body: abody, Header: headerMap{}}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var d channel.Delivery
			b.ReportAllocs()
			for range b.N {
				d.Reset()
				if rej := c.ch.Parse(&c.req, &d); rej != nil {
					b.Fatal(rej)
				}
			}
		})
	}
}
