package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/redisstream"
)

// An event failing past MaxAge is dead-lettered with every later event of
// its order (never attempted), across a restart; other orders flow on
// meanwhile; -redrive-dead delivers them in order once the receiver is
// fixed, and leaves an order that still fails dead.
func TestDeadLetterAndRedrive(t *testing.T) {
	e := newTestEnv(t)
	cfg := e.config("f1")
	cfg.MaxAge = 300 * time.Millisecond
	// Re-drive holds the lease while it works: on a loaded machine a
	// 500 ms lease can lapse between renewals (its context then ends the
	// re-drive). Nothing here waits for a lease to expire.
	cfg.LeaseTTL = 2 * time.Second
	// E flows beside D and G, hashed to the lane D once shared with it:
	// D's retries must not hold it.
	const D, G = "dies", "stays-dead"
	E := ""
	for i := 0; E == ""; i++ {
		if o := fmt.Sprintf("E-%d", i); oldLane(o, cfg.Partitions) == oldLane(D, cfg.Partitions) {
			E = o
		}
	}
	var mu sync.Mutex
	failing := map[string]bool{}
	setFailing := func(orders ...string) {
		mu.Lock()
		failing = map[string]bool{}
		for _, o := range orders {
			failing[o] = true
		}
		mu.Unlock()
	}
	e.recv.setBehave(func(order string, _ int64, _ int) verdict {
		mu.Lock()
		defer mu.Unlock()
		if failing[order] {
			return verdict{status: http.StatusServiceUnavailable}
		}
		return verdict{status: http.StatusOK}
	})
	stop := e.start(cfg)
	e.publish(1, D, G, E)
	waitFor(t, "the first events", func() bool { return e.recv.unique() == 3 })

	setFailing(D, G)
	d2 := e.publish(1, D, G, E) // D2 and G2 fail until they are too old
	d34 := e.publish(2, D, E)   // D3, D4 follow D2 without an attempt
	waitFor(t, "4 dead entries", func() bool { return len(e.deadEntries()) == 4 })
	waitFor(t, "E's events", func() bool { return e.recv.unique() == 3+3 })
	dead := e.deadEntries()
	checkDead(t, dead, D, []int64{d2[0].ID, d34[0].ID, d34[2].ID}, e)
	checkDead(t, dead, G, []int64{d2[1].ID}, e)
	for _, m := range []durable.OutboxMessage{d34[0], d34[2]} {
		if n := e.recv.tries(m.ID); n != 0 {
			t.Errorf("event %d of dead order %s was attempted %d times", m.ID, m.OrderNo, n)
		}
	}
	deadAt, _ := time.Parse(time.RFC3339Nano, dead[0].Values[FieldDeadAt].(string))
	if at := e.recv.acceptedAt(d2[2].ID); at.IsZero() || !at.Before(deadAt) {
		t.Errorf("E's event was accepted at %v, not before D2 died at %v: D's retries held it", at, deadAt)
	}
	if got := e.deadOrders(); !slices.Equal(got, []string{D, G}) {
		t.Errorf("dead orders %v, want [%s %s]", got, D, G)
	}
	if n := counter(cfg.Metrics, resultDead); n != 4 {
		t.Errorf("dead = %v, want 4", n)
	}
	waitFor(t, "every entry acknowledged", func() bool { return e.pending() == 0 })

	// A restart keeps the dead orders: D5 follows D2..D4 without an attempt.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	stop = e.start(withLease(e.config("f2"), cfg.LeaseTTL))
	d5 := e.publish(1, D, E)
	waitFor(t, "D5 dead-lettered", func() bool { return len(e.deadEntries()) == 5 })
	waitFor(t, "E's event", func() bool { return e.recv.unique() == 3+3+1 })
	if n := e.recv.tries(d5[0].ID); n != 0 {
		t.Errorf("D5 attempted %d times after a restart", n)
	}

	// Re-drive refuses while a forwarder runs: it would race it.
	if _, err := Redrive(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "holds the lease") {
		t.Errorf("re-drive beside a running forwarder: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	setFailing(G) // D's receiver is fixed, G's is not
	res, err := Redrive(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Delivered != 4 || res.Remaining != 1 || !slices.Equal(res.StillDead, []string{G}) {
		t.Errorf("re-drive %+v, want 4 delivered, 1 remaining, [%s] still dead", res, G)
	}
	dead = e.deadEntries()
	checkDead(t, dead, G, []int64{d2[1].ID}, e)
	if len(dead) != 1 {
		t.Errorf("dead stream holds %d entries, want G2 only", len(dead))
	}
	if got := e.deadOrders(); !slices.Equal(got, []string{G}) {
		t.Errorf("dead orders %v, want [%s]", got, G)
	}

	// Forwarding again: D's new event follows its re-driven ones, G's dies.
	stop = e.start(withLease(e.config("f3"), cfg.LeaseTTL))
	last := e.publish(1, D, G)
	waitFor(t, "D6", func() bool { return e.recv.tries(last[0].ID) == 1 })
	waitFor(t, "G3 dead-lettered", func() bool { return len(e.deadEntries()) == 2 })
	checkDead(t, e.deadEntries(), G, []int64{d2[1].ID, last[1].ID}, e)
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	setFailing()
	res, err = Redrive(context.Background(), cfg)
	if err != nil || res.Delivered != 2 || res.Remaining != 0 || len(res.StillDead) != 0 {
		t.Errorf("second re-drive %+v %v, want 2 delivered and nothing left", res, err)
	}
	if n := len(e.deadEntries()); n != 0 {
		t.Errorf("dead stream holds %d entries after a full re-drive", n)
	}
	if got := e.deadOrders(); len(got) != 0 {
		t.Errorf("dead orders %v after a full re-drive", got)
	}
	e.recv.checkNoProblems()
	e.checkOrder(e.recv.snapshot())
}

// checkDead asserts order's entries in the dead stream are want, in that
// order, carrying the original fields, the error and the attempts.
func checkDead(t *testing.T, dead []redis.XMessage, order string, want []int64, e *testEnv) {
	t.Helper()
	var got []int64
	for _, d := range dead {
		if d.Values[redisstream.FieldOrderNo] != order {
			continue
		}
		m, err := decode(d)
		if err != nil {
			t.Errorf("dead entry %s: %v", d.ID, err)
			continue
		}
		got = append(got, m.OutboxID)
		orig := e.published[m.OutboxID]
		if m.Topic != orig.Topic || m.Payload != string(orig.Payload) {
			t.Errorf("dead entry %s: fields %v differ from the published event", d.ID, d.Values)
		}
		first := len(got) == 1
		attempts := d.Values[FieldAttempts]
		errText, _ := d.Values[FieldError].(string)
		switch {
		case first && (attempts == "0" || !strings.Contains(errText, "503")):
			t.Errorf("first dead entry of %s: attempts %v error %q, want attempts and the receiver's 503", order, attempts, errText)
		case !first && (attempts != "0" || !strings.Contains(errText, "earlier event")):
			t.Errorf("later dead entry of %s: attempts %v error %q, want 0 and the earlier dead event", order, attempts, errText)
		}
		if d.Values[FieldSourceID] == "" {
			t.Errorf("dead entry %s has no %s", d.ID, FieldSourceID)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("dead entries of %s: %v, want %v", order, got, want)
	}
}

// withLease is cfg with another lease TTL.
func withLease(cfg Config, ttl time.Duration) Config {
	cfg.LeaseTTL = ttl
	return cfg
}
