package durable_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
)

var shanghai = func() *time.Location {
	l, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		panic(err)
	}
	return l
}()

// rowsOf returns a statement reader over rows.
func rowsOf(rows ...durable.BillRow) func() (durable.BillRow, error) {
	i := 0
	return func() (durable.BillRow, error) {
		if i == len(rows) {
			return durable.BillRow{}, io.EOF
		}
		i++
		r := rows[i-1]
		r.Line = i + 1
		return r, nil
	}
}

func (b *bundle) paidAt(t *testing.T, orderNo string, at time.Time) {
	t.Helper()
	if _, err := b.db.Exec(context.Background(), `UPDATE biz_order SET paid_at = $2 WHERE order_no = $1`, orderNo, at); err != nil {
		t.Fatal(err)
	}
}

func TestPaymentRecordsItsDay(t *testing.T) {
	b := setup(t)
	b.order(t, "o-day", durable.PendingPay, 1000, "CNY")
	before := time.Now().Add(-time.Second)
	process(t, b.store, note("t-day", durable.PaySuccess, "o-day", 1000, "CNY"))
	var at *time.Time
	if err := b.db.QueryRow(context.Background(), `SELECT paid_at FROM biz_order WHERE order_no = 'o-day'`).Scan(&at); err != nil {
		t.Fatal(err)
	}
	if at == nil || at.Before(before) || at.After(time.Now().Add(time.Second)) {
		t.Fatalf("paid_at %v, want the payment's time", at)
	}
	// A refund moves nothing of it.
	process(t, b.store, refundNote("t-day", "rf-day", "o-day", 1000, 400, false))
	var again time.Time
	b.db.QueryRow(context.Background(), `SELECT paid_at FROM biz_order WHERE order_no = 'o-day'`).Scan(&again)
	if !again.Equal(*at) {
		t.Errorf("a refund moved paid_at from %v to %v", at, again)
	}
}

// TestCompareBillCategories puts one of each case into a day's bill and
// ledger, and checks each row and entry ends in its category, once, run
// after run.
func TestCompareBillCategories(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	day, err := durable.NewBillDay("2026-12-05", shanghai)
	if err != nil {
		t.Fatal(err)
	}
	at := func(d, hms string) time.Time {
		v, err := time.ParseInLocation("2006-01-02 15:04:05", d+" "+hms, shanghai)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// matched: paid on D, in bill D; refunded with the same amount.
	b.seed(t, "o-match", durable.Paid, 1000, "test:m1", 300, refund{"test:m1", "rf-m1", 300})
	b.paidAt(t, "o-match", at("2026-12-05", "10:00:00"))
	// amount_mismatch: the ledger says 800, the bill 700.
	b.seed(t, "o-diff", durable.Paid, 800, "test:d1", 0)
	b.paidAt(t, "o-diff", at("2026-12-05", "11:00:00"))
	// a ledger entry of 23:59:59 on D-1 found in bill D: matched.
	b.seed(t, "o-late", durable.Paid, 500, "test:late", 0)
	b.paidAt(t, "o-late", at("2026-12-04", "23:59:59"))
	// ledger_only: recorded on D-1, in no bill.
	b.seed(t, "o-lost", durable.Paid, 600, "test:lost", 0)
	b.paidAt(t, "o-lost", at("2026-12-04", "09:00:00"))
	// pending: recorded on D, not in bill D (bill D+1 may have it).
	b.seed(t, "o-next", durable.Paid, 900, "test:next", 0)
	b.paidAt(t, "o-next", at("2026-12-05", "23:59:59"))
	// another channel's entries are none of this one's business.
	b.seed(t, "o-other", durable.Paid, 100, "other:x", 0)
	b.paidAt(t, "o-other", at("2026-12-04", "09:00:00"))
	// channel_only: the orders exist, unpaid here.
	b.order(t, "o-cb", durable.PendingPay, 1500, "CNY")
	b.order(t, "o-rf", durable.PendingPay, 2000, "CNY")
	// A duplicate payment of o-match whose callback came (its claim
	// records it): recorded here, so matched. A refund recorded on D-1
	// without a channel refund id: never judged.
	ctx0 := context.Background()
	if _, err := b.db.Exec(ctx0, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state) VALUES ('test:dup:PAY_SUCCESS', 'o-match', repeat('0', 64), 'DONE')`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(ctx0, `INSERT INTO trade_refund (trade, refund_id, order_no, amount, created_at) VALUES ('test:late', '', 'o-late', 100, $1)`, at("2026-12-04", "12:00:00")); err != nil {
		t.Fatal(err)
	}

	rows := []durable.BillRow{
		{Kind: 'P', Trade: "m1", OrderNo: "o-match", Amount: 1000},
		{Kind: 'R', Trade: "m1", RefundID: "rf-m1", OrderNo: "o-match", Amount: 300},
		{Kind: 'R', Trade: "m1", RefundID: "rf-m1b", OrderNo: "o-match", Amount: 200}, // a lost refund
		{Kind: 'P', Trade: "d1", OrderNo: "o-diff", Amount: 700},
		{Kind: 'P', Trade: "late", OrderNo: "o-late", Amount: 500},
		{Kind: 'P', Trade: "cb", OrderNo: "o-cb", Amount: 1500},                    // a lost payment
		{Kind: 'P', Trade: "rf", OrderNo: "o-rf", Amount: 2000},                    // paid...
		{Kind: 'R', Trade: "rf", RefundID: "rf-rf", OrderNo: "o-rf", Amount: 2000}, // ...and refunded
		{Kind: 'P', Trade: "dup", OrderNo: "o-match", Amount: 1000},                // a duplicate payment, on record
	}
	want := []durable.BillItem{
		{Category: "amount_mismatch", Kind: "payment", Trade: "test:d1", OrderNo: "o-diff", BillAmount: ptr(700), LedgerAmount: ptr(800)},
		{Category: "channel_only", Kind: "payment", Trade: "test:cb", OrderNo: "o-cb", BillAmount: ptr(1500)},
		{Category: "channel_only", Kind: "payment", Trade: "test:rf", OrderNo: "o-rf", BillAmount: ptr(2000), Refunded: true},
		{Category: "channel_only", Kind: "refund", Trade: "test:m1", RefundID: "rf-m1b", OrderNo: "o-match", BillAmount: ptr(200), TradeTotal: ptr(1000), RefundedThrough: ptr(500)},
		{Category: "channel_only", Kind: "refund", Trade: "test:rf", RefundID: "rf-rf", OrderNo: "o-rf", BillAmount: ptr(2000), TradeTotal: ptr(2000), RefundedThrough: ptr(2000)},
		{Category: "ledger_only", Kind: "payment", Trade: "test:lost", OrderNo: "o-lost", LedgerAmount: ptr(600), RecordedOn: "2026-12-04"},
	}
	// Before the days around it were compared, no entry of the day before
	// is judged: none is called missing from a statement never read.
	run, err := b.store.CompareBill(ctx, "test", day, rowsOf(rows...))
	if err != nil {
		t.Fatal(err)
	}
	if run.Categories["ledger_only"] != 0 {
		t.Errorf("ledger_only %d before the neighbours' runs, want 0", run.Categories["ledger_only"])
	}
	for _, d := range []string{"2026-12-03", "2026-12-04"} {
		if err := b.store.SaveBillRun(ctx, durable.BillRun{Channel: "test", Date: d, State: durable.BillOK}); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 2 {
		run, err := b.store.CompareBill(ctx, "test", day, rowsOf(rows...))
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		wantCats := map[string]int{"matched": 4, "channel_only": 4, "amount_mismatch": 1, "ledger_only": 1, "pending": 1}
		if d := cmp.Diff(wantCats, run.Categories); d != "" {
			t.Errorf("round %d: categories (-want +got):\n%s", round, d)
		}
		if want := (durable.BillSide{Payments: 6, Paid: 6700, Refunds: 3, Refunded: 2500}); run.Bill != want {
			t.Errorf("round %d: bill side %+v, want %+v", round, run.Bill, want)
		}
		// The ledger of D: o-match, o-diff, o-next paid; rf-m1 refunded
		// (recorded now, not on D: not counted).
		if want := (durable.BillSide{Payments: 3, Paid: 2700}); run.Ledger != want {
			t.Errorf("round %d: ledger side %+v, want %+v", round, run.Ledger, want)
		}
		items, err := b.store.BillItems(ctx, "test", day, 0, 100, true)
		if err != nil {
			t.Fatal(err)
		}
		for i := range items {
			items[i].ID = 0
		}
		if d := cmp.Diff(want, items); d != "" {
			t.Errorf("round %d: items (-want +got):\n%s", round, d)
		}
	}
}

func TestCompareBillStoresNothingOfAStatementThatFails(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	day, _ := durable.NewBillDay("2026-12-05", shanghai)
	if _, err := b.store.CompareBill(ctx, "test", day, rowsOf(durable.BillRow{Kind: 'P', Trade: "a", OrderNo: "o-a", Amount: 1})); err != nil {
		t.Fatal(err)
	}
	bad := errors.New("the totals disagree")
	n := 0
	_, err := b.store.CompareBill(ctx, "test", day, func() (durable.BillRow, error) {
		n++
		if n > 3 {
			return durable.BillRow{}, bad
		}
		return durable.BillRow{Kind: 'P', Trade: "b" + string(rune('0'+n)), OrderNo: "o-b", Amount: 1, Line: n}, nil
	})
	if !errors.Is(err, bad) {
		t.Fatalf("err %v, want the reader's", err)
	}
	if got := b.count(t, `SELECT count(*) FROM bill_row WHERE channel = 'test' AND trade = 'a'`); got != 1 {
		t.Errorf("the earlier statement's rows: %d, want kept (1)", got)
	}
	if got := b.count(t, `SELECT count(*) FROM bill_row WHERE trade LIKE 'b%'`); got != 0 {
		t.Errorf("%d rows of the failed statement stored", got)
	}
}

func TestBillRunsSavedListedAndPruned(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	day, _ := durable.NewBillDay("2026-12-05", shanghai)
	b.order(t, "o-cb", durable.PendingPay, 1500, "CNY")
	run, err := b.store.CompareBill(ctx, "test", day, rowsOf(durable.BillRow{Kind: 'P', Trade: "cb", OrderNo: "o-cb", Amount: 1500}))
	if err != nil {
		t.Fatal(err)
	}
	run.State = durable.BillOK
	now := time.Now()
	run.FetchedAt = &now
	if err := b.store.SaveBillRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	items, _ := b.store.BillItems(ctx, "test", day, 0, 10, true)
	if len(items) != 1 {
		t.Fatalf("items %+v", items)
	}
	if err := b.store.SetBillItemAction(ctx, items[0].ID, "applied", "PAID"); err != nil {
		t.Fatal(err)
	}
	if err := b.store.BillReview(ctx, "test", day.String(), items[0], durable.ReviewBillMismatch); err != nil {
		t.Fatal(err)
	}
	if err := b.store.BillReview(ctx, "test", day.String(), items[0], durable.ReviewBillMismatch); err != nil {
		t.Fatal(err)
	}
	if got := b.openReviews(t, "test:cb:PAY_SUCCESS", durable.ReviewBillMismatch); got != 1 {
		t.Errorf("open reviews %d, want one however often it is opened", got)
	}
	got, err := b.store.BillRunOf(ctx, "test", day)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != "ok" || len(got.Items) != 1 || got.Items[0].Action != "applied" || got.Categories["channel_only"] != 1 {
		t.Errorf("run %+v", got)
	}
	if st, _ := b.store.BillRunState(ctx, "test", day); st != "ok" {
		t.Errorf("BillRunState %q after an ok run", st)
	}
	if st, _ := b.store.BillRunState(ctx, "test", durable.BillDay{Date: day.Date.AddDate(0, 0, -1)}); st != "" {
		t.Errorf("BillRunState %q of a day without a run", st)
	}
	gauges, err := b.store.BillGauges(ctx)
	if err != nil || gauges["test"].LastOK.IsZero() || gauges["test"].Categories["channel_only"] != 1 {
		t.Errorf("gauges %+v, %v", gauges, err)
	}
	list, err := b.store.BillRuns(ctx, durable.BillRunQuery{Channel: "test", From: "2026-12-01", To: "2026-12-05"})
	if err != nil || len(list) != 1 || list[0].Date != "2026-12-05" {
		t.Errorf("list %+v, %v", list, err)
	}
	if list, _ := b.store.BillRuns(ctx, durable.BillRunQuery{From: "2026-12-06"}); len(list) != 0 {
		t.Errorf("from the day after: %+v", list)
	}
	if n, err := b.store.PruneBills(ctx, day.Date); err != nil || n != 0 {
		t.Errorf("pruning before the day: %d, %v", n, err)
	}
	if n, err := b.store.PruneBills(ctx, day.Date.AddDate(0, 0, 1)); err != nil || n != 2 {
		t.Errorf("pruning past the day: %d rows, %v; want the run and its item", n, err)
	}
	if _, err := b.store.BillRunOf(ctx, "test", day); !errors.Is(err, durable.ErrNoBillRun) {
		t.Errorf("after pruning: %v", err)
	}
}

func ptr(v int64) *int64 { return &v }

// TestUpgradeFillsPaidAt upgrades a database of version 12 whose paid
// orders have no paid_at: each takes its payment's claim time where the
// claim still exists; the others stay NULL (past every bill still
// compared).
func TestUpgradeFillsPaidAt(t *testing.T) {
	ctx := context.Background()
	url := durabletestCreateEmpty(t)
	if err := durable.MigrateTo(ctx, url, 12); err != nil {
		t.Fatal(err)
	}
	db := durabletest.Pool(t, url)
	claimed := time.Date(2026, 12, 4, 15, 59, 59, 0, time.UTC)
	for _, q := range []string{
		`INSERT INTO biz_order (order_no, status, amount, currency, paid_by) VALUES ('o-claim', 'PAID', 100, 'CNY', 'wx:t1'), ('o-gone', 'PAID', 100, 'CNY', 'wx:t2'), ('o-open', 'PENDING_PAY', 100, 'CNY', NULL)`,
		`INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, created_at) VALUES ('wx:t1:PAY_SUCCESS', 'o-claim', repeat('0', 64), 'DONE', '2026-12-04 15:59:59+00')`,
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := durable.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	got := map[string]*time.Time{}
	rows, _ := db.Query(ctx, `SELECT order_no, paid_at FROM biz_order`)
	for rows.Next() {
		var o string
		var at *time.Time
		rows.Scan(&o, &at)
		got[o] = at
	}
	if rows.Err() != nil || len(got) != 3 {
		t.Fatalf("orders %v, %v", got, rows.Err())
	}
	if got["o-claim"] == nil || !got["o-claim"].Equal(claimed) || got["o-gone"] != nil || got["o-open"] != nil {
		t.Errorf("paid_at after the upgrade: %v", got)
	}
}

// A statement streams from the channel's connection into one COPY: a slow
// channel makes that statement outlast the operator pool's statement
// timeout, and the comparison still completes.
func TestCompareBillOutlastsTheStatementTimeout(t *testing.T) {
	url := durabletest.NewDatabase(t)
	store := newStore(t, url, durable.Config{OpsStatementTimeout: 200 * time.Millisecond})
	day, _ := durable.NewBillDay("2026-12-05", shanghai)
	n := 0
	run, err := store.CompareBill(context.Background(), "test", day, func() (durable.BillRow, error) {
		if n == 4 {
			return durable.BillRow{}, io.EOF
		}
		n++
		time.Sleep(100 * time.Millisecond) // the network, not a wait for a condition
		return durable.BillRow{Kind: 'P', Trade: fmt.Sprint("slow-", n), OrderNo: "o", Amount: 1, Line: n}, nil
	})
	if err != nil || run.Bill.Payments != 4 {
		t.Fatalf("a statement slower than the statement timeout: %+v, %v", run.Bill, err)
	}
}
