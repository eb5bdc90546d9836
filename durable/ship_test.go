package durable_test

import (
	"context"
	"fmt"
	"testing"
	"time"

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
