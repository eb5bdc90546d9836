package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable/redisstream"
)

// The scheduler on its own: a held order's entries neither count against
// the reader's room for flowing work nor go out before its head, and once
// its head is done they flow again, in order.
func TestSchedulerHoldsOneOrder(t *testing.T) {
	var heldOrders []int
	s := newScheduler(2, 4, func(n int) { heldOrders = append(heldOrders, n) })
	defer s.close()
	entry := func(ms int, order string) redis.XMessage {
		return redis.XMessage{ID: fmt.Sprintf("%d-0", ms), Values: map[string]any{redisstream.FieldOrderNo: order}}
	}
	full := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.fullLocked()
	}
	take := func(wantID string) *orderQueue {
		t.Helper()
		q, xm, _, ok := s.next()
		if !ok || xm.ID != wantID {
			t.Fatalf("next: %s %v, want %s", xm.ID, ok, wantID)
		}
		return q
	}

	s.add(entry(1, "A"))
	a := take("1-0")
	s.failed(a, time.Hour) // A is held: its head waits for a retry
	s.add(entry(2, "A"))
	s.add(entry(3, "A"))
	if full() {
		t.Error("no room to read with only a held order's entries in hand")
	}
	s.add(entry(4, "B"))
	s.add(entry(5, "B"))
	if !full() {
		t.Error("room to read with 2 flowing entries, the cap")
	}
	if got := s.oldest(); !got.Equal(time.UnixMilli(1)) {
		t.Errorf("oldest %v, want the held head's time", got)
	}
	b := take("4-0") // B flows while A waits
	s.done(b)
	if full() {
		t.Error("no room to read after a flowing entry finished")
	}
	take("5-0")
	s.done(b)
	s.add(entry(6, "A"))
	if !full() {
		t.Error("room to read with 4 held entries, the held cap")
	}

	// A's retry comes due now: its head, then its later entries in order.
	s.mu.Lock()
	a.retry.Reset(0)
	s.mu.Unlock()
	s.done(take("1-0"))
	if !full() {
		t.Error("room to read once A recovered: its 3 later entries flow now, over the cap of 2")
	}
	for _, id := range []string{"2-0", "3-0", "6-0"} {
		s.done(take(id))
	}
	if full() {
		t.Error("no room to read with nothing in hand")
	}
	if got := fmt.Sprint(heldOrders); got != "[1 0]" {
		t.Errorf("held orders went %s, want [1 0]", got)
	}
	if got := s.oldest(); !got.IsZero() {
		t.Errorf("oldest %v with nothing in hand", got)
	}
	s.close()
	if _, _, _, ok := s.next(); ok {
		t.Error("next after close handed out an order")
	}
	if s.waitRoom() {
		t.Error("waitRoom after close says read on")
	}
}
