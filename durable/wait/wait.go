// Package wait holds the one sleep the background loops use: a wait that
// ends early when its context does. It imports nothing of the project, so
// every package (the forwarder's, which links no Postgres client,
// included) may use it.
package wait

import (
	"context"
	"time"
)

// Sleep waits d, or less when ctx ends first; it reports whether the whole
// d passed. A d of 0 or less returns at once.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// T is the part of testing.TB that For uses; this package never imports
// package testing, so binaries that link it (the benches) link no test
// code.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Timeout is how long For waits: a loaded machine (a test binary among
// others on two cores) delays a background step by seconds, never by this
// much.
const Timeout = 30 * time.Second

// For is the one poller of the tests: it polls cond every 10 ms until it
// reports ok and returns how long that took. If cond is not ok within
// Timeout, it fails t, naming what was awaited and what cond saw last
// (its seen). A test waits for the condition it needs, never for a sleep.
func For(t T, what string, cond func() (ok bool, seen string)) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ok, seen := cond()
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > Timeout {
			t.Fatalf("%s: not within %v; last saw: %s", what, Timeout, seen)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Within polls cond every 10 ms until it holds (true) or d passes (false),
// for a test that bounds a wait by a figure of its own and reports a miss
// itself.
func Within(d time.Duration, cond func() bool) bool {
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
