package durable_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
)

// wantUniqueViolation fails the test unless err is the unique index on
// biz_order.paid_by refusing a write.
func wantUniqueViolation(t *testing.T, what string, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || pgErr.ConstraintName != "biz_order_paid_by_uniq" {
		t.Errorf("%s: %v, want a unique violation of biz_order_paid_by_uniq", what, err)
	}
}

// show is a Result as a test reports it.
func show(r durable.Result) string {
	return fmt.Sprintf("%v/%s/review %q/replayed %v", r.Outcome, r.Status, r.Review, r.Replayed)
}

// The schema holds it, not only the functions: no write makes a trade the
// payer of a second order. Orders without a payer are not concerned.
func TestPaidByIsUnique(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.seed(t, "UQ-A", durable.Paid, 100, "test:TX-UQ", 0)
	b.seed(t, "UQ-B", durable.Paid, 100, "test:TX-B", 0)
	b.seed(t, "UQ-C", durable.Paid, 100, "", 0)
	b.seed(t, "UQ-D", durable.Paid, 100, "", 0)
	_, err := b.db.Exec(ctx, `UPDATE biz_order SET paid_by = 'test:TX-UQ' WHERE order_no = 'UQ-B'`)
	wantUniqueViolation(t, "UPDATE of UQ-B to UQ-A's payer", err)
	_, err = b.db.Exec(ctx, `INSERT INTO biz_order (order_no, status, amount, currency, paid_by)
		VALUES ('UQ-E', 'PAID', 100, 'CNY', 'test:TX-UQ')`)
	wantUniqueViolation(t, "INSERT of an order paid by UQ-A's payer", err)
	if payer, _, _ := b.money(t, "UQ-B"); payer != "test:TX-B" {
		t.Errorf("UQ-B's payer %q, want test:TX-B", payer)
	}
}

// The hole: a payment of a second order by a trade that paid the first
// was a conflict while the key's claim existed; retention then deleted the
// claim although an open review named it, and the payment delivered again
// was applied: two orders PAID by one trade, ORDER_PAID for the second.
// Now retention keeps the claim while the review is open, and once it is
// resolved and the claim is gone, the payment is still a conflict.
func TestOneTradePaysOneOrderAcrossRetention(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.order(t, "CF-A", durable.PendingPay, 100, "CNY")
	b.order(t, "CF-B", durable.PendingPay, 100, "CNY")
	payA := note("TX-CF", durable.PaySuccess, "CF-A", 100, "CNY")
	payB := note("TX-CF", durable.PaySuccess, "CF-B", 100, "CNY")
	key := payA.BizKey
	if r := process(t, b.store, payA); r.Outcome != durable.Applied {
		t.Fatalf("CF-A's payment: %+v, want applied", r)
	}
	wantConflict := func(when string) {
		t.Helper()
		r := process(t, b.store, payB)
		if r.Outcome != durable.Conflict || r.Review != durable.ReviewPayloadConflict || r.Status != "" || r.Replayed {
			t.Errorf("%s: CF-B's payment %s, want conflict with PAYLOAD_CONFLICT", when, show(r))
		}
		if n := b.count(t, `SELECT count(*) FROM notify_review WHERE biz_key = $1 AND payload_hash = $2
			AND reason = 'PAYLOAD_CONFLICT' AND resolved_at IS NULL`, key, payB.Digest); n != 1 {
			t.Errorf("%s: %d open PAYLOAD_CONFLICT rows for CF-B's payment, want 1", when, n)
		}
	}
	wantConflict("with the claim")

	b.exec(t, `UPDATE notify_claim SET created_at = now() - interval '8 days'`)
	if c := retentionCycle(t, b.store, testRetention()); c.Deleted["notify_claim"] != 0 {
		t.Errorf("retention deleted %d claims while the review was open", c.Deleted["notify_claim"])
	}
	if b.claims(t, key) != 1 {
		t.Error("retention deleted the claim an open review names")
	}
	var id int64
	if err := b.db.QueryRow(ctx, `SELECT id FROM notify_review WHERE biz_key = $1 AND resolved_at IS NULL`, key).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.ResolveReview(ctx, id, "CF-A was paid by TX-CF; CF-B was not", "ops"); err != nil {
		t.Fatal(err)
	}
	retentionCycle(t, b.store, testRetention())
	if n := b.claims(t, key); n != 0 {
		t.Fatalf("retention once the review was resolved left %d claims of the key, want none", n)
	}

	wantConflict("after retention")
	wantConflict("again") // one open row per key, digest and reason
	if n := b.claims(t, key); n != 0 {
		t.Errorf("the conflict stored %d claims, want none", n)
	}
	if st := b.status(t, "CF-B"); st != durable.PendingPay {
		t.Errorf("CF-B %s, want PENDING_PAY", st)
	}
	if payer, _, _ := b.money(t, "CF-B"); payer != "" {
		t.Errorf("CF-B paid by %q, want nobody", payer)
	}
	if got := b.topics(t, "CF-B"); got != nil {
		t.Errorf("CF-B's outbox %v, want nothing", got)
	}

	// CF-A's own late duplicate: skipped, no alarm.
	if r := process(t, b.store, payA); r.Outcome != durable.Skipped || r.Status != durable.Paid || r.Review != "" || r.Replayed {
		t.Errorf("CF-A's late duplicate: %s, want skipped on PAID, no review", show(r))
	}
	if payer, _, _ := b.money(t, "CF-A"); payer != "test:TX-CF" || b.status(t, "CF-A") != durable.Paid {
		t.Errorf("CF-A: %s paid by %q, want PAID by test:TX-CF", b.status(t, "CF-A"), payer)
	}
	if got := b.topics(t, "CF-A"); !cmp.Equal(got, []string{"ORDER_PAID"}) {
		t.Errorf("CF-A's outbox %v, want one ORDER_PAID", got)
	}
	if got := b.reviews(t, "CF-A"); got != nil {
		t.Errorf("CF-A's reviews %v, want none", got)
	}
}

// A conflict locks its key's claim before it opens its review, so that
// retention cannot delete the claim unseen while the review opens. Here
// the claim is being deleted when the conflict comes: the conflict waits,
// finds it gone, and stores nothing (the order changed under it); decided
// again, without the claim, the payment is still a conflict.
func TestConflictLocksItsClaim(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.order(t, "LK-A", durable.PendingPay, 100, "CNY")
	b.order(t, "LK-B", durable.PendingPay, 100, "CNY")
	payB := note("TX-LK", durable.PaySuccess, "LK-B", 100, "CNY")
	if r := process(t, b.store, note("TX-LK", durable.PaySuccess, "LK-A", 100, "CNY")); r.Outcome != durable.Applied {
		t.Fatalf("LK-A's payment: %s", show(r))
	}
	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `DELETE FROM notify_claim WHERE biz_key = $1`, payB.BizKey); err != nil {
		t.Fatal(err)
	}
	answer := submit(b.store, 10*time.Second, payB)
	durabletest.WaitLockWaiters(t, b.db, 1, "%")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if a := <-answer; !errors.Is(a.err, durable.ErrOrderChanged) {
		t.Fatalf("the conflict whose claim was deleted meanwhile: %s, %v; want ErrOrderChanged", show(a.r), a.err)
	}
	if n := b.openReviews(t, payB.BizKey, durable.ReviewPayloadConflict); n != 0 {
		t.Errorf("%d open PAYLOAD_CONFLICT rows after the failed attempt, want none", n)
	}
	if r := process(t, b.store, payB); r.Outcome != durable.Conflict || r.Review != durable.ReviewPayloadConflict {
		t.Errorf("decided again: %s, want conflict with PAYLOAD_CONFLICT", show(r))
	}
	if st := b.status(t, "LK-B"); st != durable.PendingPay || b.claims(t, payB.BizKey) != 0 {
		t.Errorf("LK-B %s, %d claims; want PENDING_PAY, none", st, b.claims(t, payB.BizKey))
	}
}

// A payment whose trade paid another order is a conflict before anything
// about its own order is looked at: not unknown_order, amount_mismatch,
// PAID_AFTER_CLOSE, DUPLICATE_PAYMENT, nor applied; no claim is stored and
// the order is untouched. The paid order's own late duplicate is skipped.
// With group commit all of them are one batch.
func TestPaymentOfATradeThatPaidAnotherOrder(t *testing.T) {
	b := setup(t)
	for i := 1; i <= 6; i++ {
		b.seed(t, fmt.Sprintf("OT-PAID%d", i), durable.Paid, 100, fmt.Sprintf("test:T%d", i), 0)
	}
	b.order(t, "OT-MISMATCH", durable.PendingPay, 200, "CNY")
	b.order(t, "OT-CLOSED", durable.Closed, 100, "CNY")
	b.seed(t, "OT-OTHER", durable.Paid, 100, "test:OTHER", 0)
	b.order(t, "OT-PENDING", durable.PendingPay, 100, "CNY")
	conflicts := []durable.Notification{
		note("T1", durable.PaySuccess, "OT-NOSUCH", 100, "CNY"),
		note("T2", durable.PaySuccess, "OT-MISMATCH", 100, "CNY"),
		note("T3", durable.PaySuccess, "OT-CLOSED", 100, "CNY"),
		note("T4", durable.PaySuccess, "OT-OTHER", 100, "CNY"),
		note("T5", durable.PaySuccess, "OT-PENDING", 100, "CNY"),
	}
	own := note("T6", durable.PaySuccess, "OT-PAID6", 100, "CNY")
	fresh := payments(t, b, "OT-NEW", 3)
	notes := append(append(append([]durable.Notification{}, conflicts...), own), fresh...)
	got := decideAll(t, b, notes)
	for i, n := range conflicts {
		r := got[i]
		if r.Outcome != durable.Conflict || r.Review != durable.ReviewPayloadConflict || r.Status != "" {
			t.Errorf("%s for %s: %s, want conflict with PAYLOAD_CONFLICT", n.BizKey, n.OrderNo, show(r))
		}
		if got := b.strings(t, `SELECT reason FROM notify_review WHERE biz_key = $1 AND resolved_at IS NULL`, n.BizKey); !cmp.Equal(got, []string{"PAYLOAD_CONFLICT"}) {
			t.Errorf("%s: open reviews %v, want PAYLOAD_CONFLICT only", n.BizKey, got)
		}
		if c := b.claims(t, n.BizKey); c != 0 {
			t.Errorf("%s: %d claims, want none", n.BizKey, c)
		}
		if n.OrderNo != "OT-NOSUCH" && b.topics(t, n.OrderNo) != nil {
			t.Errorf("%s: outbox rows %v", n.OrderNo, b.topics(t, n.OrderNo))
		}
	}
	for order, want := range map[string]durable.State{"OT-MISMATCH": durable.PendingPay, "OT-CLOSED": durable.Closed,
		"OT-OTHER": durable.Paid, "OT-PENDING": durable.PendingPay} {
		if st := b.status(t, order); st != want {
			t.Errorf("%s: %s, want %s", order, st, want)
		}
	}
	if r := got[len(conflicts)]; r.Outcome != durable.Skipped || r.Status != durable.Paid || r.Review != "" {
		t.Errorf("the paid order's own late duplicate: %s, want skipped, no review", show(r))
	}
	for i, n := range fresh {
		if r := got[len(conflicts)+1+i]; r.Outcome != durable.Applied {
			t.Errorf("%s: %s, want applied", n.BizKey, show(r))
		}
	}
	for i := 1; i <= 6; i++ {
		if payer, _, _ := b.money(t, fmt.Sprintf("OT-PAID%d", i)); payer != fmt.Sprintf("test:T%d", i) {
			t.Errorf("OT-PAID%d paid by %q", i, payer)
		}
	}
}

// A batch member that pays a pending order with a trade that paid another
// order leaves the batch's set statements: it gets its conflict, its
// batch-mates are applied, and the batch does not fail (no member is
// decided again alone).
func TestGroupPaymentOfATakenTrade(t *testing.T) {
	b := setup(t)
	s := groupStore(t, b)
	b.seed(t, "GT-PAID", durable.Paid, 100, "test:TX-GT", 0)
	b.order(t, "GT-VICTIM", durable.PendingPay, 100, "CNY")
	taken := note("TX-GT", durable.PaySuccess, "GT-VICTIM", 100, "CNY")
	answers := oneBatch(t, b, s, "GT-SLOT", append(payments(t, b, "GT-", 6), taken))
	for range 7 {
		a := <-answers
		switch {
		case a.err != nil:
			t.Errorf("%s: %v", a.n.BizKey, a.err)
		case a.n.BizKey == taken.BizKey:
			if a.r.Outcome != durable.Conflict || a.r.Review != durable.ReviewPayloadConflict {
				t.Errorf("the taken trade's payment: %s, want conflict with PAYLOAD_CONFLICT", show(a.r))
			}
		case a.r.Outcome != durable.Applied:
			t.Errorf("%s: %s, want applied", a.n.BizKey, show(a.r))
		}
	}
	st := s.GroupStats()
	if st.Batches.Load() != 1 || st.Batched.Load() != 7 || st.Retried.Load() != 0 || st.Busy.Load() != 0 {
		t.Errorf("%d batches decided %d deliveries, %d retried alone, %d busy; want one batch of 7, none alone",
			st.Batches.Load(), st.Batched.Load(), st.Retried.Load(), st.Busy.Load())
	}
	if st := b.status(t, "GT-VICTIM"); st != durable.PendingPay || b.topics(t, "GT-VICTIM") != nil || b.claims(t, taken.BizKey) != 0 {
		t.Errorf("GT-VICTIM: %s, outbox %v, %d claims; want PENDING_PAY, nothing", st, b.topics(t, "GT-VICTIM"), b.claims(t, taken.BizKey))
	}
	if n := b.openReviews(t, taken.BizKey, durable.ReviewPayloadConflict); n != 1 {
		t.Errorf("%d open PAYLOAD_CONFLICT rows, want 1", n)
	}
}

// An order without a payer adopts the trade a refund or close names only
// when that trade paid no other order; otherwise the refund or close is
// another trade's, and the order keeps no payer.
func TestNoAdoptionOfATradeThatPaidAnotherOrder(t *testing.T) {
	b := setup(t)
	b.seed(t, "AD-PAID", durable.Paid, 100, "test:TX-AD", 0)
	b.seed(t, "AD-REFUND", durable.Paid, 100, "", 0)
	b.seed(t, "AD-CLOSE", durable.Paid, 100, "", 0)
	b.seed(t, "AD-REFUNDED", durable.Refunded, 100, "", 100)
	b.seed(t, "AD-FRESH", durable.Paid, 100, "", 0)
	notes := []durable.Notification{
		refundNote("TX-AD", "R-AD1", "AD-REFUND", 100, 40, false),
		note("TX-AD", durable.TradeClosed, "AD-CLOSE", 100, "CNY"),
		refundNote("TX-AD", "R-AD2", "AD-REFUNDED", 100, 30, false),
		refundNote("TX-NEW", "R-NEW", "AD-FRESH", 100, 40, false), // adopts
	}
	type want struct {
		outcome durable.Outcome
		status  durable.State
		review  durable.ReviewReason
		payer   string
		refunds []refund
	}
	wants := []want{
		{durable.Skipped, durable.Paid, durable.ReviewRefundOtherTrade, "", []refund{{"test:TX-AD", "R-AD1", 40}}},
		{durable.Skipped, durable.Paid, "", "", nil},
		{durable.Skipped, durable.Refunded, durable.ReviewRefundOtherTrade, "", []refund{{"test:TX-AD", "R-AD2", 30}}},
		{durable.Applied, durable.Paid, "", "test:TX-NEW", []refund{{"test:TX-NEW", "R-NEW", 40}}},
	}
	for i, r := range decideAll(t, b, notes) {
		n, w := notes[i], wants[i]
		if r.Outcome != w.outcome || r.Status != w.status || r.Review != w.review {
			t.Errorf("%s on %s: %v/%s/review %q, want %v/%s/review %q", n.BizKey, n.OrderNo,
				r.Outcome, r.Status, r.Review, w.outcome, w.status, w.review)
		}
		payer, _, refunds := b.money(t, n.OrderNo)
		if payer != w.payer {
			t.Errorf("%s: paid by %q, want %q", n.OrderNo, payer, w.payer)
		}
		if d := cmp.Diff(w.refunds, refunds); d != "" {
			t.Errorf("%s: refunds (-want +got):\n%s", n.OrderNo, d)
		}
	}
	if payer, refunded, refunds := b.money(t, "AD-PAID"); payer != "test:TX-AD" || refunded != 0 || refunds != nil {
		t.Errorf("AD-PAID: paid by %q, refunded %d, refunds %v; want test:TX-AD, untouched", payer, refunded, refunds)
	}
}

// The upgrade to a unique paid_by finds orders that share a payer and
// stops with a bounded list of them and what an operator must do; once
// they are fixed, it adds the index. An index of that name left invalid
// by a failed concurrent build is refused, not kept.
func TestUpgradeReportsTradesPayingSeveralOrders(t *testing.T) {
	ctx := context.Background()
	url := durabletestCreateEmpty(t)
	if err := durable.MigrateTo(ctx, url, 8); err != nil {
		t.Fatal(err)
	}
	b := &bundle{url: url, db: durabletest.Pool(t, url)}
	// 22 trades pay several orders: acme:TX-00 seven, the others two.
	for i := range 22 {
		n := 2
		if i == 0 {
			n = 7
		}
		for j := range n {
			b.seed(t, fmt.Sprintf("UP-%02d-%d", i, j), durable.Paid, 100, fmt.Sprintf("acme:TX-%02d", i), 0)
		}
	}
	b.seed(t, "UP-FINE", durable.Paid, 100, "acme:FINE", 0)
	b.seed(t, "UP-NOPAYER-1", durable.Paid, 100, "", 0)
	b.seed(t, "UP-NOPAYER-2", durable.Paid, 100, "", 0)
	version := func() int {
		t.Helper()
		return b.count(t, `SELECT version FROM notifyedge_schema_version`)
	}

	err := durable.Migrate(ctx, url)
	if err == nil {
		t.Fatal("the upgrade went through with trades paying several orders")
	}
	msg := err.Error()
	for _, want := range []string{
		"22 trade(s)", "(the first 20)",
		"acme:TX-00 paid UP-00-0, UP-00-1, UP-00-2, UP-00-3, UP-00-4 and 2 more; acme:TX-01 paid UP-01-0, UP-01-1;",
		"acme:TX-19 paid UP-19-0, UP-19-1.",
		"decide which order it paid", "set paid_by of every other order to NULL", "then restart",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the upgrade's error does not say %q:\n%s", want, msg)
		}
	}
	for _, not := range []string{"acme:TX-20", "acme:TX-21", "FINE", "NOPAYER"} {
		if strings.Contains(msg, not) {
			t.Errorf("the upgrade's error names %q:\n%s", not, msg)
		}
	}
	if v := version(); v != 8 {
		t.Errorf("schema version %d after the refused upgrade, want 8", v)
	}

	// An operator builds the index by hand, concurrently, before fixing
	// the orders: the build fails and leaves it invalid.
	if _, err := b.db.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY biz_order_paid_by_uniq ON biz_order (paid_by) WHERE paid_by IS NOT NULL`); err == nil {
		t.Fatal("a unique index built over shared payers")
	}
	if err := durable.Migrate(ctx, url); err == nil || !strings.Contains(err.Error(), "DROP INDEX CONCURRENTLY biz_order_paid_by_uniq") {
		t.Fatalf("the upgrade over an invalid index: %v, want it refused with what to do", err)
	}
	b.exec(t, `DROP INDEX biz_order_paid_by_uniq`)

	// What the operator does: each trade keeps the first of its orders.
	b.exec(t, `UPDATE biz_order o SET paid_by = NULL
		WHERE order_no <> (SELECT min(p.order_no) FROM biz_order p WHERE p.paid_by = o.paid_by)`)
	if err := durable.Migrate(ctx, url); err != nil {
		t.Fatalf("the upgrade once the orders were fixed: %v", err)
	}
	if v := version(); v < 9 {
		t.Errorf("schema version %d, want 9 or later", v)
	}
	if n := b.count(t, `SELECT count(*) FROM pg_index WHERE indexrelid = 'biz_order_paid_by_uniq'::regclass AND indisvalid AND indisunique`); n != 1 {
		t.Error("no valid unique index biz_order_paid_by_uniq")
	}
	_, err = b.db.Exec(ctx, `UPDATE biz_order SET paid_by = 'acme:TX-00' WHERE order_no = 'UP-FINE'`)
	wantUniqueViolation(t, "UPDATE after the upgrade", err)

	// Down to 8 and up again: the migration runs again from scratch.
	if err := durable.MigrateTo(ctx, url, 8); err != nil {
		t.Fatal(err)
	}
	if err := durable.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	_, err = b.db.Exec(ctx, `UPDATE biz_order SET paid_by = 'acme:TX-00' WHERE order_no = 'UP-FINE'`)
	wantUniqueViolation(t, "UPDATE after down and up again", err)
}
