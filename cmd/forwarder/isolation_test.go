package main

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable/wait"
)

// deliveryBound is how soon the events of orders that do not fail must
// reach the receiver while another order is refused: a failing order holds
// back its own later events and nothing else.
const deliveryBound = 30 * time.Second

// A receiver refuses every event of one order while 1,000 other orders are
// paid, 200 of them in the lane the stuck order used to share (hashed as
// fnv32a % 8) and published right behind it: the others arrive within the
// bound while the stuck order's five events wait, held, and once the
// receiver takes them they arrive exactly once each, in outbox order.
func TestFailingOrderIsolated(t *testing.T) {
	e := newTestEnv(t)
	cfg := e.config("f1")
	cfg.Partitions = 8
	const stuck = "H1-stuck"
	var sameLane, otherLanes []string
	for i := 0; len(sameLane) < 200 || len(otherLanes) < 800; i++ {
		o := fmt.Sprintf("H1-%04d", i)
		switch {
		case oldLane(o, 8) == oldLane(stuck, 8):
			if len(sameLane) < 200 {
				sameLane = append(sameLane, o)
			}
		case len(otherLanes) < 800:
			otherLanes = append(otherLanes, o)
		}
	}
	var refusing atomic.Bool
	refusing.Store(true)
	e.recv.setBehave(func(order string, _ int64, _ int) verdict {
		if order == stuck && refusing.Load() {
			return verdict{status: http.StatusInternalServerError}
		}
		return verdict{status: http.StatusOK}
	})
	e.start(cfg)

	first := e.publish(1, stuck)[0]
	firstPublished := time.Now()
	waitFor(t, "the stuck order's first event refused twice", func() bool { return e.recv.tries(first.ID) >= 2 })
	start := time.Now()
	e.publish(1, sameLane...)
	e.publish(2, stuck)
	e.publish(1, otherLanes...)
	e.publish(2, stuck)
	const others = 1000
	if !wait.Within(deliveryBound, func() bool { return e.recv.unique()*100 >= others*99 }) {
		t.Fatalf("%d of %d events of other orders delivered after %v while %s is refused", e.recv.unique(), others, deliveryBound, stuck)
	}
	t.Logf("99 %% of the other orders' events delivered in %v (%d by then)", time.Since(start).Round(time.Millisecond), e.recv.unique())
	waitFor(t, "every event of the other orders", func() bool { return e.recv.unique() == others })
	t.Logf("all of them in %v", time.Since(start).Round(time.Millisecond))

	if v, ok := metricValue(cfg.Metrics, "notifyedge_forward_held_orders"); !ok || v != 1 {
		t.Errorf("notifyedge_forward_held_orders = %v (exported: %v) while %s is refused, want 1", v, ok, stuck)
	}
	// Only the stuck order's entries are in hand now, waiting for a retry
	// rather than in a worker: the lag is still its first event's age.
	waited := time.Since(firstPublished)
	if lag := lagOf(cfg.Metrics); lag < waited.Seconds()-0.1 {
		t.Errorf("lag %.3f s while %s's first event has waited %v: held entries must count", lag, stuck, waited)
	}
	for _, id := range e.perOrderIDs(stuck)[1:] {
		if n := e.recv.tries(id); n != 0 {
			t.Errorf("event %d of %s was attempted %d times behind its refused first event", id, stuck, n)
		}
	}

	refusing.Store(false)
	waitFor(t, "the stuck order's events once the receiver takes them", func() bool { return e.recv.unique() == others+5 })
	waitFor(t, "every entry acknowledged", func() bool { return e.pending() == 0 })
	waitFor(t, "no held order", func() bool {
		v, ok := metricValue(cfg.Metrics, "notifyedge_forward_held_orders")
		return ok && v == 0
	})
	waitFor(t, "lag 0 once idle", func() bool { return lagOf(cfg.Metrics) == 0 })
	e.recv.checkNoProblems()
	e.checkOrder(e.recv.snapshot())
	for _, id := range e.perOrderIDs(stuck)[1:] {
		if n := e.recv.tries(id); n != 1 {
			t.Errorf("event %d of %s: %d attempts, want 1", id, stuck, n)
		}
	}
	if o := e.recv.overlapping(); len(o) > 0 {
		t.Errorf("orders with two requests at once: %v", o)
	}
	if n := counter(cfg.Metrics, resultDead); n != 0 {
		t.Errorf("dead = %v, want 0", n)
	}
}

// Many orders, each event refused at random a few times before it is
// taken, answered after random short delays: every event arrives, each
// order's in outbox order, never two of one order at once, and the held
// gauge goes back to 0.
func TestRandomFailuresKeepOrder(t *testing.T) {
	e := newTestEnv(t)
	cfg := e.config("f1")
	var orders []string
	for i := range 100 {
		orders = append(orders, fmt.Sprintf("R-%03d", i))
	}
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	failures := 0
	e.recv.setBehave(func(string, int64, int) verdict {
		mu.Lock()
		defer mu.Unlock()
		delay := time.Duration(rng.IntN(3)) * time.Millisecond
		if rng.IntN(4) == 0 {
			failures++
			return verdict{status: []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusTooManyRequests}[rng.IntN(3)], delay: delay}
		}
		return verdict{status: http.StatusOK, delay: delay}
	})
	e.start(cfg)
	msgs := e.publish(5, orders...)
	msgs = append(msgs, e.publish(5, orders...)...)
	// A thousand events, a quarter of them refused and retried after a
	// back-off: twice the kit's wait.
	if !wait.Within(2*wait.Timeout, func() bool { return e.recv.unique() == len(msgs) }) {
		t.Fatalf("%d of %d events delivered after %v", e.recv.unique(), len(msgs), 2*wait.Timeout)
	}
	waitFor(t, "every entry acknowledged", func() bool { return e.pending() == 0 })
	waitFor(t, "every delivery counted", func() bool { return counter(cfg.Metrics, resultDelivered) == float64(len(msgs)) })
	e.recv.checkNoProblems()
	e.checkOrder(e.recv.snapshot())
	if o := e.recv.overlapping(); len(o) > 0 {
		t.Errorf("orders with two requests at once: %v", o)
	}
	mu.Lock()
	refused := failures
	mu.Unlock()
	if refused == 0 {
		t.Fatal("the receiver refused nothing: the test tests nothing")
	}
	if n := counter(cfg.Metrics, resultRetried); n != float64(refused) {
		t.Errorf("retried = %v, want %d (the receiver's refusals)", n, refused)
	}
	if v, ok := metricValue(cfg.Metrics, "notifyedge_forward_held_orders"); !ok || v != 0 {
		t.Errorf("notifyedge_forward_held_orders = %v (exported: %v) once everything is delivered, want 0", v, ok)
	}
	t.Logf("%d events, %d refusals", len(msgs), refused)
}

// oldLane is the lane an order was hashed to when each of n lanes
// forwarded its orders through one queue: fnv32a % n.
func oldLane(orderNo string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(orderNo))
	return int(h.Sum32() % uint32(n))
}

// perOrderIDs returns the outbox ids published for order, in outbox order.
func (e *testEnv) perOrderIDs(order string) []int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int64(nil), e.perOrder[order]...)
}

// metricValue reads the gauge or counter name as the registry exports it;
// false when it is not exported.
func metricValue(m *Metrics, name string) (float64, bool) {
	families, err := m.Registry.Gather()
	if err != nil {
		return 0, false
	}
	for _, f := range families {
		if f.GetName() != name || len(f.GetMetric()) != 1 {
			continue
		}
		d := f.GetMetric()[0]
		if g := d.GetGauge(); g != nil {
			return g.GetValue(), true
		}
		return d.GetCounter().GetValue(), true
	}
	return 0, false
}

// lagOf reads notifyedge_forward_lag_seconds.
func lagOf(m *Metrics) float64 {
	v, _ := metricValue(m, "notifyedge_forward_lag_seconds")
	return v
}
