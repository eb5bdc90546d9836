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

var alipaySigners struct {
	once       sync.Once
	ok, stolen *channeltest.AlipaySigner
}

func alipaySigner() (*channeltest.AlipaySigner, *channeltest.AlipaySigner) {
	alipaySigners.once.Do(func() {
		alipaySigners.ok, _ = channeltest.NewAlipaySigner()
		alipaySigners.stolen, _ = channeltest.NewAlipaySigner()
	})
	return alipaySigners.ok, alipaySigners.stolen
}

func alipayChannel(t testing.TB, s *channeltest.AlipaySigner) channel.Channel {
	t.Helper()
	ch, err := channel.NewAlipay(channel.AlipayConfig{Name: "ali", PublicKeys: []*rsa.PublicKey{&s.Key.PublicKey},
		AppIDs: []string{"2021000000000001"}, SellerID: "2088000000000001"})
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func aliParams(tradeNo, orderNo, amount, status string) map[string]string {
	return map[string]string{
		"notify_time": "2026-12-02 10:34:56", "notify_type": "trade_status_sync", "notify_id": "ac05099524730693a8b330c5ecf72da9786",
		"app_id": "2021000000000001", "charset": "utf-8", "version": "1.0", "trade_no": tradeNo, "out_trade_no": orderNo,
		"seller_id": "2088000000000001", "buyer_id": "2088102122524333", "trade_status": status, "total_amount": amount,
		"receipt_amount": amount, "subject": "订单支付", "gmt_payment": "2026-12-02 10:34:55",
	}
}

func (b *bundle) sendAli(t *testing.T, s *channeltest.AlipaySigner, params map[string]string) reply {
	t.Helper()
	body, err := s.Notify(params)
	if err != nil {
		t.Fatal(err)
	}
	return b.sendAliBody(t, body)
}

func (b *bundle) sendAliBody(t *testing.T, body []byte) reply {
	t.Helper()
	h := http.Header{}
	h.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	return b.send(t, http.MethodPost, "/notify/ali", h, string(body))
}

func TestAlipay(t *testing.T) {
	signer, stolen := alipaySigner()
	b := setup(t, options{channels: []channel.Channel{alipayChannel(t, signer)}})
	b.order(t, "AL-1", durable.PendingPay, 1999)

	// Points 1 and 4: applied with "success"; re-sent with a new notify_id
	// and signature, it replays "success" byte for byte.
	first := b.sendAli(t, signer, aliParams("2026120222001", "AL-1", "19.99", "TRADE_SUCCESS"))
	if first.status != 200 || first.body != "success" || first.replayed || b.status(t, "AL-1") != "PAID" {
		t.Fatalf("first: %+v, status %s", first, b.status(t, "AL-1"))
	}
	p := aliParams("2026120222001", "AL-1", "19.99", "TRADE_SUCCESS")
	p["notify_id"], p["notify_time"] = "another-notify-id", "2026-12-02 10:39:00"
	if again := b.sendAli(t, signer, p); again.status != 200 || again.body != "success" || !again.replayed {
		t.Errorf("re-signed retry: %+v", again)
	}
	// TRADE_FINISHED after TRADE_SUCCESS is the same payment: a replay.
	if fin := b.sendAli(t, signer, aliParams("2026120222001", "AL-1", "19.99", "TRADE_FINISHED")); !fin.replayed || fin.body != "success" {
		t.Errorf("TRADE_FINISHED: %+v", fin)
	}

	// Point 1: authentication failures answer "failure" and store nothing.
	b.order(t, "AL-2", durable.PendingPay, 10)
	good, _ := signer.Notify(aliParams("2026120222002", "AL-2", "0.1", "TRADE_SUCCESS"))
	forged, _ := stolen.Notify(aliParams("2026120222002", "AL-2", "0.1", "TRADE_SUCCESS"))
	for name, body := range map[string][]byte{
		"wrong key":     forged,
		"tampered body": []byte(strings.Replace(string(good), "total_amount=0.1", "total_amount=0.2", 1)),
		"no sign":       []byte(strings.Split(string(good), "&sign=")[0]),
	} {
		t.Run(name, func(t *testing.T) {
			before := b.counts(t)
			if got := b.sendAliBody(t, body); got.status != 401 || got.body != "failure" {
				t.Errorf("got %d %q, want 401 failure", got.status, got.body)
			}
			if after := b.counts(t); after != before {
				t.Errorf("stored something: %+v -> %+v", before, after)
			}
		})
	}
	// "0.1" yuan is 10 fen: the order's amount, so applied.
	if got := b.sendAliBody(t, good); got.body != "success" || b.status(t, "AL-2") != "PAID" {
		t.Errorf("0.1 yuan: %+v", got)
	}

	// Point 2: amounts that are not yuan with at most two decimals are 400.
	for _, amount := range []string{"1e3", "19.999", "-1", "19,99", ""} {
		before := b.counts(t)
		if got := b.sendAli(t, signer, aliParams("2026120222009", "AL-1", amount, "TRADE_SUCCESS")); got.status != 400 || got.body != "failure" {
			t.Errorf("total_amount %q: %+v, want 400 failure", amount, got)
		}
		if after := b.counts(t); after != before {
			t.Errorf("total_amount %q stored something", amount)
		}
	}

	// Point 2: another seller: a review row, "failure", order untouched.
	b.order(t, "AL-3", durable.PendingPay, 500)
	other := aliParams("2026120222003", "AL-3", "5.00", "TRADE_SUCCESS")
	other["seller_id"] = "2088999999999999"
	before := b.counts(t)
	if got := b.sendAli(t, signer, other); got.status != 422 || got.body != "failure" {
		t.Errorf("seller mismatch: %+v", got)
	}
	if after := b.counts(t); after.reviews != before.reviews+1 || after.claims != before.claims || b.status(t, "AL-3") != "PENDING_PAY" {
		t.Errorf("seller mismatch stored %+v -> %+v", before, after)
	}
	if got := b.metric(t, `notifyedge_request_duration_seconds_count{channel="ali",path="durable"}`); got < 1 {
		t.Errorf("merchant mismatch not timed on the durable path")
	}
	if got := b.metric(t, `notifyedge_request_duration_seconds_count{channel="ali",path="cache"}`); got != 0 {
		t.Errorf("%v requests timed on the cache path with no cache configured", got)
	}

	// TRADE_CLOSED on a paid order is its full refund.
	if got := b.sendAli(t, signer, aliParams("2026120222001", "AL-1", "19.99", "TRADE_CLOSED")); got.body != "success" || b.status(t, "AL-1") != "REFUNDED" {
		t.Errorf("TRADE_CLOSED: %+v, status %s", got, b.status(t, "AL-1"))
	}
}

func TestParseYuan(t *testing.T) {
	f := func(in string, want int64, ok bool) {
		t.Helper()
		got, gotOK := channel.ParseYuan(in)
		if got != want || gotOK != ok {
			t.Errorf("ParseYuan(%q) = %d, %v; want %d, %v", in, got, gotOK, want, ok)
		}
	}
	f("19.99", 1999, true)
	f("0.1", 10, true)
	f("0.01", 1, true)
	f("5", 500, true)
	f("90071992547409.91", 9007199254740991, true)
	f("90071992547409.92", 0, false)
	f("1e3", 0, false)
	f("19.999", 0, false)
	f("0", 0, false)
	f("0.00", 0, false)
	f("01.5", 0, false)
	f(".5", 0, false)
	f("5.", 0, false)
	f("-1", 0, false)
	f("", 0, false)
	f("1 ", 0, false)
}

// Several app ids share one seller id; a certificate past its NotAfter
// verifies nothing, while another key still may.
func TestAlipayAppIDsAndExpiry(t *testing.T) {
	ok, other := alipaySigner()
	now := time.Now()
	ch, err := channel.NewAlipay(channel.AlipayConfig{Name: "ali",
		PublicKeys: []*rsa.PublicKey{&other.Key.PublicKey, &ok.Key.PublicKey},
		NotAfter:   []time.Time{{}, now.Add(time.Hour)},
		AppIDs:     []string{"2021000000000001", "2021000000000002"}, SellerID: "2088000000000001",
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, options{channels: []channel.Channel{ch}})
	for i, app := range []string{"2021000000000001", "2021000000000002", "2021000000000003"} {
		o := fmt.Sprintf("ALA-%d", i)
		b.order(t, o, durable.PendingPay, 1999)
		p := aliParams(fmt.Sprintf("20261203220100%02d", i), o, "19.99", "TRADE_SUCCESS")
		p["app_id"] = app
		if want, r := map[bool]int{true: 200, false: 422}[i < 2], b.sendAli(t, ok, p); r.status != want {
			t.Errorf("app_id %s: %d, want %d", app, r.status, want)
		}
	}
	expired, err := channel.NewAlipay(channel.AlipayConfig{Name: "ali", PublicKeys: []*rsa.PublicKey{&ok.Key.PublicKey},
		NotAfter: []time.Time{now.Add(-time.Second)}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	e := setup(t, options{channels: []channel.Channel{expired}, dbURL: b.dbURL})
	e.order(t, "ALA-X", durable.PendingPay, 1999)
	if r := e.sendAli(t, ok, aliParams("2026120322010099", "ALA-X", "19.99", "TRADE_SUCCESS")); r.status != 401 {
		t.Errorf("signed by a key whose certificate expired: %d, want 401", r.status)
	}
}
