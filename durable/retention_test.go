package durable_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// The retentions the tests run with: each table's own, so that a row aged
// between two of them shows which one applies.
const (
	claimKeep  = 48 * time.Hour
	outboxKeep = 72 * time.Hour
	reviewKeep = 96 * time.Hour
)

func testRetention() durable.RetentionConfig {
	return durable.RetentionConfig{ClaimRetention: claimKeep, OutboxRetention: outboxKeep, ReviewRetention: reviewKeep,
		Interval: 50 * time.Millisecond, MinPause: time.Millisecond}
}

// retention is one RunRetention in the background.
type retention struct {
	cycles  chan durable.RetentionCycle
	errs    chan error
	state   atomic.Value // "leader" or "standby"
	batches atomic.Int64 // batches that deleted rows
	stop    func()
}

// startRetention runs s.RunRetention(cfg) until the returned retention's
// stop (or the test's end); its callbacks feed the channels.
func startRetention(t *testing.T, s *durable.Store, cfg durable.RetentionConfig) *retention {
	t.Helper()
	r := &retention{cycles: make(chan durable.RetentionCycle, 1000), errs: make(chan error, 1000)}
	r.state.Store("")
	cfg.OnCycle = func(c durable.RetentionCycle) { r.cycles <- c }
	cfg.OnError = func(err error) { r.errs <- err }
	cfg.OnState = func(st string) { r.state.Store(st) }
	deleted := cfg.OnDeleted
	cfg.OnDeleted = func(table string, n int64) {
		r.batches.Add(1)
		if deleted != nil {
			deleted(table, n)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.RunRetention(ctx, cfg) }()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("RunRetention: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("RunRetention did not return within 10s of its context's end")
			}
		})
	}
	t.Cleanup(r.stop)
	return r
}

// cycle waits for the next cycle's end; a recovered error fails the test.
func (r *retention) cycle(t *testing.T) durable.RetentionCycle {
	t.Helper()
	return r.cycleWithin(t, 20*time.Second)
}

// cycleWithin is cycle, waiting up to d.
func (r *retention) cycleWithin(t *testing.T, d time.Duration) durable.RetentionCycle {
	t.Helper()
	select {
	case c := <-r.cycles:
		return c
	case err := <-r.errs:
		t.Fatalf("retention: %v", err)
	case <-time.After(d):
		t.Fatalf("no retention cycle within %s", d)
	}
	return durable.RetentionCycle{}
}

// retentionCycle runs one cycle with cfg and stops.
func retentionCycle(t *testing.T, s *durable.Store, cfg durable.RetentionConfig) durable.RetentionCycle {
	t.Helper()
	r := startRetention(t, s, cfg)
	defer r.stop()
	return r.cycle(t)
}

func (b *bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := b.db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func (b *bundle) strings(t *testing.T, sql string, args ...any) []string {
	t.Helper()
	rows, err := b.db.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	slices.Sort(out)
	return nilIfEmpty(out)
}

// hours is a Postgres interval of h hours, for aging rows.
func hours(h int) string { return fmt.Sprintf("%d hours", h) }

// Every table, every class of row, aged around each retention: exactly what
// is older than its own table's retention goes; what retention must never
// delete stays however old.
func TestRetentionDeletesOnlyWhatIsOld(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	claim := func(key, age string) {
		b.exec(t, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json, created_at)
			VALUES ($1, 'O-x', repeat('0', 64), 'DONE', '{}', now() - $2::interval)`, key, age)
	}
	outbox := func(label, createdAge string, publishedAge *string) {
		b.exec(t, `INSERT INTO outbox (topic, order_no, payload, created_at, published_at)
			VALUES ('ORDER_PAID', $1, '{}', now() - $2::interval, now() - $3::interval)`, label, createdAge, publishedAge)
	}
	inbox := func(consumer, age string) {
		b.exec(t, `INSERT INTO consumer_inbox (consumer, outbox_id, processed_at) VALUES ($1, 1, now() - $2::interval)`, consumer, age)
	}
	review := func(key, createdAge string, resolvedAge *string) {
		b.exec(t, `INSERT INTO notify_review (biz_key, order_no, reason, payload_hash, raw_body, created_at, resolved_at)
			VALUES ($1, 'O-x', 'UNKNOWN_ORDER', repeat('0', 64), '{}', now() - $2::interval, now() - $3::interval)`, key, createdAge, resolvedAge)
	}
	ptr := func(s string) *string { return &s }

	claim("claim-49h", hours(49))
	claim("claim-47h", hours(47))
	claim("claim-now", "0s")
	outbox("published-73h", hours(1000), ptr(hours(73)))
	outbox("published-71h", hours(1000), ptr(hours(71)))
	outbox("published-49h", hours(49), ptr(hours(49))) // past the claim retention only
	outbox("unpublished-1000h", hours(1000), nil)
	inbox("inbox-73h", hours(73))
	inbox("inbox-71h", hours(71))
	review("resolved-97h", hours(1000), ptr(hours(97)))
	review("resolved-95h", hours(1000), ptr(hours(95)))
	review("resolved-73h", hours(1000), ptr(hours(73))) // past the outbox retention only
	review("open-1000h", hours(1000), nil)
	b.exec(t, `INSERT INTO notify_trace (biz_key, traceparent, created_at) VALUES
		('trace-73h', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', now() - interval '73 hours'),
		('trace-71h', '00-4bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b7-01', now() - interval '71 hours')`)
	// An order, its payment and refunds, all long past every retention.
	b.seed(t, "O-old", durable.Refunded, 100, "test:T-old", 100, refund{"test:T-old", "R1", 40}, refund{"test:T-old", "", 60})
	b.exec(t, `UPDATE biz_order SET updated_at = now() - interval '5000 hours'`)
	b.exec(t, `UPDATE trade_refund SET created_at = now() - interval '5000 hours'`)
	// A delivery decided now, its rows aged past the claim retention but
	// within the outbox's.
	b.order(t, "O-paid", durable.PendingPay, 100, "CNY")
	process(t, b.store, note("T-paid", durable.PaySuccess, "O-paid", 100, "CNY"))
	b.exec(t, `UPDATE notify_claim SET created_at = now() - interval '50 hours' WHERE order_no = 'O-paid'`)
	b.exec(t, `UPDATE outbox SET published_at = now() - interval '50 hours', created_at = now() - interval '50 hours' WHERE order_no = 'O-paid'`)

	var deleted sync.Map
	cfg := testRetention()
	cfg.OnDeleted = func(table string, n int64) {
		v, _ := deleted.LoadOrStore(table, new(atomic.Int64))
		v.(*atomic.Int64).Add(n)
	}
	c := retentionCycle(t, b.store, cfg)

	want := map[string]int64{"notify_claim": 2, "outbox": 1, "consumer_inbox": 1, "notify_review": 1, "notify_trace": 1}
	if d := cmp.Diff(want, c.Deleted); d != "" {
		t.Errorf("cycle's deleted counts (-want +got):\n%s", d)
	}
	heard := map[string]int64{}
	deleted.Range(func(k, v any) bool { heard[k.(string)] = v.(*atomic.Int64).Load(); return true })
	if d := cmp.Diff(want, heard); d != "" {
		t.Errorf("OnDeleted (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"claim-47h", "claim-now"}, b.strings(t, `SELECT biz_key FROM notify_claim`)); d != "" {
		t.Errorf("claims kept (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"O-paid", "published-49h", "published-71h", "unpublished-1000h"},
		b.strings(t, `SELECT order_no FROM outbox`)); d != "" {
		t.Errorf("outbox rows kept (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"trace-71h"}, b.strings(t, `SELECT biz_key FROM notify_trace`)); d != "" {
		t.Errorf("trace contexts kept (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"inbox-71h"}, b.strings(t, `SELECT consumer FROM consumer_inbox`)); d != "" {
		t.Errorf("consumer-inbox rows kept (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"open-1000h", "resolved-73h", "resolved-95h"}, b.strings(t, `SELECT biz_key FROM notify_review`)); d != "" {
		t.Errorf("review rows kept (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"O-old", "O-paid"}, b.strings(t, `SELECT order_no FROM biz_order`)); d != "" {
		t.Errorf("orders (-want +got):\n%s", d)
	}
	if _, refunded, refunds := b.money(t, "O-old"); refunded != 100 || len(refunds) != 2 {
		t.Errorf("O-old after retention: refunded %d, refunds %v", refunded, refunds)
	}
	var status string
	if err := b.db.QueryRow(ctx, `SELECT status FROM biz_order WHERE order_no = 'O-paid'`).Scan(&status); err != nil || status != "PAID" {
		t.Errorf("O-paid: %q, %v", status, err)
	}
}

// A delivery that arrives after retention deleted its claim is decided
// again by the state machine: a payment already applied is skipped with no
// alarm, and a refund already applied is skipped, never applied twice.
func TestRetentionLateDeliveries(t *testing.T) {
	b := setup(t)
	// O-1: paid by T-1, partly refunded by refund R-1.
	b.order(t, "O-1", durable.PendingPay, 100, "CNY")
	pay := note("T-1", durable.PaySuccess, "O-1", 100, "CNY")
	part := refundNote("T-1", "R-1", "O-1", 100, 30, false)
	// O-2: paid by T-2, refunded in full by a refund without an id.
	b.order(t, "O-2", durable.PendingPay, 100, "CNY")
	pay2 := note("T-2", durable.PaySuccess, "O-2", 100, "CNY")
	full := note("T-2", durable.RefundSuccess, "O-2", 100, "CNY")
	for _, n := range []durable.Notification{pay, part, pay2, full} {
		if r := process(t, b.store, n); r.Outcome != durable.Applied {
			t.Fatalf("%s: %+v, want applied", n.BizKey, r)
		}
	}
	topics1, topics2 := b.topics(t, "O-1"), b.topics(t, "O-2")
	b.exec(t, `UPDATE notify_claim SET created_at = now() - interval '200 hours'`)
	if c := retentionCycle(t, b.store, testRetention()); c.Deleted["notify_claim"] != 4 {
		t.Fatalf("deleted %v, want the 4 claims", c.Deleted)
	}
	if n := b.count(t, `SELECT count(*) FROM notify_claim`); n != 0 {
		t.Fatalf("%d claims left", n)
	}

	for _, tc := range []struct {
		n      durable.Notification
		status durable.State
	}{{pay, durable.Paid}, {part, durable.Paid}, {pay2, durable.Refunded}, {full, durable.Refunded}} {
		r := process(t, b.store, tc.n)
		if r.Outcome != durable.Skipped || r.Replayed || r.Status != tc.status || r.Review != "" {
			t.Errorf("late %s: %+v, want skipped on %s, no review", tc.n.BizKey, r, tc.status)
		}
	}
	if got := b.reviews(t, "O-1"); got != nil {
		t.Errorf("O-1 reviews %v, want none (no DUPLICATE_PAYMENT for the payer's own late duplicate)", got)
	}
	if got := b.reviews(t, "O-2"); got != nil {
		t.Errorf("O-2 reviews %v, want none", got)
	}
	payer, refunded, refunds := b.money(t, "O-1")
	if d := cmp.Diff([]refund{{"test:T-1", "R-1", 30}}, refunds); payer != "test:T-1" || refunded != 30 || d != "" {
		t.Errorf("O-1: payer %q, refunded %d, refunds (-want +got):\n%s", payer, refunded, d)
	}
	payer, refunded, refunds = b.money(t, "O-2")
	if d := cmp.Diff([]refund{{"test:T-2", "", 100}}, refunds); payer != "test:T-2" || refunded != 100 || d != "" {
		t.Errorf("O-2: payer %q, refunded %d, refunds (-want +got):\n%s", payer, refunded, d)
	}
	if got := b.topics(t, "O-1"); !slices.Equal(got, topics1) {
		t.Errorf("O-1 topics %v, want %v (nothing new)", got, topics1)
	}
	if got := b.topics(t, "O-2"); !slices.Equal(got, topics2) {
		t.Errorf("O-2 topics %v, want %v (nothing new)", got, topics2)
	}
	// The late deliveries hold claims again, with the skip as their result.
	if n := b.count(t, `SELECT count(*) FROM notify_claim WHERE strpos(result_json, '"outcome":"skipped"') > 0`); n != 4 {
		t.Errorf("%d skipped claims, want 4", n)
	}
}

// One node leads at a time, the others stand by without waiting on a lock
// (no snapshot held); the leader's lock goes with its context, and a
// standby takes over. Retention's lock is not the relay's: both lead at
// once.
func TestRetentionOneLeader(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayState := make(chan string, 10)
	relayDone := make(chan struct{})
	go func() {
		defer close(relayDone)
		b.store.RunRelay(relayCtx, durable.RelayConfig{Publisher: discard{}, OnState: func(s string) { relayState <- s }})
	}()
	defer func() { stopRelay(); <-relayDone }()
	waitFor(t, "the relay leads", func() bool {
		select {
		case s := <-relayState:
			return s == "running"
		default:
			return false
		}
	})

	nodes := []*retention{startRetention(t, b.store, testRetention()), startRetention(t, newStore(t, b.url, durable.Config{}), testRetention())}
	leaders := func() (n int, who int) {
		for i, r := range nodes {
			if r.state.Load() == "leader" {
				n, who = n+1, i
			}
		}
		return n, who
	}
	waitFor(t, "a leader", func() bool { n, _ := leaders(); return n == 1 })
	_, first := leaders()
	other := 1 - first

	// Old rows keep coming; for a while only the leader deletes them, and
	// the standby never waits on the lock.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		b.exec(t, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, created_at)
			SELECT 'k' || g || '-' || clock_timestamp(), 'O', repeat('0', 64), 'DONE', now() - interval '100 hours' FROM generate_series(1, 5) g`)
		if n, _ := leaders(); n != 1 {
			t.Fatalf("%d leaders", n)
		}
		if n := b.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`); n != 0 {
			t.Fatalf("%d sessions wait on an advisory lock", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if nodes[first].batches.Load() == 0 || nodes[other].batches.Load() != 0 {
		t.Fatalf("batches: leader %d, standby %d", nodes[first].batches.Load(), nodes[other].batches.Load())
	}
	held := b.count(t, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE '%-retention'`)
	if held != 1 {
		t.Errorf("%d retention sessions hold an advisory lock, want 1", held)
	}

	// The leader stops: its lock is released and the other takes over.
	nodes[first].stop()
	waitFor(t, "the standby to take over", func() bool { return nodes[other].state.Load() == "leader" })
	b.exec(t, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, created_at)
		VALUES ('after-takeover', 'O', repeat('0', 64), 'DONE', now() - interval '100 hours')`)
	// The row goes before the cycle that deleted it reports: wait for both.
	waitFor(t, "the new leader to delete", func() bool {
		return b.count(t, `SELECT count(*) FROM notify_claim WHERE biz_key = 'after-takeover'`) == 0 && nodes[other].batches.Load() > 0
	})
	select {
	case s := <-relayState:
		t.Errorf("relay state changed to %q while retention changed leaders", s)
	default:
	}
}

type discard struct{}

func (discard) Publish(context.Context, []durable.OutboxMessage) error { return nil }

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	wait.For(t, what, func() (bool, string) { return ok(), "not yet" })
}

// A row another transaction holds is skipped, not waited for: the cycle
// deletes the rest while the row is still held (so it did not wait for
// it, however slow the machine), and the next cycle takes it once it is
// free.
func TestRetentionSkipsLockedRows(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.exec(t, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, created_at)
		SELECT 'k' || g, 'O', repeat('0', 64), 'DONE', now() - interval '100 hours' FROM generate_series(1, 5) g`)
	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM notify_claim WHERE biz_key = 'k3' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	r := startRetention(t, b.store, testRetention())
	if c := r.cycle(t); c.Deleted["notify_claim"] != 4 {
		t.Errorf("with k3 locked: deleted %v, want the 4 others", c.Deleted)
	}
	if got := b.strings(t, `SELECT biz_key FROM notify_claim`); !slices.Equal(got, []string{"k3"}) {
		t.Errorf("left %v, want [k3]", got)
	}
	tx.Rollback(ctx)
	for b.count(t, `SELECT count(*) FROM notify_claim`) != 0 {
		r.cycle(t)
	}
}

// A batch that cannot get its table lock gives up after LockTimeout (and
// retries later), rather than queueing, with callbacks queueing behind it,
// until its statement_timeout.
func TestRetentionLockTimeout(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.exec(t, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, created_at)
		VALUES ('old', 'O', repeat('0', 64), 'DONE', now() - interval '100 hours')`)
	// What a migration's plain CREATE INDEX holds: SHARE, which the DELETE's
	// ROW EXCLUSIVE waits for.
	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `LOCK TABLE notify_claim IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	cfg := testRetention()
	cfg.LockTimeout, cfg.StatementTimeout, cfg.Interval = 100*time.Millisecond, 5*time.Second, 200*time.Millisecond
	r := startRetention(t, b.store, cfg)
	select {
	case err := <-r.errs:
		if !errors.Is(err, durable.ErrTimeout) || !strings.Contains(err.Error(), "notify_claim") {
			t.Errorf("error %v, want ErrTimeout naming notify_claim", err)
		}
		// The server says which timeout ended it: lock_not_available is
		// lock_timeout's; statement_timeout's is query_canceled.
		if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "55P03" {
			t.Errorf("error %v, want lock_timeout's SQLSTATE 55P03 (lock_not_available)", err)
		}
	case c := <-r.cycles:
		t.Fatalf("a cycle ended behind the table lock: %v", c.Deleted)
	case <-time.After(wait.Timeout):
		t.Fatalf("no error within %v", wait.Timeout)
	}
	tx.Rollback(ctx)
	waitFor(t, "the retry to delete", func() bool { return b.count(t, `SELECT count(*) FROM notify_claim`) == 0 })
}

// Batches are at most Batch rows; a backlog takes several, one after the
// other, in one cycle.
func TestRetentionBatches(t *testing.T) {
	b := setup(t)
	b.exec(t, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, created_at)
		SELECT 'k' || g, 'O', repeat('0', 64), 'DONE', now() - interval '100 hours' - g * interval '1 second'
		  FROM generate_series(1, 35) g`)
	var mu sync.Mutex
	var sizes []int64
	cfg := testRetention()
	cfg.Batch = 10
	cfg.OnDeleted = func(_ string, n int64) { mu.Lock(); sizes = append(sizes, n); mu.Unlock() }
	c := retentionCycle(t, b.store, cfg)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(sizes, []int64{10, 10, 10, 5}) || c.Deleted["notify_claim"] != 35 {
		t.Errorf("batches %v, deleted %v; want 10, 10, 10, 5", sizes, c.Deleted)
	}
}

// A batch once begun runs to its end and is counted, even when the leader
// is stopped while it runs: stopped midway, a DELETE that committed would
// go uncounted. Here the stop comes after the pause before the first
// batch, as that batch begins.
func TestRetentionBatchOutlivesItsStop(t *testing.T) {
	b := setup(t)
	b.exec(t, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, created_at)
		SELECT 'k' || g, 'O', repeat('0', 64), 'DONE', now() - interval '100 hours' - g * interval '1 second'
		  FROM generate_series(1, 35) g`)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var deleted atomic.Int64
	cfg := testRetention()
	cfg.Batch = 10
	cfg.OnDeleted = func(_ string, n int64) { deleted.Add(n) }
	var pauses atomic.Int64
	cfg = durable.WithRetentionClock(cfg, nil, func(ctx context.Context, d time.Duration) bool {
		if pauses.Add(1) == 1 {
			stop() // the first pause ends as the leader is stopped
			return true
		}
		return ctx.Err() == nil
	})
	if err := b.store.RunRetention(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	var left int64
	if err := b.db.QueryRow(context.Background(), `SELECT count(*) FROM notify_claim`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 25 || deleted.Load() != 10 {
		t.Errorf("stopped as its first batch began: %d claims left of 35, %d counted deleted; want the batch's 10 deleted and counted", left, deleted.Load())
	}
}

// The tables are walked side by side, each on its own schedule: a backlog
// of claims does not hold the outbox's deletions back until it is worked
// off.
func TestRetentionWalksTablesSideBySide(t *testing.T) {
	b := setup(t)
	b.exec(t, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, created_at)
		SELECT 'k' || g, 'O', repeat('0', 64), 'DONE', now() - interval '100 hours' - g * interval '1 second'
		  FROM generate_series(1, 60) g`)
	b.exec(t, `INSERT INTO outbox (topic, order_no, payload, created_at, published_at)
		SELECT 'ORDER_PAID', 'O', '{}', now() - interval '100 hours', now() - interval '100 hours' + g * interval '1 second'
		  FROM generate_series(1, 60) g`)
	var mu sync.Mutex
	var order []string
	cfg := testRetention()
	cfg.Batch = 10
	cfg.OnDeleted = func(table string, _ int64) { mu.Lock(); order = append(order, table); mu.Unlock() }
	c := retentionCycle(t, b.store, cfg)
	mu.Lock()
	defer mu.Unlock()
	if c.Deleted[durable.TableClaim] != 60 || c.Deleted[durable.TableOutbox] != 60 {
		t.Fatalf("deleted %v, want 60 claims and 60 outbox rows", c.Deleted)
	}
	// Six batches each; the outbox's first comes before the claims' last.
	firstOutbox := slices.Index(order, durable.TableOutbox)
	lastClaim := -1
	for i, table := range order {
		if table == durable.TableClaim {
			lastClaim = i
		}
	}
	if firstOutbox < 0 || firstOutbox > lastClaim {
		t.Errorf("batches in the order %v: the outbox waited for every claim", order)
	}
}

// A claim retention under the channels' retry window is refused, before
// anything runs; zero fields take the defaults.
func TestRetentionConfig(t *testing.T) {
	for _, bad := range []durable.RetentionConfig{{ClaimRetention: 24 * time.Hour}, {ClaimRetention: time.Minute}} {
		err := durable.ValidateRetention(bad)
		if err == nil || !strings.Contains(err.Error(), "claim retention") {
			t.Errorf("ValidateRetention(%v): %v, want a refusal naming the claim retention", bad.ClaimRetention, err)
		}
	}
	if err := durable.ValidateRetention(durable.RetentionConfig{OutboxRetention: -time.Hour}); err == nil {
		t.Error("a negative outbox retention accepted")
	}
	for _, ok := range []durable.RetentionConfig{{}, {ClaimRetention: durable.MinClaimRetention}} {
		if err := durable.ValidateRetention(ok); err != nil {
			t.Errorf("ValidateRetention(%+v): %v", ok, err)
		}
	}
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.store.RunRetention(ctx, durable.RetentionConfig{ClaimRetention: 24 * time.Hour}); err == nil || ctx.Err() != nil {
		t.Errorf("RunRetention with 24h: %v after %v, want an error at once", err, ctx.Err())
	}
}

// OldestRowAges reads the oldest row of each kind retention deletes, and
// nothing of the kinds it never deletes.
func TestOldestRowAges(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	ages, err := b.store.OldestRowAges(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[string]time.Duration{"notify_claim": 0, "outbox": 0, "consumer_inbox": 0, "notify_review": 0, "notify_trace": 0}, ages); d != "" {
		t.Errorf("empty database (-want +got):\n%s", d)
	}
	// The oldest claim is named by an open review: retention keeps it, so
	// it is not the oldest row retention may delete.
	b.exec(t, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, created_at)
		VALUES ('a', 'O', repeat('0', 64), 'DONE', now() - interval '10 hours'), ('b', 'O', repeat('0', 64), 'DONE', now()),
		       ('held', 'O', repeat('0', 64), 'DONE', now() - interval '1000 hours')`)
	// The outbox's is its first row's, by id (the relay publishes in id
	// order): an unpublished row behind it does not count.
	b.exec(t, `INSERT INTO outbox (topic, order_no, payload, created_at, published_at) VALUES
		('ORDER_PAID', 'O', '{}', now() - interval '800 hours', now() - interval '20 hours'),
		('ORDER_PAID', 'O', '{}', now() - interval '900 hours', NULL)`)
	b.exec(t, `INSERT INTO consumer_inbox (consumer, outbox_id, processed_at) VALUES ('c', 1, now() - interval '30 hours')`)
	b.exec(t, `INSERT INTO notify_review (biz_key, order_no, reason, payload_hash, raw_body, created_at, resolved_at) VALUES
		('open', 'O', 'UNKNOWN_ORDER', repeat('0', 64), '{}', now() - interval '900 hours', NULL),
		('held', 'O', 'PAYLOAD_CONFLICT', repeat('0', 64), '{}', now() - interval '900 hours', NULL),
		('done', 'O', 'UNKNOWN_ORDER', repeat('0', 64), '{}', now() - interval '900 hours', now() - interval '40 hours')`)
	b.exec(t, `INSERT INTO notify_trace (biz_key, traceparent, created_at) VALUES
		('t1', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', now() - interval '50 hours'),
		('t2', '00-4bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b7-01', now())`)
	if ages, err = b.store.OldestRowAges(ctx); err != nil {
		t.Fatal(err)
	}
	for table, h := range map[string]int{"notify_claim": 10, "outbox": 20, "consumer_inbox": 30, "notify_review": 40, "notify_trace": 50} {
		if got := ages[table]; got < time.Duration(h)*time.Hour || got > time.Duration(h)*time.Hour+time.Minute {
			t.Errorf("%s: %v, want %dh", table, got, h)
		}
	}
	// Once the first row is gone, the outbox's head is unpublished: the
	// relay is behind, not retention.
	b.exec(t, `DELETE FROM outbox WHERE published_at IS NOT NULL`)
	if ages, err = b.store.OldestRowAges(ctx); err != nil {
		t.Fatal(err)
	}
	if ages["outbox"] != 0 {
		t.Errorf("outbox with an unpublished head: %v, want 0", ages["outbox"])
	}
}

// The outbox is walked in id order: a batch deletes its old published
// rows and steps over an unpublished one; the cycle ends at the first
// batch whose last row is not old enough. Unpublished rows stay, however
// old.
func TestRetentionOutboxInIDOrder(t *testing.T) {
	b := setup(t)
	insert := func(n int, published string) {
		b.exec(t, `INSERT INTO outbox (topic, order_no, payload, created_at, published_at)
			SELECT 'ORDER_PAID', 'O', '{}', now() - interval '1000 hours', now() - $2::interval FROM generate_series(1, $1::int)`, n, published)
	}
	insert(15, "100 hours")
	b.exec(t, `INSERT INTO outbox (topic, order_no, payload, created_at) VALUES ('ORDER_PAID', 'unpublished', '{}', now() - interval '1000 hours')`)
	insert(15, "100 hours")
	insert(3, "1 hour")
	insert(2, "100 hours") // behind young rows, but in the same batch
	var mu sync.Mutex
	var sizes []int64
	cfg := testRetention()
	cfg.Batch = 10
	cfg.OnDeleted = func(_ string, n int64) { mu.Lock(); sizes = append(sizes, n); mu.Unlock() }
	r := startRetention(t, b.store, cfg)
	// Ids 1-15 old, 16 unpublished, 17-31 old, 32-34 young, 35-36 old:
	// 1-10, 11-20 but 16, 21-30, then 31-36 ends with an old row but is
	// short: 31, 35, 36.
	if c := r.cycle(t); c.Deleted["outbox"] != 32 {
		t.Errorf("cycle deleted %d outbox rows, want 32", c.Deleted["outbox"])
	}
	r.stop()
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(sizes, []int64{10, 9, 10, 3}) {
		t.Errorf("batches %v, want 10, 9, 10, 3", sizes)
	}
	if got := b.strings(t, `SELECT order_no || CASE WHEN published_at IS NULL THEN ' unpublished' ELSE '' END FROM outbox`); len(got) != 4 ||
		!slices.Contains(got, "unpublished unpublished") {
		t.Errorf("outbox left %v, want the unpublished row and the 3 young ones", got)
	}
}

// A batch walks the retention column's index from its low end and deletes
// by TID (for a claim, probing the open reviews of its key by index);
// OldestRowAges probes the same indexes: neither scans a table,
// planned with the parameters' values or generically (what the retention
// connection's statement cache may switch to).
func TestRetentionPlans(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.exec(t, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, created_at)
		SELECT 'k' || g, 'O', repeat('0', 64), 'DONE', now() - g * interval '1 minute' FROM generate_series(1, 20000) g`)
	b.exec(t, `INSERT INTO outbox (topic, order_no, payload, created_at, published_at)
		SELECT 'ORDER_PAID', 'O', '{}', now(), CASE WHEN g % 10 = 0 THEN NULL ELSE now() - g * interval '1 minute' END
		  FROM generate_series(1, 20000) g`)
	b.exec(t, `INSERT INTO consumer_inbox (consumer, outbox_id, processed_at)
		SELECT 'c', g, now() - g * interval '1 minute' FROM generate_series(1, 20000) g`)
	b.exec(t, `INSERT INTO notify_review (biz_key, order_no, reason, payload_hash, raw_body, resolved_at)
		SELECT 'k' || g, 'O', 'UNKNOWN_ORDER', repeat('0', 64), '{}', CASE WHEN g % 10 = 0 THEN NULL ELSE now() - g * interval '1 minute' END
		  FROM generate_series(1, 20000) g`)
	b.exec(t, `ANALYZE`)
	index := map[string]string{"notify_claim": "notify_claim_created_at_idx", "outbox": "outbox_pkey",
		"consumer_inbox": "consumer_inbox_processed_at_idx", "notify_review": "notify_review_resolved_at_idx"}
	for _, table := range durable.RetentionTables {
		for _, generic := range []bool{false, true} {
			plan, err := durable.ExplainRetentionBatch(ctx, b.store, table, generic)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(plan, "Index Scan using "+index[table]) || !strings.Contains(plan, "Tid Scan") || strings.Contains(plan, "Seq Scan") {
				t.Errorf("%s batch (generic %v) neither walks %s nor deletes by TID:\n%s", table, generic, index[table], plan)
			}
			// The settings above price a disabled step at 10^10, past
			// jit_above_cost: an outbox batch compiled 35 functions, 140 ms
			// of CPU, to run 2 ms of index walk and delete.
			if strings.Contains(plan, "JIT") {
				t.Errorf("%s batch (generic %v) is compiled:\n%s", table, generic, plan)
			}
			// A claim an open review names is spared: one index probe each.
			if table == "notify_claim" && !strings.Contains(plan, "using notify_review_open_uniq") {
				t.Errorf("claim batch (generic %v) does not probe notify_review_open_uniq:\n%s", generic, plan)
			}
		}
	}
	plan, err := durable.ExplainOldestRowAges(ctx, b.store)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plan, "JIT") {
		t.Errorf("OldestRowAges is compiled:\n%s", plan)
	}
	for _, idx := range append(slices.Collect(maps.Values(index)), "notify_review_open_uniq") {
		if !strings.Contains(plan, idx) || strings.Contains(plan, "Seq Scan") {
			t.Errorf("OldestRowAges does not probe %s:\n%s", idx, plan)
		}
	}
}

// The retention leader's planner has nothing but index scans and nested
// loops. On a day of backlog among a week of claims (4.3 of 35 million),
// planned generically, a claim batch hashed the open reviews, anti-joined
// every expired claim and sorted them all before taking the first thousand:
// 2.4 s a batch, 400 rows a second, where walking the index takes 3 ms. The
// plan a small test table gets is the walk either way (TestRetentionPlans);
// this holds the settings that keep it on a big one.
func TestRetentionSessionWalksIndexes(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	for _, name := range []string{"enable_seqscan", "enable_bitmapscan", "enable_sort", "enable_hashjoin", "enable_mergejoin", "enable_material"} {
		if v, err := durable.RetentionSetting(ctx, b.store, name); err != nil || v != "off" {
			t.Errorf("retention session: %s = %q (%v), want off", name, v, err)
		}
	}
	if v, err := durable.RetentionSetting(ctx, b.store, "jit"); err != nil || v != "off" {
		t.Errorf("retention session: jit = %q (%v), want off", v, err)
	}
	if v, err := durable.RetentionSetting(ctx, b.store, "application_name"); err != nil || !strings.HasSuffix(v, "-retention") {
		t.Errorf("retention session: application_name = %q (%v)", v, err)
	}
}

// A backlog's catch-up writes at most CheckpointShare of the checkpoints'
// WAL rate: with a small share, the batches of a backlog of old rows wait
// as that rate asks, and with a share too large to matter they do not;
// but rows that keep up with the inserts are never held to it. The waits
// are recorded, not slept: they add up, and the longest is the whole
// cycle's schedule less the little real time it took.
func TestRetentionCatchUpKeepsToItsWALShare(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	// No other session's WAL meanwhile, autovacuum's included: what the
	// cap is held to here is the deletes' own.
	b.exec(t, `ALTER TABLE notify_claim SET (autovacuum_enabled = false)`)
	rate, err := durable.CheckpointWALRate(ctx, b.store)
	if err != nil {
		t.Fatal(err)
	}
	// The server's defaults give about 1.9 MB a second.
	if rate < 1<<10 {
		t.Fatalf("checkpoint WAL rate %v bytes a second; the settings were not read", rate)
	}
	const walCap = 20 << 10 // 20 KiB a second
	const rows = 5000
	for _, c := range []struct {
		name string
		// apart is the rows' created_at step: 1 s is a backlog (1 row a
		// second inserted), 1 ms keeps up with 1,000 a second.
		apart string
		share float64
	}{
		{"capped backlog", "1 second", walCap / rate},
		{"uncapped backlog", "1 second", 1e9},
		{"keeping up", "1 millisecond", walCap / rate},
	} {
		b.exec(t, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, created_at)
			SELECT 'k' || g, 'O', repeat('0', 64), 'DONE', now() - interval '100 hours' - g * $1::interval
			  FROM generate_series(1, $2::int) g`, c.apart, rows)
		var mu sync.Mutex
		var longest time.Duration
		cfg := testRetention()
		cfg.Batch = 100
		cfg.CatchUpRate = 1e9
		cfg.CheckpointShare = c.share
		cfg = durable.WithRetentionClock(cfg, nil, func(ctx context.Context, d time.Duration) bool {
			mu.Lock()
			longest = max(longest, d)
			mu.Unlock()
			return ctx.Err() == nil
		})
		cycle := retentionCycle(t, b.store, cfg)
		mu.Lock()
		got := longest
		mu.Unlock()
		if cycle.Deleted[durable.TableClaim] != rows {
			t.Fatalf("%s: deleted %v, want %d claims", c.name, cycle.Deleted, rows)
		}
		// A claim's delete writes 100 bytes of WAL or more.
		if cycle.WAL < rows*80 {
			t.Fatalf("%s: the cycle's WAL is %d bytes for %d claims", c.name, cycle.WAL, rows)
		}
		switch c.name {
		case "capped backlog":
			// Inserted at 1 a second, caught up at walCap over the WAL
			// per row: the rows' schedule is rows/(1 + walCap/perRow).
			perRow := float64(cycle.WAL) / rows
			need := time.Duration(rows / (1 + walCap/perRow) * float64(time.Second))
			if got < need/2 || got > need*3/2 {
				t.Errorf("%s: the longest wait was %v; %d claims at %.0f bytes of WAL each, at %d bytes a second, need about %v",
					c.name, got, rows, perRow, walCap, need)
			}
		case "uncapped backlog":
			if got > time.Second {
				t.Errorf("%s: the longest wait was %v, want none to speak of", c.name, got)
			}
		case "keeping up":
			// 1,000 a second inserted: 5 s at that rate, whatever the
			// cap, and never the cap's 30 s or more.
			if got > 6*time.Second {
				t.Errorf("%s: the longest wait was %v, want at most the insert rate's %v", c.name, got, 5*time.Second)
			}
		}
	}
}

// A batch is charged its own WAL only: another session writing fast while
// a cycle runs, as callbacks do, is left out of the deletes' WAL per row,
// which would otherwise hold the catch-up lowest when the callbacks are
// busiest. The writer's rate is read in the pauses between batches, so the
// batches here are kept MinPause apart for real (the waits are short).
func TestRetentionChargesOnlyItsOwnWAL(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.exec(t, `CREATE TABLE wal_noise (v text)`)
	const rows = 5000
	cfg := testRetention()
	cfg.Batch = 100
	cfg.MinPause = 20 * time.Millisecond
	cfg.CatchUpRate = 1e9
	cfg.CheckpointShare = 1e9 // no cap: the WAL is measured, not obeyed
	position := func() int64 {
		var pos int64
		if err := b.db.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::int8`).Scan(&pos); err != nil {
			t.Fatal(err)
		}
		return pos
	}
	// cycle deletes rows claims and returns the cycle and all the WAL the
	// server wrote meanwhile, everyone's.
	cycle := func() (durable.RetentionCycle, int64) {
		b.exec(t, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, created_at)
			SELECT 'k' || g, 'O', repeat('0', 64), 'DONE', now() - interval '100 hours' - g * interval '1 second'
			  FROM generate_series(1, $1::int) g`, rows)
		from := position()
		c := retentionCycle(t, b.store, cfg)
		if c.Deleted[durable.TableClaim] != rows {
			t.Fatalf("deleted %v, want %d claims", c.Deleted, rows)
		}
		return c, position() - from
	}
	quiet, _ := cycle()

	// About 21 KB of WAL a statement, back to back, until the test ends.
	nctx, stopNoise := context.WithCancel(ctx)
	var noise sync.WaitGroup
	var noiseErr error
	noise.Add(1)
	go func() {
		defer noise.Done()
		for nctx.Err() == nil {
			if _, err := b.db.Exec(nctx, `INSERT INTO wal_noise SELECT repeat(md5(g::text), 32) FROM generate_series(1, 20) g`); err != nil && nctx.Err() == nil {
				noiseErr = err
				return
			}
		}
	}()
	t.Cleanup(func() { stopNoise(); noise.Wait() })
	if !wait.Within(10*time.Second, func() bool { return b.count(t, `SELECT count(*) FROM wal_noise`) > 0 }) {
		t.Fatal("the writer wrote nothing within 10s")
	}
	noisy, all := cycle()
	stopNoise()
	noise.Wait()
	if noiseErr != nil {
		t.Fatalf("the writer: %v", noiseErr)
	}

	quietPer, noisyPer, othersPer := float64(quiet.WAL)/rows, float64(noisy.WAL)/rows, float64(noisy.OthersWAL)/rows
	t.Logf("WAL a claim: %.0f bytes alone, %.0f beside the writer, which wrote %.0f a claim meanwhile", quietPer, noisyPer, othersPer)
	// With less of the writer's WAL to leave out than retention's own,
	// the test shows nothing; with none, nothing was left out.
	if othersPer < quietPer {
		t.Fatalf("the writer's WAL left out was %.0f bytes a claim, against retention's %.0f alone", othersPer, quietPer)
	}
	// The rate read in the gaps is not the rate beside a batch: on a busy
	// machine the writer gets more or less of the CPU while a batch runs,
	// so the charge misses retention's own figure either way. What must
	// hold is that it misses by far less than the writer's WAL it left out;
	// a meter that subtracted a small part of the others' rate would not.
	if miss := math.Abs(noisyPer - quietPer); miss > quietPer+othersPer/2 {
		t.Errorf("beside the writer, a claim was charged %.0f bytes of WAL against %.0f alone: off by %.0f, with %.0f of the writer's left out",
			noisyPer, quietPer, miss, othersPer)
	}
	// What was left out ran beside the batches, a small part of the cycle:
	// it cannot pass all the server wrote. (The estimate may err low, below
	// retention's own: on a busy machine the writer gets more of the CPU in
	// the gaps than beside a batch.)
	if noisy.OthersWAL > all {
		t.Errorf("left out %d bytes of others' WAL, more than the %d the server wrote over the whole cycle", noisy.OthersWAL, all)
	}
}

// fakeClock is a retention leader's clock that moves only when it sleeps,
// by what it sleeps.
type fakeClock struct {
	mu sync.Mutex
	at time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at
}

func (c *fakeClock) sleep(ctx context.Context, d time.Duration) bool {
	c.mu.Lock()
	c.at = c.at.Add(max(d, 0))
	c.mu.Unlock()
	return ctx.Err() == nil
}

// A cycle's cutoffs move on with the clock: the rows that age out while a
// cycle runs go in that cycle, not a sleep later, so that a row is deleted
// about Interval past its retention however long cycles take. A cycle
// that cannot catch up still ends, RetentionCycleMax after it began. The
// rows age out at a steady rate from 10 s before the cycle; the claims'
// pacing (a small catch-up) makes the cycle's time, on a clock that moves
// only by the waits it asks for. The outbox, walked by id, starts its head
// again where rows too young for it before may be old enough now; a table
// with a few rows, done at once, keeps up while the claims hold the cycle
// open.
func TestRetentionCutoffMovesOnWithTheClock(t *testing.T) {
	// The rows, by table: $1 the retention, $2 how many, $3 the spacing in
	// ms; row g is named 'k' || g and ages out g * $3 - 9950 ms after the
	// insert, 50 ms off the tenth of a second, so that none sits on a
	// cutoff.
	inserts := map[string]string{
		durable.TableClaim: `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, created_at)
			SELECT 'k' || g, 'O', repeat('0', 64), 'DONE', now() - $1::interval + (g * $3::int - 9950) * interval '1 millisecond'
			  FROM generate_series(0, $2::int - 1) g`,
		durable.TableOutbox: `INSERT INTO outbox (topic, order_no, payload, created_at, published_at)
			SELECT 'ORDER_PAID', 'k' || g, '{}', now() - $1::interval, now() - $1::interval + (g * $3::int - 9950) * interval '1 millisecond'
			  FROM generate_series(0, $2::int - 1) g ORDER BY g`,
		durable.TableTrace: `INSERT INTO notify_trace (biz_key, traceparent, created_at)
			SELECT 'k' || g, '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', now() - $1::interval + (g * $3::int - 9950) * interval '1 millisecond'
			  FROM generate_series(0, $2::int - 1) g`,
	}
	exists := map[string]string{
		durable.TableClaim:  `SELECT 1 FROM notify_claim WHERE biz_key = 'k' || g`,
		durable.TableOutbox: `SELECT 1 FROM outbox WHERE order_no = 'k' || g`,
		durable.TableTrace:  `SELECT 1 FROM notify_trace WHERE biz_key = 'k' || g`,
	}
	keep := map[string]time.Duration{durable.TableClaim: claimKeep, durable.TableOutbox: outboxKeep, durable.TableTrace: outboxKeep}
	type ageing struct {
		table string
		// every is the rows' spacing; upTo how far past the cycle's start
		// they go on aging out.
		every, upTo time.Duration
		// behind is how long before the cycle's end what is left may
		// have aged out: a refresh, the rows' spacing, and for a table
		// checked only between the claims' batches, their pacing.
		behind time.Duration
	}
	for _, c := range []struct {
		name   string
		tables []ageing
		// batch and catchUp pace the cycle.
		batch   int
		catchUp float64
		// endsAtMax: the cycle ends at RetentionCycleMax, not caught up.
		endsAtMax bool
	}{
		{"catches up", []ageing{{durable.TableClaim, 100 * time.Millisecond, 30 * time.Second, 1100 * time.Millisecond}}, 50, 5, false},
		{"the outbox catches up", []ageing{{durable.TableOutbox, 100 * time.Millisecond, 30 * time.Second, 1100 * time.Millisecond}}, 50, 5, false},
		// The claims' batches come every 3.3 s; a trace context a second.
		{"a table done at once keeps up", []ageing{
			{durable.TableClaim, 100 * time.Millisecond, 30 * time.Second, 1100 * time.Millisecond},
			{durable.TableTrace, time.Second, 30 * time.Second, 6 * time.Second}}, 50, 5, false},
		// 20 rows a batch take 2 s at 10 a second: the walk never ends
		// within a second of its cutoff.
		{"ends at the cycle's limit", []ageing{{durable.TableClaim, 100 * time.Millisecond, durable.RetentionCycleMax + 5*time.Minute, 30 * time.Second}}, 20, 0.001, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := setup(t)
			began := time.Now()
			for _, a := range c.tables {
				b.exec(t, inserts[a.table], keep[a.table].String(), int((10*time.Second+a.upTo)/a.every), a.every.Milliseconds())
			}
			clock := &fakeClock{at: time.Now()}
			cfg := testRetention()
			cfg.Interval = time.Hour // one cycle, then stop
			cfg.Batch = c.batch
			cfg.CatchUpRate = c.catchUp
			cfg.CheckpointShare = 1e9
			cfg = durable.WithRetentionClock(cfg, clock.now, clock.sleep)
			r := startRetention(t, b.store, cfg)
			cycle := r.cycleWithin(t, 2*time.Minute)
			r.stop()
			// The cycle's start on the server's clock, which its cutoffs
			// count from, came after the insert by at most this.
			late := time.Since(began).Seconds()
			took := cycle.Took.Seconds()
			if !c.endsAtMax && took < 10 {
				t.Fatalf("the cycle took %.1f s: too short to tell a moving cutoff from a fixed one", took)
			}
			for _, a := range c.tables {
				// The rows' offsets past the retention as of the insert,
				// in seconds.
				offsets := func(deleted bool) []float64 {
					not := ""
					if deleted {
						not = "NOT "
					}
					rows, err := b.db.Query(context.Background(), `SELECT ((g * $2::int - 9950) / 1000.0)::float8
						FROM generate_series(0, $1::int - 1) g WHERE `+not+`EXISTS (`+exists[a.table]+`)`,
						int((10*time.Second+a.upTo)/a.every), a.every.Milliseconds())
					if err != nil {
						t.Fatal(err)
					}
					out, err := pgx.CollectRows(rows, pgx.RowTo[float64])
					if err != nil {
						t.Fatal(err)
					}
					return out
				}
				gone, kept := offsets(true), offsets(false)
				t.Logf("%s: the cycle took %.1f s on its clock (%.1f s real) and deleted %d rows; %d are left", a.table, took, late, len(gone), len(kept))
				if int64(len(gone)) != cycle.Deleted[a.table] {
					t.Fatalf("the cycle says it deleted %v; %d rows of %s are gone", cycle.Deleted, len(gone), a.table)
				}
				if len(kept) == 0 || len(gone) == 0 {
					t.Fatalf("%s: %d rows deleted, %d kept: the rows did not straddle the cycle's end", a.table, len(gone), len(kept))
				}
				// Nothing is deleted before it is old enough on the
				// cycle's clock, started on the server's a little after
				// the insert.
				if newest := slices.Max(gone); newest > took+late {
					t.Errorf("%s: a row %.2f s past its retention at the insert was deleted by a cycle that ended %.1f s after it began", a.table, newest, took)
				}
				// What is left aged out at most a.behind before the
				// cycle's end; one that cannot catch up ends at its limit.
				until := took
				if c.endsAtMax {
					limit := durable.RetentionCycleMax.Seconds()
					if took < limit || took > limit+30 {
						t.Errorf("the cycle took %.0f s; a cycle that cannot catch up ends at %.0f s", took, limit)
					}
					until = limit
				}
				if oldest := slices.Min(kept); oldest < until-a.behind.Seconds() {
					t.Errorf("%s: a row %.2f s past its retention at the insert is left by a cycle that ended %.1f s after it began", a.table, oldest, took)
				}
			}
		})
	}
}
