package edge_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-pay/gopay/alipay"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/wechatpay-apiv3/wechatpay-go/core/auth/verifiers"
	"github.com/wechatpay-apiv3/wechatpay-go/core/notify"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge/channel"
)

// The channels' own code checks our test signers: every callback they make
// verifies with wechatpay-go's notify handler, gopay's Alipay VerifySign
// and the Standard Webhooks library before it is sent to the edge, which
// applies it; the same callback with one byte changed is refused by both.
// These are test-only dependencies: edged links none of them.
func TestSignersAgreeWithTheChannelsSDKs(t *testing.T) {
	wx, _ := wechatSigner(t)
	ali, _ := alipaySigner()
	b := setup(t, options{channels: []channel.Channel{wechatChannel(t, wx), alipayChannel(t, ali)}})
	now := time.Now()
	tamper := func(body []byte, from, to string) []byte {
		t.Helper()
		if !bytes.Contains(body, []byte(from)) {
			t.Fatalf("%q not in the body", from)
		}
		return bytes.Replace(body, []byte(from), []byte(to), 1)
	}

	t.Run("WeChat Pay, wechatpay-go", func(t *testing.T) {
		b.order(t, "SDK-WX", durable.PendingPay, 100)
		h, body, err := wx.Notify("TRANSACTION.SUCCESS", wxTransaction("4200009901", "SDK-WX", 100), now)
		if err != nil {
			t.Fatal(err)
		}
		handler := notify.NewNotifyHandler(wx.APIv3Key, verifiers.NewSHA256WithRSAPubkeyVerifier(wx.Serial, wx.PlatformKey.PublicKey))
		sdk := func(body []byte) error {
			req := httptest.NewRequest(http.MethodPost, "/notify/wx", bytes.NewReader(body))
			for k, v := range h {
				req.Header.Set(k, v)
			}
			var content map[string]any
			_, err := handler.ParseNotifyRequest(context.Background(), req, &content)
			return err
		}
		if err := sdk(body); err != nil {
			t.Fatalf("wechatpay-go refuses our callback: %v", err)
		}
		if r := b.sendWx(t, h, body); r.status != 200 || b.status(t, "SDK-WX") != "PAID" {
			t.Fatalf("edge: %+v", r)
		}
		bad := tamper(body, `"event_type":"TRANSACTION.SUCCESS"`, `"event_type":"TRANSACTION.SUCCESs"`)
		if sdk(bad) == nil {
			t.Error("wechatpay-go accepts a changed byte")
		}
		if r := b.sendWx(t, h, bad); r.status != 401 {
			t.Errorf("edge on a changed byte: %d, want 401", r.status)
		}
	})

	t.Run("Alipay, gopay", func(t *testing.T) {
		b.order(t, "SDK-ALI", durable.PendingPay, 1999)
		body, err := ali.Notify(aliParams("2026120322009901", "SDK-ALI", "19.99", "TRADE_SUCCESS"))
		if err != nil {
			t.Fatal(err)
		}
		sdk := func(body []byte) bool {
			form, err := url.ParseQuery(string(body))
			if err != nil {
				t.Fatal(err)
			}
			bm, err := alipay.ParseNotifyByURLValues(form)
			if err != nil {
				t.Fatal(err)
			}
			ok, _ := alipay.VerifySign(ali.PublicKeyBase64(), bm)
			return ok
		}
		if !sdk(body) {
			t.Fatal("gopay refuses our callback")
		}
		if r := b.sendAliBody(t, body); r.status != 200 || b.status(t, "SDK-ALI") != "PAID" {
			t.Fatalf("edge: %+v", r)
		}
		bad := tamper(body, "total_amount=19.99", "total_amount=19.98")
		if sdk(bad) {
			t.Error("gopay accepts a changed byte")
		}
		if r := b.sendAliBody(t, bad); r.status != 401 {
			t.Errorf("edge on a changed byte: %d, want 401", r.status)
		}
	})

	t.Run("Standard Webhooks, the reference library", func(t *testing.T) {
		b.order(t, "SDK-GEN", durable.PendingPay, 1999)
		payload := []byte(body("T-SDK-GEN", "PAY_SUCCESS", "SDK-GEN", 1999))
		ts := now.Unix()
		sig, err := channel.SignWebhook(testSecret, "msg_sdk", ts, payload)
		if err != nil {
			t.Fatal(err)
		}
		h := http.Header{}
		h.Set("Content-Type", "application/json")
		h.Set("webhook-id", "msg_sdk")
		h.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
		h.Set("webhook-signature", sig)
		wh, err := standardwebhooks.NewWebhook(testSecret)
		if err != nil {
			t.Fatal(err)
		}
		if err := wh.Verify(payload, h); err != nil {
			t.Fatalf("the Standard Webhooks library refuses our signature: %v", err)
		}
		if r := b.send(t, http.MethodPost, "/notify/acme", h, string(payload)); r.status != 200 || b.status(t, "SDK-GEN") != "PAID" {
			t.Fatalf("edge: %+v", r)
		}
		bad := strings.Replace(string(payload), "1999", "1998", 1)
		if wh.Verify([]byte(bad), h) == nil {
			t.Error("the library accepts a changed byte")
		}
		if r := b.send(t, http.MethodPost, "/notify/acme", h, bad); r.status != 401 {
			t.Errorf("edge on a changed byte: %d, want 401", r.status)
		}
	})
}
