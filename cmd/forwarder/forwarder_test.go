package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// Several orders' events arrive signed, with the documented body, once
// each, in outbox order per order, and are acknowledged.
func TestHappyPath(t *testing.T) {
	e := newTestEnv(t)
	cfg := e.config("f1")
	orders := []string{"O-1", "O-2", "O-3", "O-4", "O-5", "O-6", "O-7", "O/8?#%"}
	msgs := e.publish(5, orders...)
	e.start(cfg)
	more := e.publish(5, orders...) // read as new entries by a running forwarder
	msgs = append(msgs, more...)

	waitFor(t, "every event", func() bool { return e.recv.unique() == len(msgs) })
	waitFor(t, "every entry acknowledged", func() bool { return e.pending() == 0 })
	// Counted just after the XACK: pending may reach 0 a moment before.
	waitFor(t, "every delivery counted", func() bool { return counter(cfg.Metrics, resultDelivered) == float64(len(msgs)) })
	e.recv.checkNoProblems()
	got := e.recv.snapshot()
	if len(got) != len(msgs) {
		t.Errorf("receiver accepted %d deliveries of %d events: a duplicate without any failure", len(got), len(msgs))
	}
	for _, a := range got {
		if want := expectedBody(e.published[a.OutboxID]); a.Body != want {
			t.Errorf("body of %s:\n got %s\nwant %s", a.ID, a.Body, want)
		}
	}
	e.checkOrder(got)
	if n := counter(cfg.Metrics, resultRetried) + counter(cfg.Metrics, resultDead); n != 0 {
		t.Errorf("retried+dead = %v, want 0", n)
	}
	if g := gauge(cfg.Metrics.active); g != 1 {
		t.Errorf("active = %v, want 1", g)
	}
	waitFor(t, "lag 0 once idle", func() bool {
		lag := cfg.Metrics.lagFn.Load()
		return lag != nil && (*lag)() == 0
	})
}

// An entry the relay appended before event ids and payload facts existed
// (no event_id field, a payload without occurred_at) is still delivered:
// webhook-id = its outbox id, as then, "event_id":null, and the time Redis
// took the entry for a timestamp.
func TestEntryWrittenBeforeEventIDs(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	payload := `{"to": "PAID", "from": "PENDING_PAY", "biz_key": null, "order_no": "L-1", "event_type": "PAY_SUCCESS"}`
	id, err := e.client.XAdd(ctx, &redis.XAddArgs{Stream: e.stream, Values: []any{
		redisstream.FieldOutboxID, 7, redisstream.FieldTopic, "ORDER_PAID", redisstream.FieldOrderNo, "L-1", redisstream.FieldPayload, payload,
	}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	e.start(e.config("f1"))
	waitFor(t, "the old entry delivered", func() bool { return e.recv.unique() == 1 })
	e.recv.checkNoProblems()
	got := e.recv.snapshot()[0]
	want := fmt.Sprintf(`{"type":"ORDER_PAID","timestamp":%q,"data":{"event_id":null,"outbox_id":7,%s}`,
		entryTime(id).UTC().Format(time.RFC3339Nano), strings.TrimPrefix(payload, "{"))
	if got.ID != "7" || got.Body != want {
		t.Errorf("webhook-id %s, body\n got %s\nwant %s", got.ID, got.Body, want)
	}
}

// A receiver that fails, times out, redirects or answers slowly: each
// event is retried until a 2xx and its order's later events wait for it.
// Only the timed-out request may outlast the timeout, which is generous so
// that a loaded machine does not turn a slow answer into a retry.
func TestRetriesKeepOrder(t *testing.T) {
	e := newTestEnv(t)
	cfg := e.config("f1")
	cfg.Timeout = 2 * time.Second
	var waitsMu sync.Mutex
	waits := map[int64][]time.Duration{} // backoffs chosen, per outbox id
	cfg.afterFailure = func(m redisstream.Message, _ int, wait time.Duration) {
		waitsMu.Lock()
		defer waitsMu.Unlock()
		waits[m.OutboxID] = append(waits[m.OutboxID], wait)
	}
	first := map[string]int64{}
	msgs := e.publish(5, "fails", "timeout", "slow", "redirect", "steady")
	for _, m := range msgs {
		if _, ok := first[m.OrderNo]; !ok {
			first[m.OrderNo] = m.ID
		}
	}
	e.recv.setBehave(func(order string, id int64, attempt int) verdict {
		switch {
		case order == "fails" && id == first[order] && attempt <= 3:
			return verdict{status: http.StatusInternalServerError}
		case order == "timeout" && id == first[order] && attempt == 1:
			// Taken, but answered after the client gave up: sent again.
			return verdict{status: http.StatusOK, delay: 3 * cfg.Timeout}
		case order == "redirect" && id == first[order] && attempt == 1:
			return verdict{status: http.StatusFound, header: map[string]string{"Location": "/elsewhere"}}
		case order == "slow":
			return verdict{status: http.StatusOK, delay: 50 * time.Millisecond}
		}
		return verdict{status: http.StatusOK}
	})
	e.start(cfg)
	waitFor(t, "every event", func() bool { return e.recv.unique() == len(msgs) })
	waitFor(t, "every entry acknowledged", func() bool { return e.pending() == 0 })
	waitFor(t, "every delivery counted", func() bool { return counter(cfg.Metrics, resultDelivered) == float64(len(msgs)) })
	e.recv.checkNoProblems()
	e.checkOrder(e.recv.snapshot())
	for order, want := range map[string]int{"fails": 4, "timeout": 2, "redirect": 2, "slow": 1, "steady": 1} {
		if got := e.recv.tries(first[order]); got != want {
			t.Errorf("first event of %s: %d attempts, want %d", order, got, want)
		}
	}
	for _, m := range msgs {
		if m.ID != first[m.OrderNo] && e.recv.tries(m.ID) != 1 {
			t.Errorf("event %d of %s: %d attempts, want 1", m.ID, m.OrderNo, e.recv.tries(m.ID))
		}
	}
	// Each backoff chosen is within its ceiling (BackoffMin doubled per
	// failure, at most BackoffMax), and the next attempt came no sooner:
	// lower bounds on arrival times hold on any machine, upper ones do not.
	e.recv.mu.Lock()
	times := e.recv.times[fmt.Sprint(first["fails"])]
	e.recv.mu.Unlock()
	waitsMu.Lock()
	failsWaits := waits[first["fails"]]
	waitsMu.Unlock()
	if len(failsWaits) != 3 || len(times) != 4 {
		t.Fatalf("first event of fails: %d backoffs for %d attempts, want 3 for 4", len(failsWaits), len(times))
	}
	for i, wait := range failsWaits {
		if ceil := min(cfg.BackoffMin<<i, cfg.BackoffMax); wait < 0 || wait > ceil {
			t.Errorf("backoff after failure %d: %v outside [0, %v]", i+1, wait, ceil)
		}
		if gap := times[i+1].Sub(times[i]); gap < wait {
			t.Errorf("attempt %d came %v after attempt %d, before its backoff %v", i+2, gap, i+1, wait)
		}
	}
	if n := counter(cfg.Metrics, resultRetried); n != 5 {
		t.Errorf("retried = %v, want 5 (3 failures, 1 timeout, 1 redirect)", n)
	}
}

// A forwarder that dies between the 2xx and the XACK sends that event
// again after the restart: the receiver gets the same webhook-id twice,
// and after dropping duplicates by it, every order is in outbox order.
func TestRedeliveryAfterCrashBeforeAck(t *testing.T) {
	e := newTestEnv(t)
	msgs := e.publish(6, "A", "B", "C")
	victim := msgs[7] // A's third event
	cfg := e.config("f1")
	var crashed atomic.Bool // workers call the hook concurrently
	cfg.beforeAck = func(m redisstream.Message) error {
		if m.OutboxID == victim.ID && crashed.CompareAndSwap(false, true) {
			return errors.New("simulated crash")
		}
		return nil
	}
	stop := e.start(cfg)
	waitFor(t, "the crash", func() bool { return e.recv.tries(victim.ID) == 1 })
	if err := stop(); !errors.Is(err, errCrash) {
		t.Fatalf("Run returned %v, want the crash", err)
	}
	// The crash left the lease to expire and the entry pending with f1.
	e.start(e.config("f2"))
	waitFor(t, "every event", func() bool { return e.recv.unique() == len(msgs) })
	waitFor(t, "every entry acknowledged", func() bool { return e.pending() == 0 })
	if n := e.recv.tries(victim.ID); n != 2 {
		t.Errorf("victim sent %d times, want 2 (2xx, crash before XACK, redelivered)", n)
	}
	e.recv.checkNoProblems()
	e.checkOrder(e.recv.snapshot())
	cs, err := e.client.XInfoConsumers(context.Background(), e.stream, "forwarder").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].Name != "f2" {
		t.Errorf("consumers %+v, want only f2 (f1's entries claimed, f1 forgotten)", cs)
	}
}

// Two instances started together: one forwards, the other waits; when the
// active one stops (gracefully, mid-run) the other takes over. Never both
// active, nothing lost, no duplicate (a graceful stop acknowledges what it
// sent), every order in outbox order.
func TestOverlappingInstances(t *testing.T) {
	e := newTestEnv(t)
	var orders []string
	for i := range 20 {
		orders = append(orders, fmt.Sprintf("ov-%02d", i))
	}
	msgs := e.publish(10, orders...)
	e.recv.setBehave(func(string, int64, int) verdict { return verdict{status: 200, delay: 3 * time.Millisecond} })
	cfgs := []Config{e.config("a"), e.config("b")}
	stops := []func() error{e.start(cfgs[0]), e.start(cfgs[1])}
	var sawBoth atomic.Bool
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		for {
			select {
			case <-quit:
				return
			case <-time.After(time.Millisecond):
			}
			if gauge(cfgs[0].Metrics.active) == 1 && gauge(cfgs[1].Metrics.active) == 1 {
				sawBoth.Store(true)
			}
		}
	}()
	waitFor(t, "a third of the events", func() bool { return e.recv.unique() >= len(msgs)/3 })
	active := slices.IndexFunc(cfgs, func(c Config) bool { return gauge(c.Metrics.active) == 1 })
	if active < 0 {
		t.Fatal("no instance active")
	}
	if err := stops[active](); err != nil {
		t.Fatal(err)
	}
	stops[active] = e.start(cfgs[active]) // back, as standby
	waitFor(t, "every event", func() bool { return e.recv.unique() == len(msgs) })
	waitFor(t, "every entry acknowledged", func() bool { return e.pending() == 0 })
	if sawBoth.Load() {
		t.Error("both instances were active at once")
	}
	e.recv.checkNoProblems()
	got := e.recv.snapshot()
	e.checkOrder(got)
	if len(got) != len(msgs) {
		t.Errorf("%d deliveries of %d events: a graceful handover duplicated", len(got), len(msgs))
	}
}

// The holder stops sending before Redis could expire its lease: ttl less
// the margin after the last renewal was sent, on the lease's clock, and not
// a moment before; renewals on the tick move that on. Moved by hand, the
// clock makes this a property, not a wall-clock margin.
func TestLeaseLapsesBeforeTTL(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	// On the fake clock; the key's TTL in Redis is this long on the real
	// one, more than the test takes.
	const ttl = 40 * time.Second
	a := newLease(e.client, "k", "a", ttl, clock)
	b := newLease(e.client, "k", "b", ttl, clock)
	start, holder, err := a.try(ctx)
	if err != nil || holder != "" {
		t.Fatalf("a: %q %v", holder, err)
	}
	if _, holder, err := b.try(ctx); err != nil || holder != a.value {
		t.Fatalf("b got %q %v while a holds the lease", holder, err)
	}
	held := a.hold(start, slogDiscard())
	defer held.stop()
	// pending reports the clock's waiters, the lapse timer and the renewal
	// ticker while the lease is held, without waiting.
	pending := func(n int) bool {
		now, cancel := context.WithCancel(ctx)
		cancel()
		return clock.BlockUntilContext(now, n) == nil
	}
	wait.For(t, "the renewal ticker", func() (bool, string) { return pending(2), "fewer than 2 timers" })
	// Two TTLs of renewals, each on its tick.
	for range 8 {
		before := a.renewed.Load()
		clock.Advance(ttl / 4)
		wait.For(t, "the renewal on the tick", func() (bool, string) {
			if held.ctx.Err() != nil {
				t.Fatalf("lease lapsed while renewed: %v", context.Cause(held.ctx))
			}
			return a.renewed.Load() > before, fmt.Sprint("renewed at ", a.renewed.Load())
		})
	}
	if _, holder, err := b.try(ctx); err != nil || holder != a.value {
		t.Fatalf("b got %q %v while a renews the lease", holder, err)
	}
	// Renewals fail from here on. Redis expires the key ttl after it got
	// the last renewal, which was sent at a.renewed.
	e.redis.Kill()
	lastSent := time.Unix(0, a.renewed.Load())
	stopAt := lastSent.Add(ttl - a.margin())
	if a.margin() <= 0 || !stopAt.Before(lastSent.Add(ttl)) {
		t.Fatalf("margin %v: the holder would send until Redis may have expired the key", a.margin())
	}
	clock.Advance(clock.Until(stopAt) - time.Millisecond)
	if !pending(2) || held.ctx.Err() != nil {
		t.Fatalf("lapsed %v before the last renewal was %v old: %v", clock.Since(lastSent), ttl-a.margin(), context.Cause(held.ctx))
	}
	clock.Advance(time.Millisecond)
	wait.For(t, "the lease to lapse", func() (bool, string) {
		return held.ctx.Err() != nil, fmt.Sprintf("held %v after the last renewal was sent", clock.Since(lastSent))
	})
	if !errors.Is(context.Cause(held.ctx), errLeaseLost) {
		t.Errorf("cause %v", context.Cause(held.ctx))
	}
}

func TestBackoff(t *testing.T) {
	lo, hi := 100*time.Millisecond, 30*time.Second
	for attempt := 1; attempt <= 40; attempt++ {
		ceil := min(lo<<min(attempt-1, 20), hi)
		var sum time.Duration
		const n = 2000
		for range n {
			d := backoff(attempt, lo, hi)
			if d < 0 || d > ceil {
				t.Fatalf("attempt %d: %v outside [0, %v]", attempt, d, ceil)
			}
			sum += d
		}
		// Full jitter: the mean is half the ceiling.
		if mean := sum / n; mean < ceil*4/10 || mean > ceil*6/10 {
			t.Errorf("attempt %d: mean %v, want about %v", attempt, mean, ceil/2)
		}
	}
}

func slogDiscard() *slog.Logger { return slog.New(slog.DiscardHandler) }
