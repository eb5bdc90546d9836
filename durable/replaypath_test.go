package durable_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/notifyedge/notifyedge/durable"
)

// A replay from Postgres is one index probe in plain SQL: the plan of
// Process's statement never enters notifyedge_process when the key has a
// committed claim of the same digest, and reads no table but the claims;
// it enters the function when the key has none.
func TestReplayNeverCallsTheFunction(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.order(t, "O-1", durable.PendingPay, 1999, "CNY")
	n := note("T-1", durable.PaySuccess, "O-1", 1999, "CNY")
	process(t, b.store, n)
	explain := func(n durable.Notification) string {
		t.Helper()
		tx, err := b.db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) // EXPLAIN ANALYZE runs the statement
		if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) `+durable.SQLProcess(n.Event),
			n.BizKey, n.OrderNo, n.Digest, string(n.RawBody), string(n.Event), n.Amount, n.Currency,
			n.Trade, n.RefundID, n.RefundAmount, n.Cumulative)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "\n")
	}
	never := func(plan, node string) bool {
		for _, l := range strings.Split(plan, "\n") {
			if strings.Contains(l, node) {
				return strings.Contains(l, "(never executed)")
			}
		}
		t.Fatalf("no %q in the plan:\n%s", node, plan)
		return false
	}
	replay := explain(n)
	if !never(replay, "Function Scan on notifyedge_process") || strings.Contains(replay, "notify_review") || strings.Contains(replay, "biz_order") {
		t.Errorf("a replay entered the function, or its plan holds more than the claim probe:\n%s", replay)
	}
	b.order(t, "O-2", durable.PendingPay, 1999, "CNY")
	first := explain(note("T-2", durable.PaySuccess, "O-2", 1999, "CNY"))
	if never(first, "Function Scan on notifyedge_process") {
		t.Errorf("a first delivery did not call the function:\n%s", first)
	}
}

// Every first delivery probes the review queue for open rows of its key,
// inside notifyedge_process; the probe's generic plan must take the narrow
// index made for it, even when the queue is empty (no statistics to go by)
// and the id index of open rows would do.
func TestReviewProbeTakesItsIndex(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, `EXPLAIN (COSTS OFF) SELECT EXISTS (SELECT 1 FROM notify_review r
		WHERE r.biz_key = $1 AND r.resolved_at IS NULL AND r.reason IN ('UNKNOWN_ORDER', 'AMOUNT_MISMATCH'))`, "test:k:PAY_SUCCESS")
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if plan := strings.Join(lines, "\n"); !strings.Contains(plan, "notify_review_open_key_idx") {
		t.Errorf("the probe does not take notify_review_open_key_idx:\n%s", plan)
	}
}
