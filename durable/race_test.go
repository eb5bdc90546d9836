package durable_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
)

// moveUnder runs Process while the test holds the order's row lock, waits
// until Process blocks in its conditional UPDATE, then runs change in the
// locking transaction and commits: the order moves between Process's read
// and its UPDATE, the case the UPDATE's rows-affected check exists for.
func (b *bundle) moveUnder(t *testing.T, orderNo string, n durable.Notification, change string) (durable.Result, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM biz_order WHERE order_no = $1 FOR UPDATE`, orderNo); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		r   durable.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		r, err := b.store.Process(pctx, n)
		done <- outcome{r, err}
	}()
	durabletest.WaitLockWaiters(t, b.db, 1, "%notifyedge_process%")
	if _, err := tx.Exec(ctx, change, orderNo); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	o := <-done
	return o.r, o.err
}

func TestOrderMovedUnderDelivery(t *testing.T) {
	b := setup(t)
	ctx := context.Background()

	t.Run("moved to another legal state: applied from it", func(t *testing.T) {
		b.order(t, "O-r1", durable.Paid, 100, "CNY")
		n := note("R-1", durable.RefundSuccess, "O-r1", 100, "CNY")
		r, err := b.moveUnder(t, "O-r1", n, `UPDATE biz_order SET status = 'SHIPPED' WHERE order_no = $1`)
		if err != nil || r.Outcome != durable.Applied || r.Status != durable.Refunded {
			t.Fatalf("got %+v %v, want applied REFUNDED", r, err)
		}
		var from string
		if err := b.db.QueryRow(ctx, `SELECT payload->>'from' FROM outbox WHERE order_no = 'O-r1'`).Scan(&from); err != nil || from != "SHIPPED" {
			t.Errorf("outbox from %q (%v), want SHIPPED: the state it really left", from, err)
		}
	})

	t.Run("moved by another payment: skipped, claim rewritten", func(t *testing.T) {
		b.order(t, "O-r2", durable.PendingPay, 100, "CNY")
		n := note("P-2", durable.PaySuccess, "O-r2", 100, "CNY")
		r, err := b.moveUnder(t, "O-r2", n, `UPDATE biz_order SET status = 'PAID' WHERE order_no = $1`)
		if err != nil || r.Outcome != durable.Skipped || r.Status != durable.Paid || r.Review != durable.ReviewDuplicatePayment {
			t.Fatalf("got %+v %v, want skipped PAID with DUPLICATE_PAYMENT", r, err)
		}
		var stored string
		_ = b.db.QueryRow(ctx, `SELECT result_json FROM notify_claim WHERE biz_key = $1`, n.BizKey).Scan(&stored)
		if stored != canonical(durable.Skipped, durable.Paid) {
			t.Errorf("stored %s", stored)
		}
		if c := b.outbox(t, "O-r2"); c != 0 {
			t.Errorf("outbox %d, want 0", c)
		}
	})

	t.Run("deleted under us: nothing stored, retry decides afresh", func(t *testing.T) {
		b.order(t, "O-r3", durable.PendingPay, 100, "CNY")
		n := note("P-3", durable.PaySuccess, "O-r3", 100, "CNY")
		_, err := b.moveUnder(t, "O-r3", n, `DELETE FROM biz_order WHERE order_no = $1`)
		if !errors.Is(err, durable.ErrOrderChanged) || !strings.Contains(err.Error(), n.BizKey) {
			t.Fatalf("err %v, want ErrOrderChanged naming the delivery", err)
		}
		if c := b.claims(t, n.BizKey); c != 0 {
			t.Errorf("claims %d, want 0", c)
		}
		if r := process(t, b.store, n); r.Outcome != durable.UnknownOrder {
			t.Errorf("retry: %+v, want unknown_order", r)
		}
	})
}

// The refund's conditional UPDATE guards refunded_amount as read: another
// refund of the trade landing between our read and our UPDATE makes us
// decide again on the total it left.
func TestRefundDecidedAgainUnderAnotherRefund(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	const amount = 1999
	paid := func(t *testing.T, orderNo string) {
		t.Helper()
		b.order(t, orderNo, durable.PendingPay, amount, "CNY")
		process(t, b.store, chNote("test", "P"+orderNo, durable.PaySuccess, orderNo, amount, "", 0, false))
	}
	// landed is what another node's refund of 1500 commits meanwhile.
	const landed = `WITH r AS (INSERT INTO trade_refund (trade, refund_id, order_no, amount)
	VALUES ('test:P' || $1, 'other-node', $1, 1500))
UPDATE biz_order SET refunded_amount = 1500 WHERE order_no = $1`

	t.Run("still fits: applied on the new total, completing the order", func(t *testing.T) {
		paid(t, "O-f1")
		n := rf("test", "PO-f1", "mine", 499)("O-f1", amount)
		r, err := b.moveUnder(t, "O-f1", n, landed)
		if err != nil || r.Outcome != durable.Applied || r.Status != durable.Refunded {
			t.Fatalf("got %+v %v, want applied REFUNDED", r, err)
		}
		var moves []string
		for _, p := range b.payloads(t, "O-f1")[1:] {
			moves = append(moves, fmt.Sprintf("%v %v->%v +%v =%v", p["refund_id"], p["from"], p["to"], p["refund_amount"], p["refunded_amount"]))
		}
		if d := cmp.Diff([]string{"mine PAID->REFUNDED +499 =1999"}, moves); d != "" {
			t.Errorf("refund payloads (-want +got):\n%s", d)
		}
		if err := durabletest.Invariants(ctx, b.db, "O-f1", nil); err != nil {
			t.Error(err)
		}
	})

	t.Run("no longer fits: refund_exceeds, and the claim it had made is gone", func(t *testing.T) {
		paid(t, "O-f2")
		n := rf("test", "PO-f2", "mine-2", 1000)("O-f2", amount)
		r, err := b.moveUnder(t, "O-f2", n, landed)
		if err != nil || r.Outcome != durable.RefundExceeds || r.Status != durable.Paid || r.Review != durable.ReviewRefundExceeds {
			t.Fatalf("got %+v %v, want refund_exceeds on PAID", r, err)
		}
		if c := b.claims(t, n.BizKey); c != 0 {
			t.Errorf("claims %d, want 0: a retry must be decided afresh", c)
		}
		if _, refunded, _ := b.money(t, "O-f2"); refunded != 1500 {
			t.Errorf("refunded_amount %d, want 1500", refunded)
		}
		if d := cmp.Diff([]string{"REFUND_EXCEEDS open"}, b.reviews(t, "O-f2")); d != "" {
			t.Errorf("reviews (-want +got):\n%s", d)
		}
	})

	t.Run("closed in full meanwhile: skipped, recorded against the rest", func(t *testing.T) {
		paid(t, "O-f3")
		n := rf("test", "PO-f3", "mine-3", 1000)("O-f3", amount)
		r, err := b.moveUnder(t, "O-f3", n, `WITH r AS (INSERT INTO trade_refund (trade, refund_id, order_no, amount)
	VALUES ('test:P' || $1, '', $1, 1999))
UPDATE biz_order SET status = 'REFUNDED', refunded_amount = 1999 WHERE order_no = $1`)
		if err != nil || r.Outcome != durable.Skipped || r.Status != durable.Refunded {
			t.Fatalf("got %+v %v, want skipped REFUNDED", r, err)
		}
		_, refunded, refunds := b.money(t, "O-f3")
		want := []refund{{"test:PO-f3", "", 999}, {"test:PO-f3", "mine-3", 1000}}
		if d := cmp.Diff(want, refunds); d != "" || refunded != amount {
			t.Errorf("refunded_amount %d, rows (-want +got):\n%s", refunded, d)
		}
	})
}
