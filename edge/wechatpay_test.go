package edge_test

import (
	"crypto/rsa"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/channel/channeltest"
)

var wechatSigners struct {
	once       sync.Once
	ok, stolen *channeltest.WeChatPaySigner
}

// signers are generated once per binary: RSA-2048 key generation is slow.
func wechatSigner(t testing.TB) (*channeltest.WeChatPaySigner, *channeltest.WeChatPaySigner) {
	wechatSigners.once.Do(func() {
		wechatSigners.ok, _ = channeltest.NewWeChatPaySigner()
		wechatSigners.stolen, _ = channeltest.NewWeChatPaySigner()
	})
	return wechatSigners.ok, wechatSigners.stolen
}

func wechatChannel(t testing.TB, s *channeltest.WeChatPaySigner) channel.Channel {
	t.Helper()
	ch, err := channel.NewWeChatPay(channel.WeChatPayConfig{Name: "wx", APIv3Key: s.APIv3Key,
		PlatformKeys: map[string]*rsa.PublicKey{s.Serial: &s.PlatformKey.PublicKey}, MchID: "1900000109", AppIDs: []string{"wxd678efh567hg6787"}})
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

type wxTxn map[string]any

func wxTransaction(txn, orderNo string, total int64) wxTxn {
	return wxTxn{"mchid": "1900000109", "appid": "wxd678efh567hg6787", "out_trade_no": orderNo, "transaction_id": txn,
		"trade_type": "JSAPI", "trade_state": "SUCCESS", "success_time": "2026-12-02T10:34:56+08:00",
		"payer":  map[string]string{"openid": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"},
		"amount": map[string]any{"total": total, "payer_total": total, "currency": "CNY", "payer_currency": "CNY"}}
}

func (b *bundle) sendWx(t *testing.T, headers map[string]string, body []byte) reply {
	t.Helper()
	h := http.Header{}
	for k, v := range headers {
		h.Set(k, v)
	}
	return b.send(t, http.MethodPost, "/notify/wx", h, string(body))
}

func TestWeChatPay(t *testing.T) {
	signer, stolen := wechatSigner(t)
	b := setup(t, options{channels: []channel.Channel{wechatChannel(t, signer)}})
	b.order(t, "WX-1", durable.PendingPay, 100)
	now := time.Now()
	notify := func(s *channeltest.WeChatPaySigner, event string, res wxTxn, at time.Time) (map[string]string, []byte) {
		t.Helper()
		h, body, err := s.Notify(event, res, at)
		if err != nil {
			t.Fatal(err)
		}
		return h, body
	}

	// Point 1 and 4: applied with WeChat's empty success; the same
	// transaction re-encrypted and re-signed replays byte for byte.
	h, body := notify(signer, "TRANSACTION.SUCCESS", wxTransaction("4200000001", "WX-1", 100), now)
	first := b.sendWx(t, h, body)
	if first.status != 200 || first.body != "" || first.replayed {
		t.Fatalf("first: %+v, want 200 with an empty body", first)
	}
	if b.status(t, "WX-1") != "PAID" {
		t.Fatal("order not PAID")
	}
	h2, body2 := notify(signer, "TRANSACTION.SUCCESS", wxTransaction("4200000001", "WX-1", 100), now.Add(time.Minute))
	again := b.sendWx(t, h2, body2)
	if again.status != 200 || again.body != "" || !again.replayed {
		t.Errorf("re-signed retry: %+v, want the same empty 200, replayed", again)
	}
	var stored string
	b.db.QueryRow(t.Context(), `SELECT result_json FROM notify_claim WHERE biz_key = 'wx:4200000001:PAY_SUCCESS'`).Scan(&stored)
	if stored != `{"http":200,"code":"SUCCESS","outcome":"applied","status":"PAID"}` {
		t.Errorf("stored %q", stored)
	}

	// Point 1: authentication failures, in WeChat's failure format, store nothing.
	b.order(t, "WX-2", durable.PendingPay, 100)
	good := func() (map[string]string, []byte) {
		return notify(signer, "TRANSACTION.SUCCESS", wxTransaction("4200000002", "WX-2", 100), now)
	}
	cases := map[string]func() (map[string]string, []byte){
		"wrong key": func() (map[string]string, []byte) {
			h, body := notify(stolen, "TRANSACTION.SUCCESS", wxTransaction("4200000002", "WX-2", 100), now)
			h["Wechatpay-Serial"] = signer.Serial
			return h, body
		},
		"tampered body": func() (map[string]string, []byte) {
			h, body := good()
			return h, []byte(strings.Replace(string(body), `"summary":"notification"`, `"summary":"notificatioN"`, 1))
		},
		"tampered resource under a valid signature": func() (map[string]string, []byte) {
			_, body := good()
			i := strings.Index(string(body), `"ciphertext":"`) + len(`"ciphertext":"`)
			body[i+4] ^= 1
			h2, _ := signer.Sign(body, now) // the signature is valid; the ciphertext is not
			return h2, body
		},
		"stale timestamp": func() (map[string]string, []byte) {
			return notify(signer, "TRANSACTION.SUCCESS", wxTransaction("4200000002", "WX-2", 100), now.Add(-6*time.Minute))
		},
		"signature probe": func() (map[string]string, []byte) {
			h, body := good()
			h["Wechatpay-Signature"] = "WECHATPAY/SIGNTEST/" + h["Wechatpay-Signature"]
			return h, body
		},
		"unknown serial": func() (map[string]string, []byte) {
			h, body := good()
			h["Wechatpay-Serial"] = "0000"
			return h, body
		},
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			before := b.counts(t)
			h, body := mk()
			got := b.sendWx(t, h, body)
			if got.status != 401 || !strings.HasPrefix(got.body, `{"code":"FAIL","message":`) {
				t.Errorf("got %d %q, want 401 with WeChat's FAIL body", got.status, got.body)
			}
			if after := b.counts(t); after != before {
				t.Errorf("stored something: %+v -> %+v", before, after)
			}
		})
	}

	// Point 2: another merchant: a review row, WeChat's failure, order untouched.
	other := wxTransaction("4200000003", "WX-2", 100)
	other["mchid"] = "1900009999"
	h, body = notify(signer, "TRANSACTION.SUCCESS", other, now)
	before := b.counts(t)
	got := b.sendWx(t, h, body)
	if got.status != 422 || got.body != `{"code":"FAIL","message":"mchid or appid is not this channel's: held for review"}` {
		t.Errorf("merchant mismatch: %d %s", got.status, got.body)
	}
	if after := b.counts(t); after.reviews != before.reviews+1 || after.claims != before.claims || b.status(t, "WX-2") != "PENDING_PAY" {
		t.Errorf("merchant mismatch stored %+v -> %+v, status %s", before, after, b.status(t, "WX-2"))
	}
	if n := b.count(t, `SELECT count(*) FROM notify_review WHERE reason = 'MERCHANT_MISMATCH' AND biz_key = 'wx:4200000003:PAY_SUCCESS'`); n != 1 {
		t.Errorf("MERCHANT_MISMATCH rows %d", n)
	}

	// A refund, keyed by the refund id.
	refund := wxTxn{"mchid": "1900000109", "out_trade_no": "WX-1", "transaction_id": "4200000001", "out_refund_no": "R1",
		"refund_id": "50000000382019052709732678859", "refund_status": "SUCCESS",
		"amount": map[string]any{"total": 100, "refund": 100, "payer_total": 100, "payer_refund": 100}}
	h, body = notify(signer, "REFUND.SUCCESS", refund, now)
	if got := b.sendWx(t, h, body); got.status != 200 || b.status(t, "WX-1") != "REFUNDED" {
		t.Errorf("refund: %+v, status %s", got, b.status(t, "WX-1"))
	}
	// A premature event is WeChat's failure format too.
	b.order(t, "WX-3", durable.PendingPay, 100)
	refund["out_trade_no"], refund["refund_id"] = "WX-3", "50000000382019052709732678860"
	h, body = notify(signer, "REFUND.SUCCESS", refund, now)
	if got := b.sendWx(t, h, body); got.status != 409 || !strings.HasPrefix(got.body, `{"code":"FAIL"`) {
		t.Errorf("premature refund: %+v", got)
	}
}

// Several app ids share one mchid; a platform certificate past its
// NotAfter verifies nothing.
func TestWeChatPayAppIDsAndExpiry(t *testing.T) {
	signer, _ := wechatSigner(t)
	now := time.Now()
	ch, err := channel.NewWeChatPay(channel.WeChatPayConfig{Name: "wx", APIv3Key: signer.APIv3Key,
		PlatformKeys: map[string]*rsa.PublicKey{signer.Serial: &signer.PlatformKey.PublicKey},
		NotAfter:     map[string]time.Time{signer.Serial: now.Add(time.Hour)},
		MchID:        "1900000109", AppIDs: []string{"wxd678efh567hg6787", "wx_miniprogram_01"},
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, options{channels: []channel.Channel{ch}})
	for i, appid := range []string{"wxd678efh567hg6787", "wx_miniprogram_01", "wx_someone_else"} {
		o := fmt.Sprintf("WXA-%d", i)
		b.order(t, o, durable.PendingPay, 100)
		res := wxTransaction(fmt.Sprintf("42000011%02d", i), o, 100)
		res["appid"] = appid
		h, body, err := signer.Notify("TRANSACTION.SUCCESS", res, now)
		if err != nil {
			t.Fatal(err)
		}
		r := b.sendWx(t, h, body)
		if want := map[bool]int{true: 200, false: 422}[i < 2]; r.status != want {
			t.Errorf("appid %s: %d, want %d", appid, r.status, want)
		}
	}
	expired, err := channel.NewWeChatPay(channel.WeChatPayConfig{Name: "wx", APIv3Key: signer.APIv3Key,
		PlatformKeys: map[string]*rsa.PublicKey{signer.Serial: &signer.PlatformKey.PublicKey},
		NotAfter:     map[string]time.Time{signer.Serial: now.Add(-time.Second)}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	e := setup(t, options{channels: []channel.Channel{expired}, dbURL: b.dbURL})
	e.order(t, "WXA-X", durable.PendingPay, 100)
	h, body, _ := signer.Notify("TRANSACTION.SUCCESS", wxTransaction("4200001199", "WXA-X", 100), now)
	if r := e.sendWx(t, h, body); r.status != 401 {
		t.Errorf("signed by an expired certificate: %d, want 401", r.status)
	}
}
