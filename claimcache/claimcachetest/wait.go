package claimcachetest

import "time"

// T is the part of testing.TB that WaitFor uses. Benches link this
// package into their binaries, which must not link package testing.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
}

// WaitTimeout is how long WaitFor waits: a loaded machine (a test binary
// among others on two cores) delays a background step by seconds, never
// by this much.
const WaitTimeout = 30 * time.Second

// WaitFor polls cond every 10 ms until it reports ok and returns how long
// that took. If cond is not ok within WaitTimeout, it fails t, naming what
// was awaited and what cond saw last (its seen).
func WaitFor(t T, what string, cond func() (ok bool, seen string)) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ok, seen := cond()
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > WaitTimeout {
			t.Fatalf("%s: not within %v; last saw: %s", what, WaitTimeout, seen)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
