package durable_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/notifyedge/notifyedge/durable"
)

// ShipMany decides each message as Ship would, all in one transaction.
func TestShipManyInOneTransaction(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	var items []durable.ShipItem
	for i := range 6 {
		o := fmt.Sprintf("SM-%02d", i)
		b.order(t, o, durable.Paid, 100, "CNY")
		items = append(items, durable.ShipItem{OutboxID: int64(1000 + i), OrderNo: o})
	}
	b.order(t, "SM-PENDING", durable.PendingPay, 100, "CNY")
	// Out of order_no order, an unpaid order, and a message seen twice.
	items = append([]durable.ShipItem{{OutboxID: 2000, OrderNo: "SM-PENDING"}}, items...)
	items = append(items, durable.ShipItem{OutboxID: 1003, OrderNo: "SM-03"})
	got, err := b.store.ShipMany(ctx, "shipper", items)
	if err != nil {
		t.Fatal(err)
	}
	want := []durable.ShipDecision{{durable.NotShipped, durable.PendingPay}}
	for range 6 {
		want = append(want, durable.ShipDecision{Result: durable.ShipApplied, Status: durable.Shipped})
	}
	want = append(want, durable.ShipDecision{Result: durable.DuplicateMessage})
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("decisions %v, want %v", got, want)
	}
	if n := b.count(t, `SELECT count(*) FROM shipment`); n != 6 {
		t.Errorf("%d shipments, want 6", n)
	}
	if n := b.count(t, `SELECT count(DISTINCT xmin::text) FROM shipment`); n != 1 {
		t.Errorf("shipments written by %d transactions, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'ORDER_SHIPPED'`); n != 6 {
		t.Errorf("%d ORDER_SHIPPED rows, want 6", n)
	}
}

// An order ShipMany cannot lock fails the whole transaction: nothing of it
// is written, and the caller ships each message alone.
func TestShipManyFailsWhole(t *testing.T) {
	b := setup(t)
	s := newStore(t, b.url, durable.Config{LockTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	b.order(t, "SF-1", durable.Paid, 100, "CNY")
	b.order(t, "SF-2", durable.Paid, 100, "CNY")
	release := b.lockOrder(t, "SF-2")
	defer release()
	if _, err := s.ShipMany(ctx, "shipper", []durable.ShipItem{{OutboxID: 1, OrderNo: "SF-1"}, {OutboxID: 2, OrderNo: "SF-2"}}); err == nil {
		t.Fatal("ShipMany shipped past an order it could not lock")
	}
	if n := b.count(t, `SELECT count(*) FROM shipment`) + b.count(t, `SELECT count(*) FROM consumer_inbox`); n != 0 {
		t.Errorf("a failed ShipMany left %d rows", n)
	}
	if b.status(t, "SF-1") != durable.Paid {
		t.Errorf("SF-1 moved to %s in a failed ShipMany", b.status(t, "SF-1"))
	}
}

// ShipMany decides as sets what Ship decides one message at a time: on
// twin orders (same states, names with another prefix), random batches with
// repeated outbox ids, several messages of one order, internal-path items,
// unknown orders and ids handled in an earlier batch get the decisions,
// outbox rows and shipments that shipping them one by one in (order_no,
// outbox id) order gives.
func TestShipManyMatchesShipOneByOne(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(28, 4))
	states := []durable.State{durable.Paid, durable.Paid, durable.Paid, durable.PendingPay, durable.Shipped, durable.Closed, durable.Refunded}
	const orders = 24
	for i := range orders - 2 { // the last two stay unknown
		st := states[rnd.IntN(len(states))]
		b.order(t, fmt.Sprintf("MANY-%02d", i), st, 100, "CNY")
		b.order(t, fmt.Sprintf("ONE-%02d", i), st, 100, "CNY")
	}
	for round := range 6 {
		var batch []durable.ShipItem
		for range 1 + rnd.IntN(12) {
			var id int64 // 0: an internal path
			if rnd.IntN(6) > 0 {
				id = int64(1 + rnd.IntN(40)) // small: repeats within and across batches
			}
			batch = append(batch, durable.ShipItem{OutboxID: id, OrderNo: fmt.Sprintf("%02d", rnd.IntN(orders))})
		}
		many := make([]durable.ShipItem, len(batch))
		for i, it := range batch {
			many[i] = durable.ShipItem{OutboxID: it.OutboxID, OrderNo: "MANY-" + it.OrderNo}
		}
		got, err := b.store.ShipMany(ctx, "many", many)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		// One by one, in the order ShipMany promises to decide in.
		order := make([]int, len(batch))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(x, y int) int {
			bx, by := batch[x], batch[y]
			if c := strings.Compare(bx.OrderNo, by.OrderNo); c != 0 {
				return c
			}
			if (bx.OutboxID == 0) != (by.OutboxID == 0) { // an internal path's item last
				if bx.OutboxID == 0 {
					return 1
				}
				return -1
			}
			return cmp.Compare(bx.OutboxID, by.OutboxID)
		})
		want := make([]durable.ShipDecision, len(batch))
		for _, i := range order {
			r, st, err := b.store.Ship(ctx, "one", batch[i].OutboxID, "ONE-"+batch[i].OrderNo)
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			want[i] = durable.ShipDecision{Result: r, Status: st}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("round %d: batch %v\nShipMany  %v\none by one %v", round, batch, got, want)
		}
	}
	rows := func(prefix string) string {
		t.Helper()
		var out string
		err := b.db.QueryRow(ctx, `SELECT coalesce(string_agg(line, E'\n' ORDER BY line), '') FROM (
		    SELECT 'order ' || substr(order_no, length($1) + 1) || ' ' || status AS line FROM biz_order WHERE order_no LIKE $1 || '%'
		    UNION ALL
		    SELECT 'outbox ' || topic || ' ' || replace((payload - 'occurred_at')::text, $1, '') FROM outbox WHERE order_no LIKE $1 || '%'
		    UNION ALL
		    SELECT 'shipment ' || substr(order_no, length($1) + 1) || ' ' || coalesce(outbox_id::text, '-') FROM shipment WHERE order_no LIKE $1 || '%'
		    UNION ALL
		    SELECT 'inbox ' || outbox_id FROM consumer_inbox WHERE consumer = lower(rtrim($1, '-'))) l`, prefix).Scan(&out)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if many, one := rows("MANY-"), rows("ONE-"); many != one {
		t.Errorf("rows differ\nShipMany:\n%s\none by one:\n%s", many, one)
	}
	if n := b.count(t, `SELECT count(*) FROM shipment WHERE order_no LIKE 'MANY-%'`); n == 0 {
		t.Error("nothing shipped: the comparison saw no move")
	}
}

// Consumers whose batches share orders, in opposite orders, neither
// deadlock nor ship an order twice: every batch locks its inbox rows and
// orders in one global order.
func TestShipManyConcurrentBatchesShareOrders(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	const orders = 16
	var all []durable.ShipItem
	for i := range orders {
		o := fmt.Sprintf("SC-%02d", i)
		b.order(t, o, durable.Paid, 100, "CNY")
		all = append(all, durable.ShipItem{OutboxID: int64(100 + i), OrderNo: o})
	}
	errs := make(chan error, 8)
	for w := range cap(errs) {
		go func() {
			batch := slices.Clone(all)
			if w%2 == 1 {
				slices.Reverse(batch)
			}
			// A second consumer group ships through other inbox rows.
			_, err := b.store.ShipMany(ctx, fmt.Sprintf("shipper-%d", w%3), batch)
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM shipment`); n != orders {
		t.Errorf("%d shipments of %d orders", n, orders)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'ORDER_SHIPPED'`); n != orders {
		t.Errorf("%d ORDER_SHIPPED rows for %d orders", n, orders)
	}
}

// A session plans ShipMany's statements once, generically, while the
// orders are few, and keeps the plans: once there are many, a batch must
// still read its orders by index, never scan them all.
func TestShipManyPlansTakeIndexes(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil { // as the Store's sessions
		t.Fatal(err)
	}
	ship := func(tx pgx.Tx, prefix string) {
		t.Helper()
		var ids []int64
		var orders []string
		for i := range 8 {
			o := fmt.Sprintf("%s-%d", prefix, i)
			b.order(t, o, durable.Paid, 100, "CNY")
			ids, orders = append(ids, int64(len(prefix)*100+i)), append(orders, o)
		}
		// SHIP's row of the machine, written out: this test is about the
		// plans; the decisions are TestShipManyMatchesShipOneByOne's.
		if _, err := tx.Exec(ctx, `SELECT * FROM notifyedge_ship_batch('shipper', $1, $2, $3, $4, $5, $6)`,
			ids, orders, []string{"PENDING_PAY", "PAID", "SHIPPED", "CLOSED", "REFUNDED"},
			[]string{"skip", "move", "skip", "skip", "skip"}, []string{"", "SHIPPED", "", "", ""},
			[]string{"", "ORDER_SHIPPED", "", "", ""}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.db.Exec(ctx, `ANALYZE biz_order`); err != nil { // analysed while small
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { ship(tx, "PS-A"); return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(ctx, `INSERT INTO biz_order (order_no, status, amount, currency)
		SELECT 'PQ' || g, 'PAID', 100, 'CNY' FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		ship(tx, "PS-BB")
		var scans int64
		if err := tx.QueryRow(ctx, `SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'biz_order'`).Scan(&scans); err != nil {
			return err
		}
		if scans != 0 {
			t.Errorf("a batch scanned biz_order %d times", scans)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
