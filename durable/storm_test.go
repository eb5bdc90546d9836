package durable_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
)

// Point 3: two partial refunds of one trade that together complete it,
// delivered at the same moment through two Stores (two pools, like two
// nodes), each with duplicates, round after round. Every order ends
// REFUNDED with refunded_amount = amount, one outbox row per applied
// refund and exactly one ORDER_REFUNDED, whichever refund lands first.
func TestRefundStormTwoNodes(t *testing.T) {
	const (
		rounds = 40
		copies = 4 // of each refund, split between the nodes
		amount = 1999
		first  = 800 // + 1199 = amount
	)
	b := setup(t)
	nodes := []*durable.Store{b.store, newStore(t, b.url, durable.Config{})}
	ctx := context.Background()
	type answer struct {
		n   durable.Notification
		r   durable.Result
		err error
	}
	var answered []string
	for round := range rounds {
		orderNo := fmt.Sprintf("S-%03d", round)
		cumulative := round%2 == 1 // Alipay's totals on odd rounds, refund amounts on even ones
		b.order(t, orderNo, durable.PendingPay, amount, "CNY")
		payment := chNote("test", "P"+orderNo, durable.PaySuccess, orderNo, amount, "", 0, false)
		if r := process(t, nodes[round%2], payment); r.Outcome != durable.Applied {
			t.Fatalf("%s: payment %+v", orderNo, r)
		}
		answered = append(answered, payment.BizKey)
		refunds := []durable.Notification{
			rf("test", "P"+orderNo, "A"+orderNo, first)(orderNo, amount),
			rf("test", "P"+orderNo, "B"+orderNo, amount-first)(orderNo, amount),
		}
		if cumulative {
			refunds = []durable.Notification{
				cum("test", "P"+orderNo, "A"+orderNo, first)(orderNo, amount),
				cum("test", "P"+orderNo, "B"+orderNo, amount)(orderNo, amount),
			}
		}
		var calls []func()
		answers := make([]answer, len(refunds)*copies)
		for i, n := range refunds {
			for c := range copies {
				a := &answers[i*copies+c]
				calls = append(calls, func() {
					cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
					defer cancel()
					r, err := nodes[c%2].Process(cctx, n)
					*a = answer{n, r, err}
				})
			}
		}
		atOnce(calls...)
		firsts := map[string]durable.Result{} // key -> its one decided (not replayed) answer
		var replays []answer
		for _, a := range answers {
			switch {
			case a.err != nil:
				t.Fatalf("%s: %s: %v", orderNo, a.n.BizKey, a.err)
			case a.r.Replayed:
				replays = append(replays, a)
			case firsts[a.n.BizKey].Outcome != 0:
				t.Fatalf("%s: %s decided twice: %+v and %+v", orderNo, a.n.BizKey, firsts[a.n.BizKey], a.r)
			default:
				firsts[a.n.BizKey] = a.r
			}
			answered = append(answered, a.n.BizKey)
		}
		for _, a := range replays {
			if f := firsts[a.n.BizKey]; string(a.r.Canonical) != string(f.Canonical) {
				t.Errorf("%s: replay of %s is %s, the first answer %s", orderNo, a.n.BizKey, a.r.Canonical, f.Canonical)
			}
		}
		applied := 0
		for _, n := range refunds {
			f, ok := firsts[n.BizKey]
			if !ok {
				t.Fatalf("%s: %s never decided", orderNo, n.BizKey)
			}
			if f.Outcome == durable.Applied {
				applied++
			} else if !cumulative || f.Outcome != durable.Skipped || n.RefundAmount != first {
				// Only a cumulative total overtaken by the full one may skip.
				t.Errorf("%s: %s: %+v", orderNo, n.BizKey, f)
			}
		}
		if st := b.status(t, orderNo); st != durable.Refunded {
			t.Errorf("%s: status %s, want REFUNDED", orderNo, st)
		}
		if _, refunded, _ := b.money(t, orderNo); refunded != amount {
			t.Errorf("%s: refunded_amount %d, want %d", orderNo, refunded, amount)
		}
		if n := b.count(t, `SELECT count(*) FROM outbox WHERE order_no = $1 AND topic = 'ORDER_REFUNDED'`, orderNo); n != 1 {
			t.Errorf("%s: %d ORDER_REFUNDED rows, want exactly 1", orderNo, n)
		}
		if n := b.outbox(t, orderNo); n != 1+applied {
			t.Errorf("%s: %d outbox rows, want ORDER_PAID and one per applied refund (%d)", orderNo, n, applied)
		}
	}
	if err := durabletest.Invariants(ctx, b.db, "S-", answered); err != nil {
		t.Error(err)
	}
}

// Two refunds of a duplicate payment that together refund it in full,
// landing at the same moment on two nodes: the one summed second sees the
// first, so the DUPLICATE_PAYMENT row is resolved, every round.
func TestDuplicatePaymentRefundStorm(t *testing.T) {
	const (
		rounds = 30
		amount = 1999
		first  = 1000
	)
	b := setup(t)
	nodes := []*durable.Store{b.store, newStore(t, b.url, durable.Config{})}
	ctx := context.Background()
	for round := range rounds {
		orderNo := fmt.Sprintf("D-%03d", round)
		b.order(t, orderNo, durable.PendingPay, amount, "CNY")
		process(t, b.store, chNote("test", "P"+orderNo, durable.PaySuccess, orderNo, amount, "", 0, false))
		if r := process(t, b.store, chNote("test", "Q"+orderNo, durable.PaySuccess, orderNo, amount, "", 0, false)); r.Review != durable.ReviewDuplicatePayment {
			t.Fatalf("%s: second payment %+v", orderNo, r)
		}
		refunds := []durable.Notification{
			rf("test", "Q"+orderNo, "A"+orderNo, first)(orderNo, amount),
			rf("test", "Q"+orderNo, "B"+orderNo, amount-first)(orderNo, amount),
		}
		errs := make([]error, len(refunds))
		atOnce(
			func() { errs[0] = refundSkipped(ctx, nodes[0], refunds[0]) },
			func() { errs[1] = refundSkipped(ctx, nodes[1], refunds[1]) },
		)
		for _, err := range errs {
			if err != nil {
				t.Fatalf("%s: %v", orderNo, err)
			}
		}
		if d := cmp.Diff([]string{"DUPLICATE_PAYMENT resolved by notifyedge"}, b.reviews(t, orderNo)); d != "" {
			t.Fatalf("%s: reviews (-want +got):\n%s", orderNo, d)
		}
	}
	if err := durabletest.Invariants(ctx, b.db, "D-", nil); err != nil {
		t.Error(err)
	}
}

// refundSkipped delivers n through s and wants it skipped without a review.
func refundSkipped(ctx context.Context, s *durable.Store, n durable.Notification) error {
	r, err := s.Process(ctx, n)
	if err == nil && (r.Outcome != durable.Skipped || r.Review != "") {
		err = fmt.Errorf("%s: %+v, want skipped without review", n.BizKey, r)
	}
	return err
}

// atOnce runs every call at the same moment, each on a goroutine of its
// own, and returns once all have returned. Calls report through what they
// close over, never through t.
func atOnce(calls ...func()) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c()
		}()
	}
	close(start)
	wg.Wait()
}
