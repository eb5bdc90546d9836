package durable_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
)

// dueNames lists the due orders' numbers, sorted.
func dueNames(t *testing.T, b *bundle, w durable.ReconcileWindow) []string {
	t.Helper()
	due, err := b.store.DueOrders(context.Background(), w, 100)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range due {
		names = append(names, o.OrderNo)
	}
	slices.Sort(names)
	return names
}

// An order is due After past its registration, within the horizon, while
// PENDING_PAY; scheduling moves it on without touching updated_at, and an
// order past the horizon or marked never is not due again.
func TestReconcileSchedule(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	w := durable.ReconcileWindow{After: 10 * time.Minute, Horizon: 72 * time.Hour}
	for _, o := range []struct {
		no, status, age string
	}{
		{"R-new", "PENDING_PAY", "1 minute"},   // too young
		{"R-due", "PENDING_PAY", "11 minutes"}, // first query due
		{"R-old", "PENDING_PAY", "73 hours"},   // past the horizon
		{"R-paid", "PAID", "11 minutes"},       // left PENDING_PAY
	} {
		if _, err := b.db.Exec(ctx, `INSERT INTO biz_order (order_no, status, amount, currency, updated_at)
			VALUES ($1, $2, 100, 'CNY', now() - $3::interval)`, o.no, o.status, o.age); err != nil {
			t.Fatal(err)
		}
	}
	if got := dueNames(t, b, w); !slices.Equal(got, []string{"R-due"}) {
		t.Fatalf("due %v, want [R-due]", got)
	}
	due, oldest, err := b.store.ReconcileBacklog(ctx, w)
	if err != nil || due != 1 || oldest < 50*time.Second || oldest > 10*time.Minute {
		t.Fatalf("backlog %d, oldest %s, %v: want 1 order due about a minute", due, oldest, err)
	}
	var before time.Time
	b.db.QueryRow(ctx, `SELECT updated_at FROM biz_order WHERE order_no = 'R-due'`).Scan(&before)

	// Answered: asked again after the back-off, step 1, updated_at kept.
	if err := b.store.ScheduleReconcile(ctx, "R-due", w, durable.Reconciled{Answered: true, Next: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if got := dueNames(t, b, w); len(got) != 0 {
		t.Fatalf("due %v after scheduling an hour ahead", got)
	}
	o, st, err := b.store.ReconcileTarget(ctx, "R-due")
	if err != nil || st != durable.PendingPay || o.Step != 1 || o.Errors != 0 {
		t.Fatalf("target %+v %s %v: want step 1, no errors", o, st, err)
	}
	var after time.Time
	b.db.QueryRow(ctx, `SELECT updated_at FROM biz_order WHERE order_no = 'R-due'`).Scan(&after)
	if !after.Equal(before) {
		t.Fatalf("updated_at moved from %s to %s: the order's clock is its registration", before, after)
	}
	// Two failures: errors count, the step stays; due again at once with
	// a zero wait.
	for range 2 {
		if err := b.store.ScheduleReconcile(ctx, "R-due", w, durable.Reconciled{Next: 0}); err != nil {
			t.Fatal(err)
		}
	}
	if o, _, _ := b.store.ReconcileTarget(ctx, "R-due"); o.Step != 1 || o.Errors != 2 {
		t.Fatalf("after two failures %+v: want step 1, errors 2", o)
	}
	if got := dueNames(t, b, w); !slices.Equal(got, []string{"R-due"}) {
		t.Fatalf("due %v, want [R-due] again", got)
	}
	// A next time past the horizon is never.
	if err := b.store.ScheduleReconcile(ctx, "R-due", w, durable.Reconciled{Answered: true, Next: 100 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	var never bool
	b.db.QueryRow(ctx, `SELECT reconcile_at = 'infinity' FROM biz_order WHERE order_no = 'R-due'`).Scan(&never)
	if !never {
		t.Fatal("a next query past the horizon was scheduled")
	}
	// A paid order is left alone.
	if err := b.store.ScheduleReconcile(ctx, "R-paid", w, durable.Reconciled{Answered: true, Next: time.Hour}); err != nil {
		t.Fatal(err)
	}
	var at *time.Time
	b.db.QueryRow(ctx, `SELECT reconcile_at FROM biz_order WHERE order_no = 'R-paid'`).Scan(&at)
	if at != nil {
		t.Fatal("scheduling changed an order that left PENDING_PAY")
	}
	if _, _, err := b.store.ReconcileTarget(ctx, "R-none"); !errors.Is(err, durable.ErrUnknownOrder) {
		t.Fatalf("unknown order: %v", err)
	}
}

// PUT names the channel once: a later PUT may name it on an order
// registered without one, never another one.
func TestPutOrderChannel(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	if created, err := b.store.PutOrder(ctx, "C-1", 100, "CNY", ""); err != nil || !created {
		t.Fatal(created, err)
	}
	if created, err := b.store.PutOrder(ctx, "C-1", 100, "CNY", "wx"); err != nil || created {
		t.Fatal(created, err)
	}
	if o, _, _ := b.store.ReconcileTarget(ctx, "C-1"); o.Channel != "wx" {
		t.Fatalf("channel %q, want wx", o.Channel)
	}
	if _, err := b.store.PutOrder(ctx, "C-1", 100, "CNY", "ali"); !errors.Is(err, durable.ErrOrderExists) {
		t.Fatalf("another channel: %v, want ErrOrderExists", err)
	}
	if created, err := b.store.PutOrder(ctx, "C-1", 100, "CNY", ""); err != nil || created {
		t.Fatal(created, err)
	}
	h, err := b.store.OrderHistory(ctx, "C-1", 0)
	if err != nil || h.Channel != "wx" {
		t.Fatalf("history channel %q, %v", h.Channel, err)
	}
}
