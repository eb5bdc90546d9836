package query_test

import (
	"crypto/rsa"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/reconcile/query"
	"github.com/notifyedge/notifyedge/edge/reconcile/query/querytest"
)

const (
	wxMchID  = "1900000109"
	wxSerial = "5157F09EFDC096DE15EBE81A47057A7232F1B8E1"
	wxAppID  = "wx8888888888888888"
)

// wxEnv is a WeChat Pay fake, a querier pointed at it and the callback
// adapter configured with the same keys and merchant.
type wxEnv struct {
	fake *querytest.WeChatFake
	q    *query.WeChat
	ch   *channel.WeChatPay
}

// newWeChat starts a fake signing with the platform key and a querier
// holding it; mod changes the querier's configuration.
func newWeChat(t *testing.T, tls bool, mod func(*query.WeChatConfig)) wxEnv {
	t.Helper()
	k := keys()
	fake := querytest.NewWeChatFake(querytest.WeChatFakeConfig{MchID: wxMchID, MerchantKey: &k.merchant.PublicKey,
		MerchantSerial: wxSerial, Platform: k.platform, AppID: wxAppID, TLS: tls})
	t.Cleanup(fake.Close)
	cfg := query.WeChatConfig{MchID: wxMchID, MerchantKey: k.merchant, MerchantSerial: wxSerial,
		PlatformKeys: map[string]*rsa.PublicKey{k.platform.Serial: &k.platform.PlatformKey.PublicKey},
		BaseURL:      fake.URL(), Timeout: 10 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	q, err := query.NewWeChat(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := channel.NewWeChatPay(channel.WeChatPayConfig{Name: "wx", APIv3Key: k.platform.APIv3Key,
		PlatformKeys: map[string]*rsa.PublicKey{k.platform.Serial: &k.platform.PlatformKey.PublicKey},
		MchID:        wxMchID, AppIDs: []string{wxAppID}})
	if err != nil {
		t.Fatal(err)
	}
	return wxEnv{fake: fake, q: q, ch: ch}
}

// Every trade_state maps to its state; an unknown order (a signed 404
// ORDER_NOT_EXIST) is NotFound. Only a paid (or paid and refunded) answer
// carries a body.
func TestWeChatStates(t *testing.T) {
	e := newWeChat(t, false, nil)
	cases := []stateCase{
		{"SUCCESS", query.Paid}, {"REFUND", query.Refunded},
		{"NOTPAY", query.Pending}, {"USERPAYING", query.Pending}, {"PAYERROR", query.Pending},
		{"CLOSED", query.Closed}, {"REVOKED", query.Closed},
	}
	for i, c := range cases {
		orderNo := "WX-STATE-" + c.channelState
		e.fake.SetTrade(orderNo, querytest.Trade{State: c.channelState, TxnID: "42000000" + string(rune('0'+i)), Amount: 100})
		a := mustAnswer(t, e.q, orderNo)
		if a.State != c.want || a.ChannelState != c.channelState {
			t.Errorf("%s: %s %s, want %s", c.channelState, a.State, a.ChannelState, c.want)
		}
		if (a.Body != nil) != (c.want == query.Paid || c.want == query.Refunded) {
			t.Errorf("%s: body %q", c.channelState, a.Body)
		}
	}
	a := mustAnswer(t, e.q, "WX-NEVER-SEEN")
	if a.State != query.NotFound || a.ChannelState != "ORDER_NOT_EXIST" || a.Body != nil {
		t.Errorf("unknown order: %+v", a)
	}
	e.fake.SetTrade("WX-FORGOTTEN", querytest.Trade{State: "NOTPAY", Amount: 100})
	e.fake.Forget("WX-FORGOTTEN")
	if a := mustAnswer(t, e.q, "WX-FORGOTTEN"); a.State != query.NotFound {
		t.Errorf("forgotten order: %+v", a)
	}
	if n, times := e.fake.Requests(), e.fake.RequestTimes(); n != len(cases)+2 || len(times) != n {
		t.Errorf("the fake counted %d requests (%d times), want %d", n, len(times), len(cases)+2)
	}
}

// A paid answer's body, re-driven through the callback adapter, has the
// key and digest of the trade's TRANSACTION.SUCCESS callback (REFUND:
// paid, then refunded, too, for its review row); paid with another
// amount, it maps to that amount, so the decision sees the mismatch.
func TestWeChatPaidBodyMapsAsTheCallback(t *testing.T) {
	e := newWeChat(t, false, nil)
	k := keys()
	const orderNo, txnID = "WX-PAID-1", "4200001234202612030000000001"
	resource := map[string]any{"mchid": wxMchID, "appid": wxAppID, "out_trade_no": orderNo, "transaction_id": txnID,
		"trade_state": "SUCCESS", "amount": map[string]any{"total": 1999, "currency": "CNY"}}
	h, body, err := k.platform.Notify("TRANSACTION.SUCCESS", resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var cb channel.Delivery
	if rej := e.ch.Parse(&channel.Request{Channel: []byte("wx"), ContentType: []byte("application/json"), Body: body, Header: headerOf(h)}, &cb); rej != nil {
		t.Fatal(rej)
	}
	for _, state := range []string{"SUCCESS", "REFUND"} {
		e.fake.SetTrade(orderNo, querytest.Trade{State: state, TxnID: txnID, Amount: 1999})
		a := mustAnswer(t, e.q, orderNo)
		if want := map[string]query.State{"SUCCESS": query.Paid, "REFUND": query.Refunded}[state]; a.State != want {
			t.Fatalf("%s: %s, want %s", state, a.State, want)
		}
		var env struct {
			ID        string         `json:"id"`
			EventType string         `json:"event_type"`
			Resource  map[string]any `json:"resource"`
		}
		if err := json.Unmarshal(a.Body, &env); err != nil || env.EventType != channel.WeChatQueriedEvent ||
			!strings.HasPrefix(env.ID, "query-") || env.Resource["transaction_id"] != txnID {
			t.Fatalf("%s: body %s (%v)", state, a.Body, err)
		}
		d := redrive(t, e.ch, a.Body)
		if string(d.Key) != string(cb.Key) || d.Digest != cb.Digest {
			t.Fatalf("%s: queried %s %s, callback %s %s", state, d.Key, d.Digest[:12], cb.Key, cb.Digest[:12])
		}
	}
	e.fake.SetTrade(orderNo, querytest.Trade{State: "SUCCESS", TxnID: txnID, Amount: 2999})
	d := redrive(t, e.ch, mustAnswer(t, e.q, orderNo).Body)
	if d.Amount != 2999 || string(d.Key) != string(cb.Key) || d.Digest == cb.Digest {
		t.Fatalf("paid 2999: amount %d key %s digest same as the callback's: %v", d.Amount, d.Key, d.Digest == cb.Digest)
	}
}

// The SDK verifies every answer: a flipped signature byte, a key the
// querier does not hold, and a key past its NotAfter are ErrUnverified,
// and so is a "no such order" 404 with a broken signature (the SDK itself
// does not check non-2xx answers). During a rotation either key verifies.
func TestWeChatUnverified(t *testing.T) {
	k := keys()
	e := newWeChat(t, false, nil)
	e.fake.SetTrade("WX-V-1", querytest.Trade{State: "SUCCESS", TxnID: "4200000001", Amount: 100})
	mustAnswer(t, e.q, "WX-V-1")

	e.fake.SetBadSignature(true)
	a, err := queryNow(t, e.q, "WX-V-1")
	wantUnverified(t, "paid, flipped signature", a, err)
	a, err = queryNow(t, e.q, "WX-V-UNKNOWN")
	wantUnverified(t, "ORDER_NOT_EXIST, flipped signature", a, err)
	e.fake.SetBadSignature(false)

	e.fake.SetPlatform(k.platform2)
	a, err = queryNow(t, e.q, "WX-V-1")
	wantUnverified(t, "signed by an unknown serial", a, err)
	a, err = queryNow(t, e.q, "WX-V-UNKNOWN")
	wantUnverified(t, "ORDER_NOT_EXIST signed by an unknown serial", a, err)

	// Both keys held (a rotation): the new one verifies; the old one,
	// expired, no longer does.
	rot := newWeChat(t, false, func(c *query.WeChatConfig) {
		c.PlatformKeys[k.platform2.Serial] = &k.platform2.PlatformKey.PublicKey
		c.NotAfter = map[string]time.Time{k.platform.Serial: time.Now().Add(-time.Hour)}
	})
	rot.fake.SetTrade("WX-V-2", querytest.Trade{State: "NOTPAY", Amount: 100})
	a, err = queryNow(t, rot.q, "WX-V-2")
	wantUnverified(t, "signed by an expired key", a, err)
	rot.fake.SetPlatform(k.platform2)
	if a := mustAnswer(t, rot.q, "WX-V-2"); a.State != query.Pending {
		t.Fatalf("signed by the new key: %+v", a)
	}
}

// The SDK signs each request and the fake checks it as WeChat Pay does: a
// request signed with another merchant key, or naming another serial, is
// refused (401 SIGN_ERROR): a failure to ask, not an unverified answer.
func TestWeChatFakeRefusesAWrongMerchantSignature(t *testing.T) {
	k := keys()
	e := newWeChat(t, false, func(c *query.WeChatConfig) { c.MerchantKey = k.otherMerchant })
	e.fake.SetTrade("WX-M-1", querytest.Trade{State: "SUCCESS", TxnID: "4200000002", Amount: 100})
	a, err := queryNow(t, e.q, "WX-M-1")
	wantFailure(t, "another merchant key", a, err, "401", "SIGN_ERROR")
	if n := e.fake.Requests(); n != 1 {
		t.Fatalf("the fake saw %d requests, want 1", n)
	}
	e = newWeChat(t, false, func(c *query.WeChatConfig) { c.MerchantSerial = "0000000000000000" })
	a, err = queryNow(t, e.q, "WX-M-1")
	wantFailure(t, "another serial", a, err, "SIGN_ERROR")
}

// A verified answer about another order or another merchant is not taken.
func TestWeChatAnswerForSomethingElse(t *testing.T) {
	e := newWeChat(t, false, nil)
	e.fake.SetTrade("WX-O-1", querytest.Trade{State: "SUCCESS", TxnID: "4200000003", Amount: 100, OutTradeNo: "WX-O-2"})
	a, err := queryNow(t, e.q, "WX-O-1")
	wantFailure(t, "another order", a, err, "another order")
	e.fake.SetTrade("WX-O-1", querytest.Trade{State: "SUCCESS", TxnID: "4200000003", Amount: 100, MchID: "1900000999"})
	a, err = queryNow(t, e.q, "WX-O-1")
	wantFailure(t, "another merchant", a, err, "another merchant")
	e.fake.SetTrade("WX-O-1", querytest.Trade{State: "SOMETHING_NEW", Amount: 100})
	a, err = queryNow(t, e.q, "WX-O-1")
	wantFailure(t, "an unknown trade_state", a, err, "SOMETHING_NEW")
}

// A channel that is down, drops the connection or never answers is an
// error, returned within the query's timeout.
func TestWeChatDown(t *testing.T) {
	const timeout = 400 * time.Millisecond
	e := newWeChat(t, false, func(c *query.WeChatConfig) { c.Timeout = timeout })
	e.fake.SetTrade("WX-D-1", querytest.Trade{State: "SUCCESS", TxnID: "4200000004", Amount: 100})
	e.fake.SetDown(true)
	a, err := queryNow(t, e.q, "WX-D-1")
	wantFailure(t, "down", a, err, "503")
	e.fake.SetDown(false)
	e.fake.SetDrop(true)
	a, err = queryNow(t, e.q, "WX-D-1")
	wantFailure(t, "dropped", a, err)
	e.fake.SetDrop(false)
	e.fake.SetStall(true)
	start := time.Now()
	a, err = queryNow(t, e.q, "WX-D-1")
	wantFailure(t, "stalled", a, err)
	if took := time.Since(start); took > timeout+3*time.Second {
		t.Fatalf("a stalled query took %v, timeout %v", took, timeout)
	}
	e.fake.SetStall(false)
	if a := mustAnswer(t, e.q, "WX-D-1"); a.State != query.Paid {
		t.Fatalf("back up: %+v", a)
	}
}

// TLS is verified as usual: a self-signed endpoint is refused unless the
// transport trusts it.
func TestWeChatVerifiesTLS(t *testing.T) {
	e := newWeChat(t, true, nil)
	e.fake.SetTrade("WX-T-1", querytest.Trade{State: "NOTPAY", Amount: 100})
	a, err := queryNow(t, e.q, "WX-T-1")
	wantFailure(t, "self-signed", a, err, "certificate")
	trusted := newWeChat(t, true, nil)
	q, err := query.NewWeChat(query.WeChatConfig{MchID: wxMchID, MerchantKey: keys().merchant, MerchantSerial: wxSerial,
		PlatformKeys: map[string]*rsa.PublicKey{keys().platform.Serial: &keys().platform.PlatformKey.PublicKey},
		BaseURL:      trusted.fake.URL(), Transport: trusted.fake.Transport()})
	if err != nil {
		t.Fatal(err)
	}
	trusted.fake.SetTrade("WX-T-1", querytest.Trade{State: "NOTPAY", Amount: 100})
	if a := mustAnswer(t, q, "WX-T-1"); a.State != query.Pending {
		t.Fatalf("trusted: %+v", a)
	}
}

// The configuration is checked: the base URL is scheme and host only (the
// request signature covers the path), and the keys are there.
func TestWeChatConfig(t *testing.T) {
	k := keys()
	good := query.WeChatConfig{MchID: wxMchID, MerchantKey: k.merchant, MerchantSerial: wxSerial,
		PlatformKeys: map[string]*rsa.PublicKey{k.platform.Serial: &k.platform.PlatformKey.PublicKey}}
	if _, err := query.NewWeChat(good); err != nil {
		t.Fatalf("default base URL: %v", err)
	}
	for name, mod := range map[string]func(*query.WeChatConfig){
		"a path":          func(c *query.WeChatConfig) { c.BaseURL = "https://api.mch.weixin.qq.com/v3" },
		"ftp":             func(c *query.WeChatConfig) { c.BaseURL = "ftp://api.mch.weixin.qq.com" },
		"no mchid":        func(c *query.WeChatConfig) { c.MchID = "" },
		"no merchant key": func(c *query.WeChatConfig) { c.MerchantKey = nil },
		"no platform key": func(c *query.WeChatConfig) { c.PlatformKeys = nil },
		"a nil key":       func(c *query.WeChatConfig) { c.PlatformKeys = map[string]*rsa.PublicKey{"X": nil} },
	} {
		c := good
		mod(&c)
		if _, err := query.NewWeChat(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	e := newWeChat(t, false, nil)
	for _, bad := range []string{"", "has space", strings.Repeat("x", 65)} {
		if _, err := queryNow(t, e.q, bad); err == nil {
			t.Errorf("order number %q: accepted", bad)
		}
	}
	if n := e.fake.Requests(); n != 0 {
		t.Errorf("bad order numbers reached the channel: %d requests", n)
	}
}
