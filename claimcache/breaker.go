package claimcache

import (
	"sync/atomic"
	"time"
)

// breaker stops calls to a Redis that keeps failing. It opens after
// `threshold` consecutive failures (one timeout under load is not an
// outage), stays open for `cooldown`, then lets a single probe through
// (half-open): the probe's success closes it, its failure reopens it. The
// closed path is two atomic loads.
type breaker struct {
	threshold int32
	cooldown  time.Duration
	now       func() time.Time // the clock the cooldown runs on
	onChange  func(open bool)

	failures  atomic.Int32
	open      atomic.Bool
	openUntil atomic.Int64 // unix nanos
	probing   atomic.Bool
}

// newBreaker returns a closed breaker whose cooldown runs on now.
func newBreaker(threshold int, cooldown time.Duration, now func() time.Time, onChange func(bool)) *breaker {
	return &breaker{threshold: int32(threshold), cooldown: cooldown, now: now, onChange: onChange}
}

// allow reports whether a call may go to Redis now.
func (b *breaker) allow() bool {
	if !b.open.Load() {
		return true
	}
	if b.now().UnixNano() < b.openUntil.Load() {
		return false
	}
	return b.probing.CompareAndSwap(false, true) // one probe at a time
}

// record notes a call's outcome (nil: Redis answered).
func (b *breaker) record(err error) {
	if err == nil {
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
		if b.open.Load() {
			b.probing.Store(false)
			if b.open.CompareAndSwap(true, false) && b.onChange != nil {
				b.onChange(false)
			}
		}
		return
	}
	n := b.failures.Add(1)
	if b.open.Load() {
		if b.probing.CompareAndSwap(true, false) { // the probe failed
			b.openUntil.Store(b.now().Add(b.cooldown).UnixNano())
		}
		return
	}
	if n >= b.threshold {
		b.openUntil.Store(b.now().Add(b.cooldown).UnixNano())
		if b.open.CompareAndSwap(false, true) && b.onChange != nil {
			b.onChange(true)
		}
	}
}

// isOpen reports whether calls are being skipped.
func (b *breaker) isOpen() bool { return b.open.Load() }

// reset closes the breaker (reporting the change) and forgets its failures:
// for a breaker whose node no longer serves any key.
func (b *breaker) reset() {
	b.failures.Store(0)
	b.probing.Store(false)
	if b.open.CompareAndSwap(true, false) && b.onChange != nil {
		b.onChange(false)
	}
}
