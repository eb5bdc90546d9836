package query_test

import (
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-pay/gopay/alipay"

	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/channel/channeltest"
	"github.com/notifyedge/notifyedge/edge/reconcile/query"
	"github.com/notifyedge/notifyedge/edge/reconcile/query/querytest"
)

const (
	aliAppID    = "2021000000000001"
	aliSellerID = "2088000000000001"
)

// aliEnv is an Alipay fake, a querier pointed at it and the callback
// adapter configured with the same keys, app and seller.
type aliEnv struct {
	fake *querytest.AlipayFake
	q    *query.Alipay
	ch   *channel.Alipay
}

// pkcs1Base64 is key in the form Alipay's key tool hands out.
func pkcs1Base64(k *rsa.PrivateKey) string {
	return base64.StdEncoding.EncodeToString(x509.MarshalPKCS1PrivateKey(k))
}

// newAlipay starts a fake signing with the Alipay key and a querier holding
// it; mod changes the querier's configuration.
func newAlipay(t *testing.T, tls bool, mod func(*query.AlipayConfig)) aliEnv {
	t.Helper()
	k := keys()
	fake := querytest.NewAlipayFake(querytest.AlipayFakeConfig{AppID: aliAppID, AppKey: &k.app.PublicKey, Alipay: k.alipay, TLS: tls})
	t.Cleanup(fake.Close)
	cfg := query.AlipayConfig{AppID: aliAppID, AppPrivateKey: pkcs1Base64(k.app),
		PublicKeys: []*rsa.PublicKey{&k.alipay.Key.PublicKey}, SellerID: aliSellerID,
		BaseURL: fake.GatewayURL(), Timeout: 10 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	q, err := query.NewAlipay(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := channel.NewAlipay(channel.AlipayConfig{Name: "ali", PublicKeys: []*rsa.PublicKey{&k.alipay.Key.PublicKey},
		AppIDs: []string{aliAppID}, SellerID: aliSellerID})
	if err != nil {
		t.Fatal(err)
	}
	return aliEnv{fake: fake, q: q, ch: ch}
}

// Every trade_status maps to its state; an unknown trade (a signed 40004
// ACQ.TRADE_NOT_EXIST) is NotFound. Only a paid answer carries a body.
func TestAlipayStates(t *testing.T) {
	e := newAlipay(t, false, nil)
	cases := []stateCase{
		{"TRADE_SUCCESS", query.Paid}, {"TRADE_FINISHED", query.Paid},
		{"WAIT_BUYER_PAY", query.Pending}, {"TRADE_CLOSED", query.Closed},
	}
	for _, c := range cases {
		orderNo := "ALI-STATE-" + c.channelState
		e.fake.SetTrade(orderNo, querytest.Trade{State: c.channelState, TxnID: "2026120322001400000000" + c.channelState[:5], Amount: 1999})
		a := mustAnswer(t, e.q, orderNo)
		if a.State != c.want || a.ChannelState != c.channelState {
			t.Errorf("%s: %s %s, want %s", c.channelState, a.State, a.ChannelState, c.want)
		}
		if (a.Body != nil) != (c.want == query.Paid) {
			t.Errorf("%s: body %q", c.channelState, a.Body)
		}
	}
	a := mustAnswer(t, e.q, "ALI-NEVER-SEEN")
	if a.State != query.NotFound || a.ChannelState != "ACQ.TRADE_NOT_EXIST" || a.Body != nil {
		t.Errorf("unknown trade: %+v", a)
	}
	if n := e.fake.Requests(); n != len(cases)+1 {
		t.Errorf("the fake counted %d requests, want %d", n, len(cases)+1)
	}
	// Closed after it was paid (refunded in full): the answer says when
	// it was paid. Refunded, with the body its review keeps.
	e.fake.SetTrade("ALI-REFUNDED", querytest.Trade{State: "TRADE_CLOSED", WasPaid: true, TxnID: "2026120322001400000000REFND", Amount: 1999})
	a = mustAnswer(t, e.q, "ALI-REFUNDED")
	if a.State != query.Refunded || a.ChannelState != "TRADE_CLOSED" || a.Body == nil {
		t.Fatalf("paid, then closed: %+v", a)
	}
	if d := redrive(t, e.ch, a.Body); string(d.OrderNo) != "ALI-REFUNDED" || d.Amount != 1999 {
		t.Errorf("its body maps to order %s amount %d", d.OrderNo, d.Amount)
	}
}

// Public-key certificate mode: every request carries app_cert_sn and
// alipay_root_cert_sn (gopay computes them from the certificates), and an
// answer that carries alipay_cert_sn verifies. Without the certificates
// the fake refuses the request, as Alipay does.
func TestAlipayCertificateMode(t *testing.T) {
	k := keys()
	certs, err := channeltest.NewAlipayCertificates(&k.app.PublicKey, &k.alipay.Key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	appSN, err := alipay.GetCertSN(certs.App)
	if err != nil {
		t.Fatal(err)
	}
	rootSN, err := alipay.GetRootCertSN(certs.Root)
	if err != nil {
		t.Fatal(err)
	}
	alipaySN, err := alipay.GetCertSN(certs.Alipay)
	if err != nil {
		t.Fatal(err)
	}
	fake := querytest.NewAlipayFake(querytest.AlipayFakeConfig{AppID: aliAppID, AppKey: &k.app.PublicKey, Alipay: k.alipay,
		AppCertSN: appSN, RootCertSN: rootSN, AlipayCertSN: alipaySN})
	t.Cleanup(fake.Close)
	base := query.AlipayConfig{AppID: aliAppID, AppPrivateKey: pkcs1Base64(k.app), PublicKeys: []*rsa.PublicKey{&k.alipay.Key.PublicKey},
		SellerID: aliSellerID, BaseURL: fake.GatewayURL(), Timeout: 10 * time.Second}
	fake.SetTrade("ALI-CERT", querytest.Trade{State: "TRADE_SUCCESS", TxnID: "2026120322001400000000CERT1", Amount: 1999})

	plain, err := query.NewAlipay(base)
	if err != nil {
		t.Fatal(err)
	}
	_, err = queryNow(t, plain, "ALI-CERT")
	wantFailure(t, "no certificates", query.Answer{}, err, "isv.invalid-app-cert-sn")

	withCerts := base
	withCerts.AppCert, withCerts.RootCert, withCerts.AlipayCert = certs.App, certs.Root, certs.Alipay
	q, err := query.NewAlipay(withCerts)
	if err != nil {
		t.Fatal(err)
	}
	if a := mustAnswer(t, q, "ALI-CERT"); a.State != query.Paid {
		t.Fatalf("certificate mode: %+v", a)
	}
	fake.SetBadSignature(true)
	a, err := queryNow(t, q, "ALI-CERT")
	wantUnverified(t, "certificate mode, a forged answer", a, err)

	half := withCerts
	half.RootCert = nil
	if _, err := query.NewAlipay(half); err == nil || !strings.Contains(err.Error(), "root certificate") {
		t.Errorf("an app certificate without the root one: %v", err)
	}
}

// A paid answer's body, re-driven through the callback adapter, has the
// key and digest of the trade's notification; total_amount goes through
// as Alipay wrote it; paid with another amount, it maps to that amount.
func TestAlipayPaidBodyMapsAsTheCallback(t *testing.T) {
	e := newAlipay(t, false, nil)
	k := keys()
	const orderNo, tradeNo = "ALI-PAID-1", "2026120322001400001234567890"
	body, err := k.alipay.Notify(map[string]string{"notify_type": "trade_status_sync", "notify_id": "ac05099524730693a8b330c5ecf72da9786",
		"trade_no": tradeNo, "out_trade_no": orderNo, "trade_status": "TRADE_SUCCESS", "total_amount": "19.99",
		"app_id": aliAppID, "seller_id": aliSellerID, "charset": "utf-8", "gmt_payment": "2026-12-03 10:00:00"})
	if err != nil {
		t.Fatal(err)
	}
	var cb channel.Delivery
	if rej := e.ch.Parse(&channel.Request{Channel: []byte("ali"), ContentType: []byte("application/x-www-form-urlencoded"), Body: body}, &cb); rej != nil {
		t.Fatal(rej)
	}
	paidAt := time.Date(2026, 12, 3, 10, 0, 0, 0, time.FixedZone("CST", 8*3600))
	for _, status := range []string{"TRADE_SUCCESS", "TRADE_FINISHED"} {
		e.fake.SetTrade(orderNo, querytest.Trade{State: status, TxnID: tradeNo, Amount: 1999, PaidAt: paidAt})
		a := mustAnswer(t, e.q, orderNo)
		form, err := url.ParseQuery(string(a.Body))
		if err != nil || form.Get("notify_type") != "trade_query" || form.Get("total_amount") != "19.99" ||
			form.Get("app_id") != aliAppID || form.Get("seller_id") != aliSellerID || form.Get("gmt_payment") != "2026-12-03 10:00:00" {
			t.Fatalf("%s: body %s", status, a.Body)
		}
		d := redrive(t, e.ch, a.Body)
		if string(d.Key) != string(cb.Key) || d.Digest != cb.Digest {
			t.Fatalf("%s: queried %s %s, callback %s %s", status, d.Key, d.Digest[:12], cb.Key, cb.Digest[:12])
		}
	}
	e.fake.SetTrade(orderNo, querytest.Trade{State: "TRADE_SUCCESS", TxnID: tradeNo, AmountText: "19.9"})
	a := mustAnswer(t, e.q, orderNo)
	if got := mustForm(t, a.Body).Get("total_amount"); got != "19.9" {
		t.Fatalf("total_amount %q, want it as Alipay wrote it", got)
	}
	if d := redrive(t, e.ch, a.Body); d.Amount != 1990 || d.Digest == cb.Digest || string(d.Key) != string(cb.Key) {
		t.Fatalf("paid 19.9: amount %d, digest same as the callback's: %v", d.Amount, d.Digest == cb.Digest)
	}
}

func mustForm(t *testing.T, body []byte) url.Values {
	t.Helper()
	form, err := url.ParseQuery(string(body))
	if err != nil {
		t.Fatal(err)
	}
	return form
}

// The answers are verified with gopay's VerifySyncSign: a flipped sign
// byte, a key the querier does not hold and a key past its NotAfter are
// ErrUnverified, and so is a "no such trade" with a broken sign (gopay
// neither extracts nor verifies an answer whose code is not 10000). During
// a rotation either key verifies.
func TestAlipayUnverified(t *testing.T) {
	k := keys()
	e := newAlipay(t, false, nil)
	e.fake.SetTrade("ALI-V-1", querytest.Trade{State: "TRADE_SUCCESS", TxnID: "2026120322001400000001", Amount: 100})
	mustAnswer(t, e.q, "ALI-V-1")

	e.fake.SetBadSignature(true)
	a, err := queryNow(t, e.q, "ALI-V-1")
	wantUnverified(t, "paid, flipped sign", a, err)
	a, err = queryNow(t, e.q, "ALI-V-UNKNOWN")
	wantUnverified(t, "ACQ.TRADE_NOT_EXIST, flipped sign", a, err)
	e.fake.SetBadSignature(false)

	e.fake.SetSigner(k.alipay2)
	a, err = queryNow(t, e.q, "ALI-V-1")
	wantUnverified(t, "signed by an unknown key", a, err)
	a, err = queryNow(t, e.q, "ALI-V-UNKNOWN")
	wantUnverified(t, "ACQ.TRADE_NOT_EXIST signed by an unknown key", a, err)

	rot := newAlipay(t, false, func(c *query.AlipayConfig) {
		c.PublicKeys = append(c.PublicKeys, &k.alipay2.Key.PublicKey)
		c.NotAfter = []time.Time{time.Now().Add(-time.Hour)}
	})
	rot.fake.SetTrade("ALI-V-2", querytest.Trade{State: "WAIT_BUYER_PAY", TxnID: "2026120322001400000002", Amount: 100})
	a, err = queryNow(t, rot.q, "ALI-V-2")
	wantUnverified(t, "signed by an expired key", a, err)
	rot.fake.SetSigner(k.alipay2)
	if a := mustAnswer(t, rot.q, "ALI-V-2"); a.State != query.Pending {
		t.Fatalf("signed by the new key: %+v", a)
	}
}

// gopay signs each request and the fake checks it as Alipay does: a
// request signed with another app key is refused (40002
// isv.invalid-signature), a failure to ask.
func TestAlipayFakeRefusesAWrongAppSignature(t *testing.T) {
	e := newAlipay(t, false, func(c *query.AlipayConfig) { c.AppPrivateKey = pkcs1Base64(keys().otherApp) })
	e.fake.SetTrade("ALI-M-1", querytest.Trade{State: "TRADE_SUCCESS", TxnID: "2026120322001400000003", Amount: 100})
	a, err := queryNow(t, e.q, "ALI-M-1")
	wantFailure(t, "another app key", a, err, "40002", "isv.invalid-signature")
	if n := e.fake.Requests(); n != 1 {
		t.Fatalf("the fake saw %d requests, want 1", n)
	}
	e = newAlipay(t, false, func(c *query.AlipayConfig) { c.AppID = "2021000000000999" })
	a, err = queryNow(t, e.q, "ALI-M-1")
	wantFailure(t, "another app id", a, err, "isv.invalid-app-id")
}

// The app key may come in any of the four forms; gopay signs with it and
// the fake's check of the request passes.
func TestAlipayAppKeyForms(t *testing.T) {
	k := keys().app
	p8, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	p1 := x509.MarshalPKCS1PrivateKey(k)
	for name, text := range map[string]string{
		"PKCS#1 PEM":    string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: p1})),
		"PKCS#8 PEM":    string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8})),
		"PKCS#1 base64": base64.StdEncoding.EncodeToString(p1),
		"PKCS#8 base64": base64.StdEncoding.EncodeToString(p8),
	} {
		e := newAlipay(t, false, func(c *query.AlipayConfig) { c.AppPrivateKey = text })
		e.fake.SetTrade("ALI-K-1", querytest.Trade{State: "WAIT_BUYER_PAY", TxnID: "2026120322001400000004", Amount: 100})
		a, err := queryNow(t, e.q, "ALI-K-1")
		if err != nil || a.State != query.Pending {
			t.Errorf("%s: %+v %v", name, a, err)
		}
	}
}

// A verified answer about another order, or with a status nobody knows,
// is not taken.
func TestAlipayAnswerForSomethingElse(t *testing.T) {
	e := newAlipay(t, false, nil)
	e.fake.SetTrade("ALI-O-1", querytest.Trade{State: "TRADE_SUCCESS", TxnID: "2026120322001400000005", Amount: 100, OutTradeNo: "ALI-O-2"})
	a, err := queryNow(t, e.q, "ALI-O-1")
	wantFailure(t, "another order", a, err, "another order")
	e.fake.SetTrade("ALI-O-1", querytest.Trade{State: "TRADE_SOMETHING", TxnID: "2026120322001400000005", Amount: 100})
	a, err = queryNow(t, e.q, "ALI-O-1")
	wantFailure(t, "an unknown trade_status", a, err, "TRADE_SOMETHING")
}

// A channel that is down, drops the connection or never answers is an
// error, returned within the query's timeout.
func TestAlipayDown(t *testing.T) {
	const timeout = 400 * time.Millisecond
	e := newAlipay(t, false, func(c *query.AlipayConfig) { c.Timeout = timeout })
	e.fake.SetTrade("ALI-D-1", querytest.Trade{State: "TRADE_SUCCESS", TxnID: "2026120322001400000006", Amount: 100})
	e.fake.SetDown(true)
	a, err := queryNow(t, e.q, "ALI-D-1")
	wantFailure(t, "down", a, err, "503")
	e.fake.SetDown(false)
	e.fake.SetDrop(true)
	a, err = queryNow(t, e.q, "ALI-D-1")
	wantFailure(t, "dropped", a, err)
	e.fake.SetDrop(false)
	e.fake.SetStall(true)
	start := time.Now()
	a, err = queryNow(t, e.q, "ALI-D-1")
	wantFailure(t, "stalled", a, err)
	if took := time.Since(start); took > timeout+3*time.Second {
		t.Fatalf("a stalled query took %v, timeout %v", took, timeout)
	}
	e.fake.SetStall(false)
	if a := mustAnswer(t, e.q, "ALI-D-1"); a.State != query.Paid {
		t.Fatalf("back up: %+v", a)
	}
}

// gopay's own HTTP client skips TLS verification; the querier's does not:
// a self-signed gateway is refused unless the transport trusts it.
func TestAlipayVerifiesTLS(t *testing.T) {
	e := newAlipay(t, true, nil)
	e.fake.SetTrade("ALI-T-1", querytest.Trade{State: "WAIT_BUYER_PAY", TxnID: "2026120322001400000007", Amount: 100})
	a, err := queryNow(t, e.q, "ALI-T-1")
	wantFailure(t, "self-signed", a, err, "certificate")
	trusted := newAlipay(t, true, nil)
	trusted.fake.SetTrade("ALI-T-1", querytest.Trade{State: "WAIT_BUYER_PAY", TxnID: "2026120322001400000007", Amount: 100})
	q, err := query.NewAlipay(query.AlipayConfig{AppID: aliAppID, AppPrivateKey: pkcs1Base64(keys().app),
		PublicKeys: []*rsa.PublicKey{&keys().alipay.Key.PublicKey}, BaseURL: trusted.fake.GatewayURL(),
		Transport: trusted.fake.Transport()})
	if err != nil {
		t.Fatal(err)
	}
	if a := mustAnswer(t, q, "ALI-T-1"); a.State != query.Pending {
		t.Fatalf("trusted: %+v", a)
	}
}

// No key material reaches an error: gopay quotes a key it cannot parse in
// its error (which is why the querier parses the key first and never
// passes gopay's construction error on), the querier does not.
func TestAlipayKeyNeverInAnError(t *testing.T) {
	secret := "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKjMzEfYyjiWA4R4"
	if _, err := alipay.NewClient(aliAppID, secret, true); err == nil || !strings.Contains(err.Error(), secret[:40]) {
		t.Logf("gopay no longer quotes the key it refuses: %v", err)
	}
	_, err := query.NewAlipay(query.AlipayConfig{AppID: aliAppID, AppPrivateKey: secret,
		PublicKeys: []*rsa.PublicKey{&keys().alipay.Key.PublicKey}})
	if err == nil {
		t.Fatal("a broken key was accepted")
	}
	if keyBytesIn(err.Error(), secret) {
		t.Fatalf("the error quotes the key: %v", err)
	}
}
