package durable_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// addOutbox inserts n unpublished outbox rows in one statement, as wide as
// notifyedge_move writes them, created at created (an SQL expression). The
// payload is one constant of the real shape: building it per row doubled
// the time of a 2M-row insert, and the backlog's reads never look inside.
func (b *bundle) addOutbox(t *testing.T, n int, created string) {
	t.Helper()
	_, err := b.db.Exec(context.Background(), `INSERT INTO outbox (topic, order_no, payload, created_at)
SELECT 'order.paid', 'O-' || g, '{"order_no": "O-1", "event_type": "PAY_SUCCESS", "from": "PENDING_PAY",
       "to": "PAID", "biz_key": "test:T-1:PAY_SUCCESS"}', `+created+`
  FROM generate_series(1, $1::int) g`, n)
	if err != nil {
		t.Fatalf("insert %d outbox rows: %v", n, err)
	}
}

// The outbox gauges must answer at any backlog: a relay that has been down
// long is exactly when the "outbox stuck" alert has to fire. The count
// stops at BacklogCap and says so; the age comes from the head of the
// unpublished index. At 2M waiting rows the read's bound is shown by its
// plan, not by a clock (a loaded machine makes any time limit a lottery):
// the partial index read in order, stopped at the cap. On two cores that
// read takes 13-30 ms, a full count(*) 0.3-0.45 s (0.7-0.8 s when it has to
// sort).
func TestOutboxBacklog(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	s := b.store
	backlog := func(t *testing.T) (durable.Backlog, time.Duration) {
		t.Helper()
		start := time.Now()
		got, err := s.OutboxBacklog(ctx)
		if err != nil {
			t.Fatalf("OutboxBacklog: %v", err)
		}
		return got, time.Since(start)
	}
	// oldestIs checks the age of the head row, created ten minutes before
	// the test began (at most the test's own run time more).
	began := time.Now()
	oldestIs := func(t *testing.T, got durable.Backlog) {
		t.Helper()
		if lo, hi := 10*time.Minute, 10*time.Minute+time.Since(began)+time.Second; got.Oldest < lo || got.Oldest > hi {
			t.Errorf("Oldest %v, want between %v and %v", got.Oldest, lo, hi)
		}
	}

	if got, _ := backlog(t); got != (durable.Backlog{Exact: true}) {
		t.Errorf("empty outbox: %+v, want {0 true 0}", got)
	}

	// Five published rows ahead of the head, older still, must not count.
	b.addOutbox(t, 5, `now() - interval '1 hour'`)
	if _, err := b.db.Exec(ctx, `UPDATE outbox SET published_at = now()`); err != nil {
		t.Fatal(err)
	}
	b.addOutbox(t, 1, `now() - interval '10 minutes'`)
	b.addOutbox(t, 9, `now()`)
	got, _ := backlog(t)
	if got.Pending != 10 || !got.Exact {
		t.Errorf("10 pending: %+v, want Pending 10, Exact", got)
	}
	oldestIs(t, got)

	b.addOutbox(t, durable.BacklogCap-10, `now()`)
	if got, _ := backlog(t); got.Pending != durable.BacklogCap || !got.Exact {
		t.Errorf("exactly BacklogCap pending: %+v, want Pending %d, Exact", got, durable.BacklogCap)
	}
	b.addOutbox(t, 1, `now()`)
	if got, _ := backlog(t); got.Pending != durable.BacklogCap || got.Exact {
		t.Errorf("BacklogCap+1 pending: %+v, want Pending %d, not Exact", got, durable.BacklogCap)
	}

	const total = 2_000_000
	start := time.Now()
	b.addOutbox(t, total-durable.BacklogCap-1, `now()`)
	t.Logf("inserted %d outbox rows in %v", total-durable.BacklogCap-1, time.Since(start).Round(time.Millisecond))
	for _, when := range []string{"first read", "second read"} {
		got, took := backlog(t)
		t.Logf("%d pending, %s: %+v in %v", total, when, got, took.Round(time.Millisecond))
		if got.Pending != durable.BacklogCap || got.Exact {
			t.Errorf("%d pending, %s: %+v, want Pending %d, not Exact", total, when, got, durable.BacklogCap)
		}
		oldestIs(t, got)
	}

	// The bound: the plan reads the partial index in order and stops at
	// the cap, whatever the (stale) statistics say.
	plan, err := durable.ExplainOutboxBacklog(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []planNode
	if err := json.Unmarshal(plan, &nodes); err != nil {
		t.Fatalf("plan %s: %v", plan, err)
	}
	for _, n := range nodes {
		n.walk(func(n planNode) {
			switch {
			case n.Type == "Seq Scan" || strings.HasPrefix(n.Type, "Bitmap") || strings.HasSuffix(n.Type, "Sort"):
				t.Errorf("plan has a %s node:\n%s", n.Type, plan)
			case strings.HasPrefix(n.Type, "Index") && n.Rows > durable.BacklogCap+1:
				t.Errorf("%s on %s returned %d rows, want at most BacklogCap+1", n.Type, n.Index, n.Rows)
			}
		})
	}
}

// planNode is one node of EXPLAIN (FORMAT JSON).
type planNode struct {
	Plan  *planNode  `json:"Plan"`
	Type  string     `json:"Node Type"`
	Index string     `json:"Index Name"`
	Rows  int64      `json:"Actual Rows"`
	Plans []planNode `json:"Plans"`
}

func (n planNode) walk(f func(planNode)) {
	if n.Plan != nil {
		n.Plan.walk(f)
		return
	}
	f(n)
	for _, c := range n.Plans {
		c.walk(f)
	}
}

// The review listing pages by BIGINT id on both sides of 2^31: the bound
// once typed int4 made after_id >= 2^31 fail.
func TestReviewsBigintPages(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	record := func(i int) {
		t.Helper()
		n := note(fmt.Sprintf("T-big%d", i), durable.PaySuccess, fmt.Sprintf("O-big%d", i), 100, "CNY")
		if err := b.store.RecordReview(ctx, n, durable.ReviewMerchantMismatch); err != nil {
			t.Fatal(err)
		}
	}
	record(1)
	record(2)
	// The next ids straddle 2^31.
	if _, err := b.db.Exec(ctx, `ALTER TABLE notify_review ALTER COLUMN id RESTART WITH 2147483647`); err != nil {
		t.Fatal(err)
	}
	record(3)
	record(4)
	record(5)
	ids := func(q durable.ReviewQuery) []int64 {
		t.Helper()
		rows, err := b.store.Reviews(ctx, q)
		if err != nil {
			t.Fatalf("Reviews(%+v): %v", q, err)
		}
		out := make([]int64, len(rows))
		for i, r := range rows {
			out[i] = r.ID
		}
		return out
	}
	const two31 = int64(1) << 31
	all := []int64{two31 + 1, two31, two31 - 1, 2, 1}
	for _, c := range []struct {
		q    durable.ReviewQuery
		want []int64
	}{
		{durable.ReviewQuery{}, all},
		{durable.ReviewQuery{AfterID: -1}, all},
		{durable.ReviewQuery{AfterID: 1 << 40}, all},
		{durable.ReviewQuery{AfterID: 1<<63 - 1}, all},
		{durable.ReviewQuery{AfterID: two31}, all[2:]},
		{durable.ReviewQuery{AfterID: two31 + 1, Limit: 2}, all[1:3]},
		{durable.ReviewQuery{AfterID: 2}, all[4:]},
		{durable.ReviewQuery{AfterID: 1}, []int64{}},
	} {
		if got := ids(c.q); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("Reviews(%+v) ids %v, want %v", c.q, got, c.want)
		}
	}

	if _, err := b.store.ResolveReview(ctx, two31, "fixed the merchant id", "ops@example"); err != nil {
		t.Fatalf("ResolveReview(2^31): %v", err)
	}
	for _, c := range []struct {
		q    durable.ReviewQuery
		want []int64
	}{
		{durable.ReviewQuery{State: durable.ReviewOpen, AfterID: 1 << 40}, []int64{two31 + 1, two31 - 1, 2, 1}},
		{durable.ReviewQuery{State: durable.ReviewResolved, AfterID: two31 + 1}, []int64{two31}},
		{durable.ReviewQuery{State: durable.ReviewResolved, AfterID: two31}, []int64{}},
		{durable.ReviewQuery{State: durable.ReviewAll, AfterID: two31 + 1}, all[1:]},
	} {
		if got := ids(c.q); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("Reviews(%+v) ids %v, want %v", c.q, got, c.want)
		}
	}
	if _, err := b.store.Reviews(ctx, durable.ReviewQuery{State: "closed"}); !errors.Is(err, durable.ErrInvalid) {
		t.Errorf("state closed: %v, want ErrInvalid", err)
	}

	// A reason filter keeps that reason's rows, on every page.
	if err := b.store.RecordReview(ctx, note("T-amt", durable.PaySuccess, "O-amt", 100, "CNY"), durable.ReviewAmountMismatch); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		q    durable.ReviewQuery
		want []int64
	}{
		{durable.ReviewQuery{State: durable.ReviewAll, Reason: durable.ReviewAmountMismatch}, []int64{two31 + 2}},
		{durable.ReviewQuery{State: durable.ReviewAll, Reason: durable.ReviewMerchantMismatch}, all},
		{durable.ReviewQuery{State: durable.ReviewAll, Reason: durable.ReviewMerchantMismatch, AfterID: two31 + 2, Limit: 2}, all[:2]},
		{durable.ReviewQuery{Reason: durable.ReviewMerchantMismatch}, []int64{two31 + 1, two31 - 1, 2, 1}},
		{durable.ReviewQuery{State: durable.ReviewResolved, Reason: durable.ReviewAmountMismatch}, []int64{}},
	} {
		if got := ids(c.q); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("Reviews(%+v) ids %v, want %v", c.q, got, c.want)
		}
	}
	if _, err := b.store.Reviews(ctx, durable.ReviewQuery{Reason: "LOST"}); !errors.Is(err, durable.ErrInvalid) {
		t.Errorf("reason LOST: %v, want ErrInvalid", err)
	}
}

// Scrapes and review calls run on the operator pool: with every callback
// connection busy they still answer, and they take none from callbacks.
func TestOpsPoolSeparate(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	n := note("T-ops", durable.PaySuccess, "O-ops", 100, "CNY")
	if err := b.store.RecordReview(ctx, n, durable.ReviewMerchantMismatch); err != nil {
		t.Fatal(err)
	}
	b.addOutbox(t, 3, `now()`)

	release, err := durable.HoldCallbackPool(ctx, b.store)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	// The control: a callback finds no connection now.
	pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = b.store.Process(pctx, n)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Process with the callback pool held: %v, want DeadlineExceeded", err)
	}

	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if open, err := b.store.OpenReviews(octx); err != nil || open[durable.ReviewMerchantMismatch] != 1 {
		t.Errorf("OpenReviews: %v %v, want 1 MERCHANT_MISMATCH", open, err)
	}
	if got, err := b.store.OutboxBacklog(octx); err != nil || got.Pending != 3 || !got.Exact {
		t.Errorf("OutboxBacklog: %+v %v, want 3 exact", got, err)
	}
	rows, err := b.store.Reviews(octx, durable.ReviewQuery{})
	if err != nil || len(rows) != 1 {
		t.Fatalf("Reviews: %v %v, want 1 row", rows, err)
	}
	if _, err := b.store.ResolveReview(octx, rows[0].ID, "fixed", "ops@example"); err != nil {
		t.Errorf("ResolveReview: %v", err)
	}
	// The orders API too: an order system never waits for a callback's
	// connection.
	if created, err := b.store.PutOrder(octx, "O-ops-put", 1999, "CNY", ""); err != nil || !created {
		t.Errorf("PutOrder: %v %v", created, err)
	}
	if err := b.store.PatchOrder(octx, "O-ops-put", 2999, "CNY"); err != nil {
		t.Errorf("PatchOrder: %v", err)
	}
	if r, err := b.store.OrderEvent(octx, "O-ops-put", durable.Close, "close-1"); err != nil || r.Outcome != durable.Applied {
		t.Errorf("OrderEvent: %+v %v", r, err)
	}
	if h, err := b.store.OrderHistory(octx, "O-ops-put", 0); err != nil || h.Status != durable.Closed {
		t.Errorf("OrderHistory: %+v %v", h.Order, err)
	}
	if st := durable.OpsPoolStat(b.store); st.MaxConns() != 4 || st.TotalConns() > 4 {
		t.Errorf("operator pool: max %d, open %d; want at most the default 4", st.MaxConns(), st.TotalConns())
	}

	// The two pools are told apart on the server.
	var apps []string
	rs, err := b.db.Query(ctx, `SELECT DISTINCT application_name FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE 'notifyedge%' ORDER BY 1`)
	if err == nil {
		for rs.Next() {
			var a string
			if err = rs.Scan(&a); err != nil {
				break
			}
			apps = append(apps, a)
		}
		rs.Close()
		err = rs.Err()
	}
	if err != nil || fmt.Sprint(apps) != "[notifyedge notifyedge-ops]" {
		t.Errorf("application names %v (%v), want [notifyedge notifyedge-ops]", apps, err)
	}
}

// The operator pool has timeouts of its own: a review resolution that
// waits on a lock longer than the callback budget still succeeds, and the
// operator lock_timeout, not the callback one, ends a longer wait. The
// callback pool's 500 ms leave room for its warm-up on a loaded machine;
// the waits are judged by the server's clock, not the test's sleeps.
func TestOpsPoolTimeouts(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	s := newStore(t, b.url, durable.Config{
		StatementTimeout: 500 * time.Millisecond,
		OpsLockTimeout:   2 * time.Second,
	})
	for _, c := range []struct {
		ops        bool
		name, want string
	}{
		{false, "statement_timeout", "500ms"},
		{false, "lock_timeout", "500ms"},
		{true, "statement_timeout", "5s"},
		{true, "lock_timeout", "2s"},
		{false, "plan_cache_mode", "force_generic_plan"},
		{true, "plan_cache_mode", "auto"},
		{false, "jit", "off"},
		{true, "jit", "off"},
	} {
		if got, err := durable.ShowSetting(ctx, s, c.ops, c.name); err != nil || got != c.want {
			t.Errorf("ops %v: %s = %q (%v), want %q", c.ops, c.name, got, err, c.want)
		}
	}

	for i := range 2 {
		n := note(fmt.Sprintf("T-lock%d", i), durable.PaySuccess, "O-lock", 100, "CNY")
		if err := s.RecordReview(ctx, n, durable.ReviewMerchantMismatch); err != nil {
			t.Fatal(err)
		}
	}
	lockReview := func(id int64) (release func()) {
		t.Helper()
		tx, err := b.db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT 1 FROM notify_review WHERE id = $1 FOR UPDATE`, id); err != nil {
			t.Fatal(err)
		}
		release = func() { _ = tx.Rollback(ctx) } // a second rollback is a no-op
		t.Cleanup(release)                        // a failed test must not hold the lock (and its pool) open
		return release
	}

	// Held until the resolution has waited twice the callback timeout on
	// the server, then released: it must still succeed.
	release := lockReview(1)
	resolved := make(chan error, 1)
	go func() {
		_, err := s.ResolveReview(ctx, 1, "fixed", "ops@example")
		resolved <- err
	}()
	durabletest.WaitLockWaiters(t, b.db, 1, "%notify_review%")
	wait.For(t, "the resolution waiting a second on the lock", func() (bool, string) {
		var waited bool
		if err := b.db.QueryRow(ctx, `SELECT coalesce(bool_or(clock_timestamp() - query_start > interval '1 second'), false)
			FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%notify_review%'`).Scan(&waited); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-resolved:
			t.Fatalf("ResolveReview gave up before waiting a second on the lock: %v", err)
		default:
		}
		return waited, "not a second yet"
	})
	release()
	if err := <-resolved; err != nil {
		t.Errorf("ResolveReview behind a lock held past the callback timeout: %v", err)
	}

	release = lockReview(2)
	defer release()
	start := time.Now()
	_, err := s.ResolveReview(ctx, 2, "fixed", "ops@example")
	if !errors.Is(err, durable.ErrTimeout) {
		t.Errorf("ResolveReview behind a held lock: %v, want ErrTimeout", err)
	}
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Errorf("ResolveReview gave up after %v, want the operator lock_timeout (2s)", took)
	}
}

// A re-drive resolves a row its own decision closed (resolved_by
// notifyedge), but one whose decision was a replay leaves such a row to the
// concurrent re-drive that decided it: only one answers "resolved", and it
// is the one that applied.
func TestResolveRedrivenLeavesAReplayOut(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	var id int64
	if err := b.db.QueryRow(ctx, `INSERT INTO notify_review (biz_key, order_no, reason, payload_hash, raw_body, resolved_at, resolution, resolved_by)
		VALUES ('acme:T-rr:PAY_SUCCESS', 'RR-1', 'AMOUNT_MISMATCH', repeat('0', 64), '{}', now(), 'applied', 'notifyedge') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.store.ResolveRedriven(ctx, id, "re-driven: applied", "ops-replayed", true); err != nil || ok {
		t.Errorf("a replaying re-drive took the row its concurrent re-drive closed: %v %v", ok, err)
	}
	if ok, err := b.store.ResolveRedriven(ctx, id, "re-driven: applied", "ops-applied", false); err != nil || !ok {
		t.Errorf("the deciding re-drive did not resolve the row: %v %v", ok, err)
	}
	if ok, err := b.store.ResolveRedriven(ctx, id, "re-driven: applied", "ops-late", false); err != nil || ok {
		t.Errorf("a row an operator resolved was resolved again: %v %v", ok, err)
	}
	var by string
	if err := b.db.QueryRow(ctx, `SELECT resolved_by FROM notify_review WHERE id = $1`, id).Scan(&by); err != nil {
		t.Fatal(err)
	}
	if by != "ops-applied" {
		t.Errorf("resolved by %q, want ops-applied", by)
	}
	// A row still open is resolved by a replaying re-drive too.
	if err := b.db.QueryRow(ctx, `INSERT INTO notify_review (biz_key, order_no, reason, payload_hash, raw_body)
		VALUES ('acme:T-rr2:PAY_SUCCESS', 'RR-2', 'AMOUNT_MISMATCH', repeat('0', 64), '{}') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.store.ResolveRedriven(ctx, id, "re-driven: applied", "ops-replayed", true); err != nil || !ok {
		t.Errorf("a replaying re-drive of an open row: %v %v", ok, err)
	}
}

// A PATCH that changes nothing changes nothing: the order's registration
// time and its reconciliation schedule stay; a real correction starts the
// schedule over.
func TestPatchUnchangedKeepsTheSchedule(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	if _, err := b.store.PutOrder(ctx, "P-SAME", 1000, "CNY", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(ctx, `UPDATE biz_order SET updated_at = now() - interval '1 hour', reconcile_at = now() + interval '1 hour', reconcile_step = 3 WHERE order_no = 'P-SAME'`); err != nil {
		t.Fatal(err)
	}
	read := func() (step int, scheduled bool, age time.Duration) {
		var at *time.Time
		var updated time.Time
		if err := b.db.QueryRow(ctx, `SELECT reconcile_step, reconcile_at, updated_at FROM biz_order WHERE order_no = 'P-SAME'`).Scan(&step, &at, &updated); err != nil {
			t.Fatal(err)
		}
		return step, at != nil, time.Since(updated)
	}
	if err := b.store.PatchOrder(ctx, "P-SAME", 1000, "CNY"); err != nil {
		t.Fatal(err)
	}
	if step, scheduled, age := read(); step != 3 || !scheduled || age < 50*time.Minute {
		t.Errorf("an unchanged PATCH: step %d, scheduled %v, registered %v ago; want all kept", step, scheduled, age)
	}
	if err := b.store.PatchOrder(ctx, "P-SAME", 1200, "CNY"); err != nil {
		t.Fatal(err)
	}
	if step, scheduled, age := read(); step != 0 || scheduled || age > 10*time.Minute {
		t.Errorf("a correction: step %d, scheduled %v, registered %v ago; want the schedule started over", step, scheduled, age)
	}
}

// A process other than edged names its pools' sessions (Config.Application)
// where the URL names none; a URL's own name wins.
func TestStoreApplicationName(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	names := func() []string {
		return b.strings(t, `SELECT DISTINCT application_name FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE 'app-test%'`)
	}
	s := newStore(t, b.url, durable.Config{Application: "app-test-shipper", NoMigrate: true})
	// An operator call opens the operator pool's first session; the
	// order need not exist.
	_ = s.PatchOrder(ctx, "O-none", 1, "CNY")
	if got := names(); !slices.Contains(got, "app-test-shipper") || !slices.Contains(got, "app-test-shipper-ops") {
		t.Errorf("sessions named %v, want app-test-shipper and its operator pool's app-test-shipper-ops", got)
	}
	sep := "?"
	if strings.Contains(b.url, "?") {
		sep = "&"
	}
	newStore(t, b.url+sep+"application_name=app-test-url", durable.Config{Application: "app-test-ignored", NoMigrate: true})
	if got := names(); slices.Contains(got, "app-test-ignored") || !slices.Contains(got, "app-test-url") {
		t.Errorf("sessions named %v: the URL's application_name must win", got)
	}
}
