package durable_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		_ = b.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%notifyedge_process%'`).Scan(&waiting)
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Process never blocked on the row lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
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
		if stored != string(durable.CanonicalJSON(durable.Skipped, durable.Paid)) {
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
