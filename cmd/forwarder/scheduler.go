package main

import (
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// scheduler hands one lease term's entries to the workers so that a
// failing order holds back only its own later events.
//
// The reader appends every entry to its order's FIFO queue, in stream
// order. An order is in exactly one of four states: ready (in the ready
// queue), running (a worker is attempting its head entry), waiting (its
// head failed and a timer will make it ready again after the backoff), or
// gone (no entries in hand). So one attempt per order is ever in flight and
// its events go out in stream order, while N workers take whichever orders
// are ready. A worker makes one attempt and gives the order back: once the
// head is finished (delivered or dead-lettered) the order goes to the back
// of the ready queue if it has more entries, so no order monopolises a
// worker; after a failure a timer, not the worker, waits out the backoff.
//
// An order whose head has failed at least once is held until that head is
// finished: its entries are counted apart from the flowing ones. The
// reader pauses only when the flowing entries reach flowCap (the workers
// are saturated with work that can go), or when the held entries reach
// heldCap. A held order costs memory for each of its entries, bounded by
// heldCap and, in time, by MaxAge: its head dies at MaxAge and every later
// entry of the order follows it without an attempt. heldCap is the one
// limit held orders share with the others; a few orders' events do not
// come near it, it is there for a receiver that refuses most orders.
// Entries of a held order that arrive meanwhile are appended behind it, so
// when it recovers they go out in order, one by one.
type scheduler struct {
	flowCap, heldCap int

	mu sync.Mutex
	// work signals a worker that the ready queue has an order or the
	// scheduler closed; room signals the reader that it may read again.
	work, room *sync.Cond
	orders     map[string]*orderQueue
	ready      []*orderQueue
	flowing    int // entries of orders not held
	held       int // entries of held orders
	heldOrders int
	closed     bool
	// onHeld reports heldOrders whenever it changes (the gauge).
	onHeld func(int)
}

// orderQueue is one order's entries in hand, oldest first.
type orderQueue struct {
	order   string
	entries []redis.XMessage
	// failures counts the failed attempts of the head entry; held while > 0.
	failures int
	// retry is the timer that makes a waiting order ready again.
	retry *time.Timer
}

func (q *orderQueue) isHeld() bool { return q.failures > 0 }

func newScheduler(flowCap, heldCap int, onHeld func(int)) *scheduler {
	s := &scheduler{flowCap: max(flowCap, 1), heldCap: max(heldCap, 1),
		orders: map[string]*orderQueue{}, onHeld: onHeld}
	s.work = sync.NewCond(&s.mu)
	s.room = sync.NewCond(&s.mu)
	return s
}

// add appends an entry to its order's queue; an order that had nothing in
// hand becomes ready.
func (s *scheduler) add(xm redis.XMessage) {
	order := orderOf(xm)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	q := s.orders[order]
	if q == nil {
		q = &orderQueue{order: order}
		s.orders[order] = q
		s.ready = append(s.ready, q)
		s.work.Signal()
	}
	q.entries = append(q.entries, xm)
	if q.isHeld() {
		s.held++
	} else {
		s.flowing++
	}
}

// waitRoom blocks while the flowing or the held entries are at their cap;
// false once the scheduler closed.
func (s *scheduler) waitRoom() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.closed && s.fullLocked() {
		s.room.Wait()
	}
	return !s.closed
}

// fullLocked says whether the reader must wait; s.mu is held.
func (s *scheduler) fullLocked() bool {
	return s.flowing >= s.flowCap || s.held >= s.heldCap
}

// next blocks until an order is ready and returns it with its head entry
// and the number of attempts that failed before; false once closed.
func (s *scheduler) next() (*orderQueue, redis.XMessage, int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.closed && len(s.ready) == 0 {
		s.work.Wait()
	}
	if s.closed {
		return nil, redis.XMessage{}, 0, false
	}
	q := s.ready[0]
	s.ready[0] = nil
	s.ready = s.ready[1:]
	return q, q.entries[0], q.failures, true
}

// done records that q's head entry is finished (delivered, dead-lettered
// or skipped): the order is no longer held, and goes to the back of the
// ready queue if it has more entries.
func (s *scheduler) done(q *orderQueue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q.entries[0] = redis.XMessage{}
	q.entries = q.entries[1:]
	if q.isHeld() {
		s.held--
		// The order's later entries flow again.
		s.held -= len(q.entries)
		s.flowing += len(q.entries)
		q.failures = 0
		s.setHeldOrders(s.heldOrders - 1)
	} else {
		s.flowing--
	}
	s.room.Broadcast()
	if s.closed {
		return
	}
	if len(q.entries) == 0 {
		delete(s.orders, q.order)
		return
	}
	s.ready = append(s.ready, q)
	s.work.Signal()
}

// failed records that q's head entry failed: the order is held (its
// entries move from flowing to held) and becomes ready again after wait.
func (s *scheduler) failed(q *orderQueue, wait time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !q.isHeld() {
		s.flowing -= len(q.entries)
		s.held += len(q.entries)
		s.setHeldOrders(s.heldOrders + 1)
		s.room.Broadcast()
	}
	q.failures++
	if s.closed {
		return
	}
	q.retry = time.AfterFunc(wait, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		q.retry = nil
		if s.closed {
			return
		}
		s.ready = append(s.ready, q)
		s.work.Signal()
	})
}

// close wakes every worker and the reader for them to return, and stops
// the retry timers. What is still in hand stays pending in the group.
func (s *scheduler) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	for _, q := range s.orders {
		if q.retry != nil {
			q.retry.Stop()
			q.retry = nil
		}
	}
	s.work.Broadcast()
	s.room.Broadcast()
}

func (s *scheduler) setHeldOrders(n int) {
	s.heldOrders = n
	if s.onHeld != nil {
		s.onHeld(n)
	}
}

// oldest is the stream time of the oldest entry in hand, zero when none:
// each queue is in stream order, so it is the oldest head.
func (s *scheduler) oldest() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var oldest time.Time
	for _, q := range s.orders {
		if len(q.entries) == 0 {
			continue
		}
		if t := entryTime(q.entries[0].ID); oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	return oldest
}
