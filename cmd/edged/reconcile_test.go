package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-pay/gopay/alipay"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge/channel/channeltest"
	"github.com/notifyedge/notifyedge/edge/edgetest"
	"github.com/notifyedge/notifyedge/edge/reconcile/query/querytest"
)

const (
	rcMchID    = "1900000109"
	rcAppID    = "wx8888888888888888"
	rcSerial   = "5157F09EFDC096DE15EBE81A47057A7232F1B8E1"
	rcAliApp   = "2021000000000001"
	rcSeller   = "2088000000000001"
	rcOrders   = "orders-token"
	rcRate     = 8
	rcAmount   = 1999
	rcAmountYu = "19.99"
)

// reconcileRig is a database, loopback fakes of both channels' query APIs
// and the environment of an edged node that asks them: WeChat Pay as "wx",
// Alipay as "ali", both with query credentials.
type reconcileRig struct {
	dbURL   string
	db      *pgxpool.Pool
	wx      *channeltest.WeChatPaySigner
	ali     *channeltest.AlipaySigner
	wxFake  *querytest.WeChatFake
	aliFake *querytest.AlipayFake
	env     []string
}

func newReconcileRig(t *testing.T) *reconcileRig {
	t.Helper()
	wx, err := channeltest.NewWeChatPaySigner()
	if err != nil {
		t.Fatal(err)
	}
	ali, err := channeltest.NewAlipaySigner()
	if err != nil {
		t.Fatal(err)
	}
	merchant, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	app, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	r := &reconcileRig{dbURL: durabletest.NewDatabase(t), wx: wx, ali: ali}
	r.wxFake = querytest.NewWeChatFake(querytest.WeChatFakeConfig{MchID: rcMchID, MerchantKey: &merchant.PublicKey,
		MerchantSerial: rcSerial, Platform: wx, AppID: rcAppID})
	t.Cleanup(r.wxFake.Close)
	r.aliFake = querytest.NewAlipayFake(querytest.AlipayFakeConfig{AppID: rcAliApp, AppKey: &app.PublicKey, Alipay: ali})
	t.Cleanup(r.aliFake.Close)
	if r.db, err = pgxpool.New(context.Background(), r.dbURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.db.Close)
	pkcs8, err := x509.MarshalPKCS8PrivateKey(merchant)
	if err != nil {
		t.Fatal(err)
	}
	r.env = []string{"DATABASE_URL=" + r.dbURL, "EDGE_ORDERS_TOKEN=" + rcOrders,
		"EDGE_RECONCILE_RATE=" + strconv.Itoa(rcRate),
		"EDGE_SECRET_WX=" + wx.APIv3Key, "EDGE_CHANNEL_WX_KIND=wechatpay",
		"EDGE_CHANNEL_WX_PLATFORM_KEYS=" + wx.Serial + "=" + wx.PublicKeyBase64(),
		"EDGE_CHANNEL_WX_MCHID=" + rcMchID, "EDGE_CHANNEL_WX_APPID=" + rcAppID,
		"EDGE_CHANNEL_WX_MERCHANT_KEY=" + string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})),
		"EDGE_CHANNEL_WX_MERCHANT_SERIAL=" + rcSerial, "EDGE_CHANNEL_WX_API_URL=" + r.wxFake.URL(),
		"EDGE_SECRET_ALI=" + ali.PublicKeyBase64(), "EDGE_CHANNEL_ALI_KIND=alipay",
		"EDGE_CHANNEL_ALI_APP_ID=" + rcAliApp, "EDGE_CHANNEL_ALI_SELLER_ID=" + rcSeller,
		"EDGE_CHANNEL_ALI_APP_PRIVATE_KEY=" + base64.StdEncoding.EncodeToString(x509.MarshalPKCS1PrivateKey(app)),
		"EDGE_CHANNEL_ALI_API_URL=" + r.aliFake.GatewayURL(),
	}
	return r
}

// startNode runs edged on loopback ports with args (beside the listeners
// and a 2 s budget) and env, its JSON log going to logs; it stops with
// the test.
func startNode(t *testing.T, args, env []string, logs io.Writer) *Main {
	t.Helper()
	cfg, err := ParseConfig(append([]string{"-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-budget", "2s"}, args...), env)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DrainDelay = 0
	m := NewMain(cfg)
	m.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// node starts an edged node on the rig's database with args; its JSON log
// goes to the returned sink.
func (r *reconcileRig) node(t *testing.T, args ...string) (*Main, *edgetest.Log) {
	t.Helper()
	log := &edgetest.Log{}
	return startNode(t, args, r.env, log), log
}

// adminDo sends a request with the bearer token to the admin listener and
// returns the status and body (0 after a transport error, which fails the
// test from any goroutine).
func adminDo(t *testing.T, token, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	req.Header.Set("Authorization", "Bearer "+token)
	return send(t, req)
}

// putOrder registers order no for amount fen, paid through ch ("" for
// any channel).
func putOrder(t *testing.T, admin, no, ch string) {
	t.Helper()
	body := fmt.Sprintf(`{"amount":%d,"currency":"CNY"}`, rcAmount)
	if ch != "" {
		body = fmt.Sprintf(`{"amount":%d,"currency":"CNY","channel":%q}`, rcAmount, ch)
	}
	if code, b := adminDo(t, rcOrders, "PUT", "http://"+admin+"/orders/"+no, body); code != 201 {
		t.Fatalf("PUT %s: %d %s", no, code, b)
	}
}

// wxCallback delivers WeChat Pay's payment notification of order no by
// trade txn (total fen, as the fake answers it) to node addr.
func (r *reconcileRig) wxCallback(t *testing.T, addr, no, txn string, total int64) (int, string) {
	t.Helper()
	h, body, err := r.wx.Notify("TRANSACTION.SUCCESS", map[string]any{"mchid": rcMchID, "appid": rcAppID,
		"out_trade_no": no, "transaction_id": txn, "trade_type": "JSAPI", "trade_state": "SUCCESS",
		"amount": map[string]any{"total": total, "payer_total": total, "currency": "CNY", "payer_currency": "CNY"}}, time.Now())
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	req, _ := http.NewRequest("POST", "http://"+addr+"/notify/wx", bytes.NewReader(body))
	for k, v := range h {
		req.Header.Set(k, v)
	}
	return send(t, req)
}

// aliCallback delivers Alipay's TRADE_SUCCESS of order no by trade
// tradeNo to node addr.
func (r *reconcileRig) aliCallback(t *testing.T, addr, no, tradeNo string) (int, string) {
	t.Helper()
	body, err := r.ali.Notify(map[string]string{"notify_time": "2026-12-04 10:34:56", "notify_type": "trade_status_sync",
		"notify_id": "ac05099524730693a8b330c5ecf72da9786", "app_id": rcAliApp, "charset": "utf-8", "version": "1.0",
		"trade_no": tradeNo, "out_trade_no": no, "seller_id": rcSeller, "trade_status": "TRADE_SUCCESS",
		"total_amount": rcAmountYu, "receipt_amount": rcAmountYu, "gmt_payment": "2026-12-04 10:34:55"})
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	req, _ := http.NewRequest("POST", "http://"+addr+"/notify/ali", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return send(t, req)
}

// send sends req and returns the status and body; a transport error fails
// the test (from any goroutine) and returns 0.
func send(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := testClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var reconcileSeries = regexp.MustCompile(`(?m)^notifyedge_reconcile_total\{channel="([a-z]+)",result="([a-z_]+)"\} ([0-9.e+]+)$`)

// reconcileCounts sums notifyedge_reconcile_total over the nodes, by
// "channel/result".
func reconcileCounts(t *testing.T, admins ...string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, a := range admins {
		for _, m := range reconcileSeries.FindAllStringSubmatch(scrape(t, "http://"+a+"/metrics"), -1) {
			v, err := strconv.ParseFloat(m[3], 64)
			if err != nil {
				t.Fatal(err)
			}
			out[m[1]+"/"+m[2]] += int(v)
		}
	}
	return out
}

// overRate returns the first request of times that came sooner than a
// limiter of rate a second (and a burst of one) started at start, plus
// extra requests from elsewhere, could have sent it, or -1. A request arrives after it was sent, so a delay on
// a loaded machine can only make arrivals later: the bound holds however
// the machine stalls, where a count per window of arrivals would see a
// stall's queue arrive at once.
func overRate(times []time.Time, start time.Time, rate float64, extra int) int {
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	for i, at := range times {
		// The burst, and one for rounding the interval down.
		if float64(i+1) > rate*at.Sub(start).Seconds()+2+float64(extra) {
			return i
		}
	}
	return -1
}

// Two edged nodes ask both channels about the orders nobody called back
// for: every order paid at the channel ends PAID once (one ORDER_PAID), the
// others are left as they are, a WeChat answer that fails verification and
// an Alipay that is down apply nothing until they recover, the late
// callbacks are replays, and neither channel is asked faster than its
// rate.
func TestReconcileTwoNodes(t *testing.T) {
	r := newReconcileRig(t)
	r.wxFake.SetBadSignature(true)
	r.aliFake.SetDown(true)
	started := time.Now()
	a, logA := r.node(t, "-reconcile-after", "1s")
	b, logB := r.node(t, "-reconcile-after", "1s")

	type order struct {
		no, ch, state, txn string
		amount             int64
		paid               bool
	}
	var orders []order
	for i := range 20 {
		orders = append(orders,
			order{no: fmt.Sprintf("WX-P-%02d", i), ch: "wx", state: "SUCCESS", txn: fmt.Sprintf("42000000002026120400%02d", i), paid: true},
			order{no: fmt.Sprintf("ALI-P-%02d", i), ch: "ali", state: "TRADE_SUCCESS", txn: fmt.Sprintf("20261204220014000000%02d", i), paid: true})
	}
	orders = append(orders,
		// Paid, then refunded at the channel: never applied, a review.
		order{no: "WX-REFUND", ch: "wx", state: "REFUND", txn: "4200000000202612049991"},
		order{no: "WX-NOTPAY", ch: "wx", state: "NOTPAY"},
		order{no: "WX-CLOSED", ch: "wx", state: "CLOSED"},
		order{no: "WX-AMOUNT", ch: "wx", state: "SUCCESS", txn: "4200000000202612049992", amount: 1000},
		order{no: "WX-UNKNOWN", ch: "wx"},
		order{no: "ALI-FINISHED", ch: "ali", state: "TRADE_FINISHED", txn: "2026120422001400009993", paid: true},
		order{no: "ALI-WAIT", ch: "ali", state: "WAIT_BUYER_PAY"},
		order{no: "ALI-CLOSED", ch: "ali", state: "TRADE_CLOSED"},
		order{no: "ALI-UNKNOWN", ch: "ali"},
		// No channel named: asked of both, paid at Alipay.
		order{no: "ANY-PAID", state: "TRADE_SUCCESS", txn: "2026120422001400009994", paid: true},
	)
	for _, o := range orders {
		if o.state != "" {
			amount := cmp.Or(o.amount, rcAmount)
			trade := querytest.Trade{State: o.state, TxnID: o.txn, Amount: amount, Currency: "CNY"}
			if o.ch == "wx" {
				r.wxFake.SetTrade(o.no, trade)
			} else {
				r.aliFake.SetTrade(o.no, trade)
			}
		}
		putOrder(t, a.AdminAddr(), o.no, o.ch)
	}

	// Both channels fail at first: errors counted, nothing applied.
	wait.For(t, "failed queries of both channels", func() (bool, string) {
		c := reconcileCounts(t, a.AdminAddr(), b.AdminAddr())
		return c["wx/error"] >= 3 && c["ali/error"] >= 3, fmt.Sprint(c)
	})
	var moved int
	if err := r.db.QueryRow(context.Background(), `SELECT count(*) FROM biz_order WHERE status <> 'PENDING_PAY'`).Scan(&moved); err != nil {
		t.Fatal(err)
	}
	if moved != 0 {
		t.Fatalf("%d orders moved on unverified or missing answers", moved)
	}
	for _, l := range []string{logA.String(), logB.String()} {
		if strings.Contains(l, "PRIVATE KEY") || strings.Contains(l, r.wx.APIv3Key) {
			t.Fatal("key material in the log")
		}
	}
	// Asked by hand meanwhile, on the node that asks (its rate limit is
	// the one the fakes see): 502, nothing applied; an unknown order 404.
	leader := a
	if strings.Contains(logB.String(), `"state":"leader"`) {
		leader = b
	}
	if code, body := adminDo(t, rcOrders, "POST", "http://"+leader.AdminAddr()+"/orders/WX-P-00/reconcile", ""); code != 502 ||
		strings.Contains(body, "PRIVATE") {
		t.Errorf("asked while the answers fail verification: %d %s, want 502", code, body)
	} else {
		// One line an operator reads: the channel, the reason, nothing of
		// the SDK's internals, no phrase twice.
		var e struct{ Message string }
		json.Unmarshal([]byte(body), &e)
		t.Logf("the 502's message: %s", e.Message)
		for _, want := range []string{"channel wx", "failed verification", "signature does not verify"} {
			if !strings.Contains(e.Message, want) {
				t.Errorf("the 502's message lacks %q: %q", want, e.Message)
			}
		}
		for _, bad := range []string{"\n", "request-id", "Wechatpay-Signature", "admin:", "reconcile:"} {
			if strings.Contains(e.Message, bad) {
				t.Errorf("the 502's message holds %q: %q", bad, e.Message)
			}
		}
		if strings.Count(e.Message, "failed verification") != 1 {
			t.Errorf("the 502's message repeats itself: %q", e.Message)
		}
	}
	if code, body := adminDo(t, rcOrders, "POST", "http://"+b.AdminAddr()+"/orders/NO-SUCH/reconcile", ""); code != 404 {
		t.Errorf("an unknown order: %d %s, want 404", code, body)
	}
	r.wxFake.SetBadSignature(false)
	r.aliFake.SetDown(false)

	paid := 0
	for _, o := range orders {
		if o.paid {
			paid++
		}
	}
	wait.For(t, "every order paid at the channel PAID", func() (bool, string) {
		var n int
		if err := r.db.QueryRow(context.Background(), `SELECT count(*) FROM biz_order WHERE status = 'PAID'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		c := reconcileCounts(t, a.AdminAddr(), b.AdminAddr())
		return n == paid && c["wx/closed"] == 1 && c["ali/closed"] == 1 && c["wx/skipped"] == 1 && c["wx/refunded"] == 1,
			fmt.Sprintf("%d of %d PAID; %v", n, paid, c)
	})

	// A payment applied from a channel's answer says so in its event.
	var via string
	if err := r.db.QueryRow(context.Background(), `SELECT payload->>'via' FROM outbox WHERE order_no = 'WX-P-00' AND topic = 'ORDER_PAID'`).Scan(&via); err != nil || via != "query" {
		t.Errorf("the event of a payment applied by query says via %q (%v), want query", via, err)
	}

	// Asked by hand, an order not paid yet: the answer names its state too.
	if code, body := adminDo(t, rcOrders, "POST", "http://"+leader.AdminAddr()+"/orders/WX-NOTPAY/reconcile", ""); code != 200 ||
		!strings.Contains(body, `"state":"pending"`) || !strings.Contains(body, `"status":"PENDING_PAY"`) {
		t.Errorf("asked by hand while pending: %d %s, want 200 with the order's status", code, body)
	}

	// The late callbacks, on node B: replays, never a second effect.
	lateWx, lateAli := 0, 0
	for _, o := range orders {
		if !o.paid {
			continue
		}
		var code int
		if o.ch == "wx" {
			code, _ = r.wxCallback(t, b.Addr(), o.no, o.txn, rcAmount)
			lateWx++
		} else {
			code, _ = r.aliCallback(t, b.Addr(), o.no, o.txn)
			lateAli++
		}
		if code != 200 {
			t.Errorf("late callback of %s: %d", o.no, code)
		}
	}
	page := scrape(t, "http://"+b.AdminAddr()+"/metrics")
	if metricValue(t, page, "notifyedge_reconcile_due") != 0 || !strings.Contains(page, "\nnotifyedge_reconcile_oldest_due_seconds 0\n") {
		t.Errorf("due orders left, or the gauges missing:\n%s", grepLines(page, "reconcile_"))
	}
	for ch, late := range map[string]int{"wx": lateWx, "ali": lateAli} {
		replayed := metricValue(t, page, `notifyedge_requests_total{channel="`+ch+`",outcome="replayed_db"}`)
		if replayed != float64(late) {
			t.Errorf("%s: %v of %d late callbacks replayed:\n%s", ch, replayed, late, grepLines(page, "requests_total"))
		}
	}

	ctx := context.Background()
	want := map[string]string{}
	for _, o := range orders {
		want[o.no] = "PENDING_PAY"
		if o.paid {
			want[o.no] = "PAID"
		}
	}
	rows, err := r.db.Query(ctx, `SELECT o.order_no, o.status, count(x.id) FILTER (WHERE x.topic = 'ORDER_PAID'), count(x.id)
		FROM biz_order o LEFT JOIN outbox x ON x.order_no = o.order_no GROUP BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var no, status string
		var paidRows, all int
		if err := rows.Scan(&no, &status, &paidRows, &all); err != nil {
			t.Fatal(err)
		}
		wantPaid := 0
		if want[no] == "PAID" {
			wantPaid = 1
		}
		if status != want[no] || paidRows != wantPaid || all != wantPaid {
			t.Errorf("%s: %s with %d ORDER_PAID of %d outbox rows; want %s with %d", no, status, paidRows, all, want[no], wantPaid)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var reasons []string
	if err := r.db.QueryRow(ctx, `SELECT coalesce(array_agg(order_no || ' ' || reason ORDER BY order_no), '{}') FROM notify_review`).Scan(&reasons); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(reasons, []string{"WX-AMOUNT AMOUNT_MISMATCH", "WX-REFUND REFUNDED_AT_CHANNEL"}) {
		t.Errorf("review rows %v, want the amount mismatch and the trade refunded at the channel", reasons)
	}
	if err := durabletest.Invariants(ctx, r.db, "", nil); err != nil {
		t.Error(err)
	}

	c := reconcileCounts(t, a.AdminAddr(), b.AdminAddr())
	if c["wx/applied"] != 20 || c["ali/applied"] != 22 {
		t.Errorf("applied wx %d, ali %d; want 20 and 22: %v", c["wx/applied"], c["ali/applied"], c)
	}
	for _, l := range []string{"wx/pending", "ali/pending", "wx/not_found", "ali/not_found"} {
		if c[l] < 1 {
			t.Errorf("no %s counted: %v", l, c)
		}
	}
	// Each applied payment is a lost callback: one WARN line names it.
	logs := logA.String() + logB.String()
	for _, o := range orders {
		line := regexp.MustCompile(`"level":"WARN","msg":"reconcile: payment applied from the channel's answer: its callbacks were lost","channel":"[a-z]+","order_no":"` + o.no + `"`)
		if n := len(line.FindAllString(logs, -1)); (n == 1) != o.paid {
			t.Errorf("%s: %d WARN lines of a payment applied by query", o.no, n)
		}
	}
	if la, lb := strings.Contains(logA.String(), `"state":"leader"`), strings.Contains(logB.String(), `"state":"leader"`); la == lb {
		t.Errorf("leader on node A %v, on node B %v: want exactly one", la, lb)
	}
	// The background's rate, and the two orders of wx asked by hand (a
	// budget of their own).
	manual := map[string]int{"wx": 2}
	for name, times := range map[string][]time.Time{"wx": r.wxFake.RequestTimes(), "ali": r.aliFake.RequestTimes()} {
		if i := overRate(times, started, rcRate, manual[name]); i >= 0 {
			t.Errorf("%s: query %d arrived %v after the nodes started, limit %d a second", name, i+1, times[i].Sub(started).Round(time.Millisecond), rcRate)
		}
	}
}

// The query's decision and the callback of the same trade at the same
// moment, on two nodes: both are held inside their transactions on the
// order's row lock, then let go together. Whichever reached the claim
// first applies, the other replays; one ORDER_PAID per order, each way
// round, on both channels.
func TestReconcileRacesCallback(t *testing.T) {
	r := newReconcileRig(t)
	a, _ := r.node(t, "-reconcile=false")
	b, _ := r.node(t, "-reconcile=false")
	const n = 12
	for i := range n {
		no, txn := fmt.Sprintf("RACE-%02d", i), fmt.Sprintf("42000000002026120470%02d", i)
		if i%2 == 0 {
			r.wxFake.SetTrade(no, querytest.Trade{State: "SUCCESS", TxnID: txn, Amount: rcAmount})
			putOrder(t, a.AdminAddr(), no, "wx")
		} else {
			r.aliFake.SetTrade(no, querytest.Trade{State: "TRADE_SUCCESS", TxnID: txn, Amount: rcAmount})
			putOrder(t, a.AdminAddr(), no, "ali")
		}
	}
	for i := range n {
		no, txn := fmt.Sprintf("RACE-%02d", i), fmt.Sprintf("42000000002026120470%02d", i)
		queryFirst := i%4 < 2
		var asked, called string
		ask := func() {
			code, body := adminDo(t, rcOrders, "POST", "http://"+a.AdminAddr()+"/orders/"+no+"/reconcile", "")
			asked = strconv.Itoa(code) + " " + body
		}
		call := func() {
			var code int
			if i%2 == 0 {
				code, _ = r.wxCallback(t, b.Addr(), no, txn, rcAmount)
			} else {
				code, _ = r.aliCallback(t, b.Addr(), no, txn)
			}
			called = strconv.Itoa(code)
		}
		first, second := call, ask
		if queryFirst {
			first, second = ask, call
		}
		release := durabletest.LockOrder(t, r.db, no)
		var wg sync.WaitGroup
		wg.Go(first)
		durabletest.WaitLockWaiters(t, r.db, 1, "%")
		wg.Go(second)
		durabletest.WaitLockWaiters(t, r.db, 2, "%")
		release()
		wg.Wait()

		var ans struct{ Channel, State, Outcome, Status string }
		code, body, _ := strings.Cut(asked, " ")
		if err := json.Unmarshal([]byte(body), &ans); code != "200" || err != nil || ans.State != "paid" || ans.Status != "PAID" {
			t.Errorf("%s: asked: %s", no, asked)
			continue
		}
		if called != "200" {
			t.Errorf("%s: the callback answered %s", no, called)
		}
		if want := map[bool]string{true: "applied", false: "replayed"}[queryFirst]; ans.Outcome != want {
			t.Errorf("%s (query first %v): the query's outcome %q, want %q", no, queryFirst, ans.Outcome, want)
		}
	}
	durabletest.StormPaidOnce(t, r.db, n)
	if err := durabletest.Invariants(context.Background(), r.db, "RACE-", nil); err != nil {
		t.Error(err)
	}
	// Node B decided the callbacks: those that came second were replays.
	page := scrape(t, "http://"+b.AdminAddr()+"/metrics")
	// A node that does not ask (-reconcile=false) reports no backlog: the
	// orders are not waiting for it.
	if strings.Contains(page, "\nnotifyedge_reconcile_due ") {
		t.Errorf("a node with -reconcile=false reports the due orders:\n%s", grepLines(page, "reconcile"))
	}
	for _, ch := range []string{"wx", "ali"} {
		if got := metricValue(t, page, `notifyedge_requests_total{channel="`+ch+`",outcome="replayed_db"}`); got != n/4 {
			t.Errorf("%s: %v callbacks replayed, want %d:\n%s", ch, got, n/4, grepLines(page, "requests_total"))
		}
	}
}

// metricValue is the value of the series named exactly (name and labels)
// on a metrics page, 0 when it is not there.
func metricValue(t *testing.T, page, series string) float64 {
	t.Helper()
	v, _ := edgetest.Value(page, series)
	return v
}

// PUT /orders naming a channel edged does not have is refused, naming the
// ones it has: such an order would never be asked about. Nothing is stored.
func TestPutOrderOfAnUnconfiguredChannel(t *testing.T) {
	r := newReconcileRig(t)
	r.env = append(r.env, "EDGE_SECRET_GEN="+secret)
	a, _ := r.node(t)
	// A channel with no query credentials: asking is a configuration
	// fact (409), not a failure of the channel (502).
	putOrder(t, a.AdminAddr(), "GEN-1", "gen")
	if code, body := adminDo(t, rcOrders, "POST", "http://"+a.AdminAddr()+"/orders/GEN-1/reconcile", ""); code != 409 ||
		!strings.Contains(body, "query credentials") {
		t.Errorf("asking about an order of a channel without query credentials: %d %s, want 409", code, body)
	}
	base := "http://" + a.AdminAddr() + "/orders/X-UNCONF"
	code, body := adminDo(t, rcOrders, "PUT", base, `{"amount":100,"currency":"CNY","channel":"nope"}`)
	if code != 400 || !strings.Contains(body, `nope`) || !strings.Contains(body, "is not configured") ||
		!strings.Contains(body, "ali") || !strings.Contains(body, "wx") || !strings.Contains(body, "gen") {
		t.Errorf("PUT with channel nope: %d %s, want 400 naming the configured channels", code, body)
	}
	if code, body := adminDo(t, rcOrders, "GET", base, ""); code != 404 {
		t.Errorf("after the refused PUT: %d %s, want 404", code, body)
	}
	if code, body := adminDo(t, rcOrders, "PUT", base, `{"amount":100,"currency":"CNY","channel":"wx"}`); code != 201 {
		t.Errorf("PUT with channel wx: %d %s, want 201", code, body)
	}
}

// A close of an order still PENDING_PAY asks its channel first: paid there
// (callbacks lost), the payment is applied and the close refused; paid and
// refunded, refused and held for review; not paid, the close goes on; the
// channel unreachable, 503 with Retry-After and nothing changed, unless the
// body says "unchecked":true. The background never asks here
// (-reconcile=false).
func TestCloseAsksTheChannelFirst(t *testing.T) {
	r := newReconcileRig(t)
	a, _ := r.node(t, "-reconcile", "false")
	base := "http://" + a.AdminAddr() + "/orders/"
	trades := map[string]querytest.Trade{
		"CL-PAID":   {State: "SUCCESS", TxnID: "4200000000202612060001", Amount: rcAmount, Currency: "CNY"},
		"CL-REFUND": {State: "REFUND", TxnID: "4200000000202612060002", Amount: rcAmount, Currency: "CNY"},
		"CL-NOTPAY": {State: "NOTPAY", Amount: rcAmount, Currency: "CNY"},
	}
	for no, tr := range trades {
		r.wxFake.SetTrade(no, tr)
		putOrder(t, a.AdminAddr(), no, "wx")
	}
	putOrder(t, a.AdminAddr(), "CL-DOWN", "ali")
	closeOrder := func(no, body string) (int, string, string) {
		t.Helper()
		req, err := http.NewRequest("POST", base+no+"/events", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+rcOrders)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header.Get("Retry-After")
	}
	status := func(no string) string {
		var s string
		if err := r.db.QueryRow(context.Background(), `SELECT status FROM biz_order WHERE order_no = $1`, no).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if code, body, _ := closeOrder("CL-PAID", `{"event":"CLOSE","request_id":"c1"}`); code != 409 ||
		!strings.Contains(body, `"outcome":"refused"`) || !strings.Contains(body, `"status":"PAID"`) || status("CL-PAID") != "PAID" {
		t.Errorf("close of an order paid at the channel: %d %s, order %s; want 409 refused, PAID", code, body, status("CL-PAID"))
	}
	if code, body, _ := closeOrder("CL-REFUND", `{"event":"CLOSE","request_id":"c2"}`); code != 409 ||
		!strings.Contains(body, "REFUNDED_AT_CHANNEL") || status("CL-REFUND") != "PENDING_PAY" {
		t.Errorf("close of an order paid and refunded at the channel: %d %s, order %s; want 409 refused, still pending", code, body, status("CL-REFUND"))
	}
	if code, body, _ := closeOrder("CL-NOTPAY", `{"event":"CLOSE","request_id":"c3"}`); code != 200 || status("CL-NOTPAY") != "CLOSED" {
		t.Errorf("close of an order not paid at the channel: %d %s, order %s; want 200, CLOSED", code, body, status("CL-NOTPAY"))
	}
	r.aliFake.SetDown(true)
	if code, body, retry := closeOrder("CL-DOWN", `{"event":"CLOSE","request_id":"c4"}`); code != 503 || retry == "" ||
		!strings.HasPrefix(body, `{"outcome":"unavailable","message":`) || !strings.Contains(body, "unchecked") || strings.Contains(body, `"status"`) || status("CL-DOWN") != "PENDING_PAY" {
		t.Errorf("close while the channel is down: %d %s (Retry-After %q), order %s; want 503, nothing changed", code, body, retry, status("CL-DOWN"))
	}
	if code, body, _ := closeOrder("CL-DOWN", `{"event":"CLOSE","request_id":"c4","unchecked":true}`); code != 200 || status("CL-DOWN") != "CLOSED" {
		t.Errorf("unchecked close while the channel is down: %d %s, order %s; want 200, CLOSED", code, body, status("CL-DOWN"))
	}
	// Registered without a channel: every channel is asked; unknown to
	// both, the close goes on.
	r.aliFake.SetDown(false)
	putOrder(t, a.AdminAddr(), "CL-ANY", "")
	if code, body, _ := closeOrder("CL-ANY", `{"event":"CLOSE","request_id":"c5"}`); code != 200 || status("CL-ANY") != "CLOSED" {
		t.Errorf("close of an order no channel knows: %d %s; want 200", code, body)
	}
}

// An Alipay app in public-key certificate mode: the channel's secret is
// Alipay's public key certificate, EDGE_CHANNEL_ALI_APP_CERT and _ROOT_CERT
// the app's and the root's. Callbacks verify with the certificate; queries
// carry app_cert_sn and alipay_root_cert_sn, and their answers (which carry
// alipay_cert_sn) verify: a paid order is applied.
func TestAlipayCertificateModeQueries(t *testing.T) {
	r := newReconcileRig(t)
	app, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := channeltest.NewAlipayCertificates(&app.PublicKey, &r.ali.Key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	appSN, _ := alipay.GetCertSN(certs.App)
	rootSN, _ := alipay.GetRootCertSN(certs.Root)
	aliSN, _ := alipay.GetCertSN(certs.Alipay)
	fake := querytest.NewAlipayFake(querytest.AlipayFakeConfig{AppID: rcAliApp, AppKey: &app.PublicKey, Alipay: r.ali,
		AppCertSN: appSN, RootCertSN: rootSN, AlipayCertSN: aliSN})
	t.Cleanup(fake.Close)
	env := slices.DeleteFunc(slices.Clone(r.env), func(v string) bool {
		return strings.HasPrefix(v, "EDGE_SECRET_ALI=") || strings.HasPrefix(v, "EDGE_CHANNEL_ALI_APP_PRIVATE_KEY=") ||
			strings.HasPrefix(v, "EDGE_CHANNEL_ALI_API_URL=")
	})
	env = append(env, "EDGE_SECRET_ALI="+string(certs.Alipay),
		"EDGE_CHANNEL_ALI_APP_PRIVATE_KEY="+base64.StdEncoding.EncodeToString(x509.MarshalPKCS1PrivateKey(app)),
		"EDGE_CHANNEL_ALI_API_URL="+fake.GatewayURL(),
		"EDGE_CHANNEL_ALI_APP_CERT="+string(certs.App), "EDGE_CHANNEL_ALI_ROOT_CERT="+string(certs.Root))
	a := startNode(t, nil, env, io.Discard)
	putOrder(t, a.AdminAddr(), "ALI-CERT-1", "ali")
	fake.SetTrade("ALI-CERT-1", querytest.Trade{State: "TRADE_SUCCESS", TxnID: "2026120422001400000000CERT1", Amount: rcAmount})
	code, body := adminDo(t, rcOrders, "POST", "http://"+a.AdminAddr()+"/orders/ALI-CERT-1/reconcile", "")
	if code != 200 || !strings.Contains(body, `"outcome":"applied"`) || !strings.Contains(body, `"status":"PAID"`) {
		t.Fatalf("a query in certificate mode: %d %s", code, body)
	}
	// Only one of the two files: refused at start, naming both.
	half := slices.DeleteFunc(slices.Clone(env), func(v string) bool { return strings.HasPrefix(v, "EDGE_CHANNEL_ALI_ROOT_CERT=") })
	cfg, err := ParseConfig([]string{"-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0"}, half)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMain(cfg)
	m.Logger = slog.New(slog.DiscardHandler)
	err = m.Run(context.Background())
	m.Close()
	if err == nil || !strings.Contains(err.Error(), "EDGE_CHANNEL_ALI_ROOT_CERT") {
		t.Errorf("the app certificate without the root one: %v", err)
	}
}
