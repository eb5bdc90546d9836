package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge/reconcile/bill"
	"github.com/notifyedge/notifyedge/edge/reconcile/bill/billtest"
	"github.com/notifyedge/notifyedge/edge/reconcile/query/querytest"
)

// billDay is the previous day in the channels' zone: the day the schedule
// fetches now.
func billDay(t *testing.T) (date string, day time.Time) {
	t.Helper()
	z, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().In(z)
	d := time.Date(now.Year(), now.Month(), now.Day()-1, 0, 0, 0, 0, z)
	return d.Format(time.DateOnly), d
}

// wxRefundCallback delivers WeChat Pay's REFUND.SUCCESS of trade txn,
// refund refundID of amount fen, to node addr.
func (r *reconcileRig) wxRefundCallback(t *testing.T, addr, no, txn, refundID string, amount int64) (int, string) {
	t.Helper()
	h, body, err := r.wx.Notify("REFUND.SUCCESS", map[string]any{"mchid": rcMchID, "out_trade_no": no, "transaction_id": txn,
		"out_refund_no": "R-" + refundID, "refund_id": refundID, "refund_status": "SUCCESS", "success_time": "2026-12-05T10:00:00+08:00",
		"amount": map[string]any{"total": rcAmount, "refund": amount, "payer_total": rcAmount, "payer_refund": amount}}, time.Now())
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

// aliRefundCallback delivers Alipay's refund notification (out_biz_no,
// refund_fee the trade's refunded total) of trade tradeNo to node addr.
func (r *reconcileRig) aliRefundCallback(t *testing.T, addr, no, tradeNo, bizNo, refundFee string) (int, string) {
	t.Helper()
	body, err := r.ali.Notify(map[string]string{"notify_time": "2026-12-05 10:34:56", "notify_type": "trade_status_sync",
		"notify_id": "ac05099524730693a8b330c5ecf72da9787", "app_id": rcAliApp, "charset": "utf-8", "version": "1.0",
		"trade_no": tradeNo, "out_trade_no": no, "seller_id": rcSeller, "trade_status": "TRADE_SUCCESS",
		"total_amount": rcAmountYu, "out_biz_no": bizNo, "refund_fee": refundFee, "gmt_refund": "2026-12-05 10:34:55.000"})
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	req, _ := http.NewRequest("POST", "http://"+addr+"/notify/ali", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return send(t, req)
}

// billRun reads GET /bills/{ch}/{date}; code 404 while there is none.
func billRun(t *testing.T, admin, ch, date string) (int, durable.BillRun) {
	t.Helper()
	code, body := adminDo(t, "admin-token", "GET", "http://"+admin+"/bills/"+ch+"/"+date, "")
	var run durable.BillRun
	if code == 200 {
		if err := json.Unmarshal([]byte(body), &run); err != nil {
			t.Fatalf("GET bill run: %v: %s", err, body)
		}
	}
	return code, run
}

func (r *reconcileRig) scalar(t *testing.T, sql string, args ...any) int {
	t.Helper()
	return durabletest.Count(t, r.db, sql, args...)
}

// TestBillsTwoNodes: two nodes on schedule, exactly one fetches each
// channel's statement of yesterday; a payment and a refund whose callbacks
// were lost are repaired once each, through the same decision and keys
// (the late callbacks are replays), a trade the channel refunded is never
// applied, a ledger entry no statement holds and an amount that differs
// are held for review; running the day again changes nothing.
func TestBillsTwoNodes(t *testing.T) {
	r := newReconcileRig(t)
	r.env = append(r.env, "EDGE_ADMIN_TOKEN=admin-token", "EDGE_BILLS_AT=00:00", "EDGE_BILLS_GIVE_UP=24:00")
	date, day := billDay(t)
	a, _ := r.node(t, "-bills=false") // sets the ledger up; fetches nothing
	ctx := context.Background()

	// The ledger before the statement arrives.
	putOrder(t, a.AdminAddr(), "WX-LOST-PAY", "wx")   // paid at WeChat, every callback lost
	putOrder(t, a.AdminAddr(), "WX-LOST-RF", "wx")    // paid by callback, its refund's callback lost
	putOrder(t, a.AdminAddr(), "WX-REFUNDED", "wx")   // paid and refunded at WeChat, nothing here
	putOrder(t, a.AdminAddr(), "WX-DIFF", "wx")       // paid here for 19.99, the statement says 9.99
	putOrder(t, a.AdminAddr(), "WX-NOBILL", "wx")     // paid here the day before, in no statement
	putOrder(t, a.AdminAddr(), "ALI-LOST-PAY", "ali") // paid at Alipay, every callback lost
	putOrder(t, a.AdminAddr(), "ALI-LOST-RF", "ali")  // paid by callback, its refund's callback lost
	for _, c := range []struct{ no, txn string }{{"WX-LOST-RF", "4200000000202612050002"}, {"WX-DIFF", "4200000000202612050004"},
		{"WX-NOBILL", "4200000000202612050005"}} {
		if code, body := r.wxCallback(t, a.Addr(), c.no, c.txn, rcAmount); code != 200 {
			t.Fatalf("callback %s: %d %s", c.no, code, body)
		}
	}
	if code, body := r.aliCallback(t, a.Addr(), "ALI-LOST-RF", "2026120522001400000007"); code != 200 || body != "success" {
		t.Fatalf("alipay callback: %d %s", code, body)
	}
	if _, err := r.db.Exec(ctx, `UPDATE biz_order SET paid_at = $1 WHERE order_no = 'WX-NOBILL'`, day.Add(-12*time.Hour)); err != nil {
		t.Fatal(err)
	}
	for _, no := range []string{"WX-LOST-RF", "WX-DIFF", "ALI-LOST-RF"} {
		if _, err := r.db.Exec(ctx, `UPDATE biz_order SET paid_at = $1 WHERE order_no = $2`, day.Add(10*time.Hour), no); err != nil {
			t.Fatal(err)
		}
	}

	wxRows := []bill.Row{
		{Kind: bill.Payment, Trade: "4200000000202612050001", OrderNo: "WX-LOST-PAY", Amount: rcAmount, Fee: 12000},
		{Kind: bill.Payment, Trade: "4200000000202612050002", OrderNo: "WX-LOST-RF", Amount: rcAmount, Fee: 12000},
		{Kind: bill.Refund, Trade: "4200000000202612050002", OrderNo: "WX-LOST-RF", RefundID: "50300000000002", Amount: 500, Fee: -3000},
		{Kind: bill.Payment, Trade: "4200000000202612050003", OrderNo: "WX-REFUNDED", Amount: rcAmount, Fee: 12000},
		{Kind: bill.Refund, Trade: "4200000000202612050003", OrderNo: "WX-REFUNDED", RefundID: "50300000000003", Amount: rcAmount, Fee: -12000},
		{Kind: bill.Payment, Trade: "4200000000202612050004", OrderNo: "WX-DIFF", Amount: 999, Fee: 6000},
	}
	aliRows := []bill.Row{
		{Kind: bill.Payment, Trade: "2026120522001400000006", OrderNo: "ALI-LOST-PAY", Amount: rcAmount, Fee: 12000},
		{Kind: bill.Payment, Trade: "2026120522001400000007", OrderNo: "ALI-LOST-RF", Amount: rcAmount, Fee: 12000},
		{Kind: bill.Refund, Trade: "2026120522001400000007", OrderNo: "ALI-LOST-RF", RefundID: "RF-ALI-7", Amount: 700, Fee: -4000},
	}
	// The two days before were compared (without trades): the entries of
	// the day before are judged against three statements.
	for _, back := range []int{2, 1} {
		d := day.AddDate(0, 0, -back).Format(time.DateOnly)
		r.wxFake.SetBill(d, querytest.Bill{Status: "NO_STATEMENT_EXIST"})
		if code, body := adminDo(t, "admin-token", "POST", "http://"+a.AdminAddr()+"/bills/wx/"+d, ""); code != 200 {
			t.Fatalf("POST %s: %d %s", d, code, body)
		}
	}
	r.wxFake.SetBill(date, querytest.Bill{File: billtest.WeChatBill(wxRows, true)})
	r.aliFake.SetBill(date, querytest.Bill{File: billtest.AlipayZip(billtest.AlipayCSV(aliRows, rcSeller, date), rcSeller, date)})

	b, _ := r.node(t)
	c, _ := r.node(t)
	for _, ch := range []string{"wx", "ali"} {
		wait.For(t, "the scheduled run of "+ch, func() (bool, string) {
			code, run := billRun(t, a.AdminAddr(), ch, date)
			return code == 200 && run.State == "ok", fmt.Sprint(code, run.State, run.Message)
		})
	}
	// Exactly one of the two nodes fetched each statement.
	if n, m := r.wxFake.BillAsks(date), r.aliFake.BillAsks(date); n != 1 || m != 1 {
		t.Errorf("statements asked for: wechat %d, alipay %d times; want once each", n, m)
	}

	check := func(round string) {
		t.Helper()
		_, wx := billRun(t, b.AdminAddr(), "wx", date)
		// The first run repairs; run again, the repaired rows match (the
		// run and its items are replaced, nothing is applied twice).
		wantCats := map[string]int{"matched": 1, "channel_only": 4, "amount_mismatch": 1, "ledger_only": 1, "pending": 0}
		want := map[string]string{
			"channel_only payment WX-LOST-PAY": "applied PAID",
			"channel_only refund WX-LOST-RF":   "applied PAID",
			"channel_only payment WX-REFUNDED": "review REFUNDED_AT_CHANNEL",
			// Its payment was never applied: the refund is premature.
			"channel_only refund WX-REFUNDED": "premature PENDING_PAY",
			"amount_mismatch payment WX-DIFF": "review BILL_MISMATCH",
			"ledger_only payment WX-NOBILL":   "review NOT_IN_BILL",
		}
		if round != "first" {
			wantCats["matched"], wantCats["channel_only"] = 3, 2
			delete(want, "channel_only payment WX-LOST-PAY")
			delete(want, "channel_only refund WX-LOST-RF")
		}
		if fmt.Sprint(wx.Categories) != fmt.Sprint(wantCats) {
			t.Errorf("%s: wx categories %v, want %v", round, wx.Categories, wantCats)
		}
		if wx.Bill != (durable.BillSide{Payments: 4, Paid: 3*rcAmount + 999, Refunds: 2, Refunded: 500 + rcAmount, Fees: 27}) {
			t.Errorf("%s: wx bill side %+v", round, wx.Bill)
		}
		actions := map[string]string{}
		for _, it := range wx.Items {
			actions[it.Category+" "+it.Kind+" "+it.OrderNo] = it.Action + " " + it.Detail
		}
		if len(actions) != len(want) {
			t.Errorf("%s: items %v, want %v", round, actions, want)
		}
		for k, v := range want {
			if actions[k] != v {
				t.Errorf("%s: %s: action %q, want %q (all: %v)", round, k, actions[k], v, actions)
			}
		}
		if got := r.scalar(t, `SELECT count(*) FROM outbox WHERE payload->>'via' = 'bill'`); got != 4 {
			t.Errorf("%s: %d events via the bill, want 4 (two payments, two refunds)", round, got)
		}
		if st := r.scalar(t, `SELECT count(*) FROM biz_order WHERE order_no = 'WX-REFUNDED' AND status = 'PENDING_PAY'`); st != 1 {
			t.Errorf("%s: the order the channel refunded moved", round)
		}
		if n := r.scalar(t, `SELECT count(*) FROM notify_review WHERE resolved_at IS NULL AND reason IN ('REFUNDED_AT_CHANNEL', 'BILL_MISMATCH', 'NOT_IN_BILL')`); n != 3 {
			t.Errorf("%s: %d open bill reviews, want 3", round, n)
		}
	}
	check("first")
	if _, body := adminDo(t, "admin-token", "GET", "http://"+b.AdminAddr()+"/bills/wx/"+date, ""); testing.Verbose() {
		t.Logf("GET /bills/wx/%s:\n%s", date, body)
	}
	if got := r.scalar(t, `SELECT refunded_amount FROM biz_order WHERE order_no = 'ALI-LOST-RF'`); got != 700 {
		t.Errorf("ALI-LOST-RF refunded %d, want 700", got)
	}
	if got := r.scalar(t, `SELECT count(*) FROM biz_order WHERE order_no IN ('WX-LOST-PAY', 'ALI-LOST-PAY') AND status = 'PAID'`); got != 2 {
		t.Errorf("%d lost payments applied, want 2", got)
	}

	// The late callbacks are replays: nothing moves again.
	for _, c := range []func() (int, string){
		func() (int, string) {
			return r.wxCallback(t, b.Addr(), "WX-LOST-PAY", "4200000000202612050001", rcAmount)
		},
		func() (int, string) {
			return r.wxRefundCallback(t, b.Addr(), "WX-LOST-RF", "4200000000202612050002", "50300000000002", 500)
		},
		func() (int, string) { return r.aliCallback(t, b.Addr(), "ALI-LOST-PAY", "2026120522001400000006") },
		func() (int, string) {
			return r.aliRefundCallback(t, b.Addr(), "ALI-LOST-RF", "2026120522001400000007", "RF-ALI-7", "7.00")
		},
	} {
		if code, body := c(); code != 200 {
			t.Errorf("a late callback: %d %s, want a replay's 200", code, body)
		}
	}
	if n := r.scalar(t, `SELECT count(*) FROM notify_review WHERE reason = 'PAYLOAD_CONFLICT'`); n != 0 {
		t.Errorf("%d conflicts: a late callback's digest differs from the repair's", n)
	}

	// Running the day again, by hand, changes nothing twice.
	code, body := adminDo(t, "admin-token", "POST", "http://"+c.AdminAddr()+"/bills/wx/"+date, "")
	if code != 200 || !strings.Contains(body, `"state":"ok"`) {
		t.Fatalf("POST the day again: %d %s", code, body)
	}
	check("again")
	if got := r.scalar(t, `SELECT count(*) FROM outbox WHERE topic = 'ORDER_PAID' AND order_no IN ('WX-LOST-PAY', 'ALI-LOST-PAY')`); got != 2 {
		t.Errorf("%d ORDER_PAID of the lost payments, want one each", got)
	}
	// The money adds up: every applied refund has its row, the orders'
	// refunded amounts are their rows' sums.
	if bad := r.scalar(t, `SELECT count(*) FROM biz_order o WHERE refunded_amount <> coalesce((SELECT sum(amount) FROM trade_refund t WHERE t.order_no = o.order_no AND t.trade = o.paid_by), 0)`); bad != 0 {
		t.Errorf("%d orders whose refunded amount is not their refunds' sum", bad)
	}
}

// TestBillsAPI runs days by hand through every state the API answers:
// ok (an empty day), missing (not ready), error (a statement whose totals
// disagree: nothing applied), 502 (the channel down, or an answer that
// fails verification: recorded as error), 404 and 409.
func TestBillsAPI(t *testing.T) {
	r := newReconcileRig(t)
	r.env = append(r.env, "EDGE_ADMIN_TOKEN=admin-token")
	a, _ := r.node(t, "-bills=false")
	post := func(ch, date string) (int, string) {
		return adminDo(t, "admin-token", "POST", "http://"+a.AdminAddr()+"/bills/"+ch+"/"+date, "")
	}
	state := func(body string) string {
		var run durable.BillRun
		if err := json.Unmarshal([]byte(body), &run); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		return run.State
	}

	r.wxFake.SetBill("2026-12-01", querytest.Bill{Status: "NO_STATEMENT_EXIST"})
	if code, body := post("wx", "2026-12-01"); code != 200 || state(body) != "ok" {
		t.Errorf("a day without trades: %d %s", code, body)
	}
	r.wxFake.SetBill("2026-12-02", querytest.Bill{Status: "STATEMENT_CREATING"})
	if code, body := post("wx", "2026-12-02"); code != 200 || state(body) != "missing" {
		t.Errorf("not ready: %d %s", code, body)
	}
	// Not ready, then ready: the same day runs ok.
	r.wxFake.SetBill("2026-12-02", querytest.Bill{File: billtest.WeChatBill(nil, true)})
	if code, body := post("wx", "2026-12-02"); code != 200 || state(body) != "ok" {
		t.Errorf("ready after all: %d %s", code, body)
	}

	putOrder(t, a.AdminAddr(), "WX-SKEW", "wx")
	skewed := &bytes.Buffer{}
	w := billtest.NewWeChatWriter(skewed, true)
	w.Skew = 100
	w.Add(bill.Row{Kind: bill.Payment, Trade: "4200000000202612030009", OrderNo: "WX-SKEW", Amount: rcAmount})
	w.Close()
	r.wxFake.SetBill("2026-12-03", querytest.Bill{File: skewed.Bytes()})
	code, body := post("wx", "2026-12-03")
	if code != 200 || state(body) != "error" || !strings.Contains(body, "totals disagree") {
		t.Errorf("totals that disagree: %d %s", code, body)
	}
	if n := r.scalar(t, `SELECT count(*) FROM biz_order WHERE order_no = 'WX-SKEW' AND status = 'PENDING_PAY'`); n != 1 {
		t.Error("a statement that failed its own totals applied a payment")
	}

	r.wxFake.SetBill("2026-12-04", querytest.Bill{File: billtest.WeChatBill(nil, true), Hash: strings.Repeat("ab", 20)})
	if code, body := post("wx", "2026-12-04"); code != 502 || !strings.Contains(body, "wx") || !strings.Contains(body, "SHA-1") {
		t.Errorf("a file that fails its SHA-1: %d %s, want 502 naming the channel and the reason", code, body)
	}
	if _, run := billRun(t, a.AdminAddr(), "wx", "2026-12-04"); run.State != "error" {
		t.Errorf("the failed fetch is recorded %q, want error", run.State)
	}
	r.aliFake.SetDown(true)
	if code, body := post("ali", "2026-12-04"); code != 502 || !strings.Contains(body, "ali") {
		t.Errorf("alipay down: %d %s, want 502", code, body)
	}
	r.aliFake.SetDown(false)

	if code, body := post("nosuch", "2026-12-04"); code != 404 {
		t.Errorf("an unknown channel: %d %s", code, body)
	}
	if code, body := post("wx", "2026-12-32"); code != 400 {
		t.Errorf("a date that is none: %d %s", code, body)
	}
	// A run of the day in progress (its lock held): 409.
	z, _ := time.LoadLocation("Asia/Shanghai")
	day, _ := durable.NewBillDay("2026-12-01", z)
	conn, err := r.db.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(context.Background(), `SELECT pg_advisory_lock($1)`, durable.BillDayLockID("wx", day)); err != nil {
		t.Fatal(err)
	}
	if code, body := post("wx", "2026-12-01"); code != 409 {
		t.Errorf("while a run is in progress: %d %s, want 409", code, body)
	}
	conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, durable.BillDayLockID("wx", day))

	code, body = adminDo(t, "admin-token", "GET", "http://"+a.AdminAddr()+"/bills?channel=wx&from=2026-12-01&to=2026-12-03", "")
	var list struct{ Runs []durable.BillRun }
	if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil || len(list.Runs) != 3 {
		t.Errorf("GET /bills: %d %s", code, body)
	}
	if code, _ := adminDo(t, rcOrders, "GET", "http://"+a.AdminAddr()+"/bills", ""); code != 401 {
		t.Errorf("the orders token reads bills: %d, want 401", code)
	}
	// Counted by result.
	page := scrape(t, "http://"+a.AdminAddr()+"/metrics")
	for series, want := range map[string]float64{
		`notifyedge_bill_runs_total{channel="wx",result="ok"}`:      2,
		`notifyedge_bill_runs_total{channel="wx",result="missing"}`: 1,
		`notifyedge_bill_runs_total{channel="wx",result="error"}`:   2,
	} {
		if got := metricValue(t, page, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if !strings.Contains(page, `notifyedge_bill_last_ok_seconds{channel="wx"}`) || !strings.Contains(page, `notifyedge_bill_items{category="matched",channel="wx"}`) {
		t.Error("the bills' gauges are not on /metrics")
	}
}
