package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
)

// The lease makes one forwarder per group the active one: a Redis key
// holding "<name> <token>" with a TTL, renewed by its holder. The holder
// stops sending before the TTL could have run out in Redis (it counts from
// before its SET was sent, less a margin), so a successor, which can only
// take the key after Redis expired it, never sends while the old holder
// still does: not after a SIGKILL, a network partition or a long pause.
// Its times and timers come from an injected clock, so that rule is tested
// on a clock the test moves, not with wall-clock margins.

// acquireScript takes the lease if it is free or already ours (a retried
// or renewing call), and returns Redis's clock; otherwise the holder.
var acquireScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  local t = redis.call('TIME')
  return {1, t[1], t[2]}
end
return {0, v}
`)

// releaseScript deletes the lease only if it is still ours.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

var errLeaseLost = errors.New("lease lost")

type lease struct {
	client redis.UniversalClient
	key    string
	value  string
	ttl    time.Duration
	clock  clockwork.Clock
	// skew is Redis's clock minus ours (ns), measured at each renewal.
	skew atomic.Int64
	// renewed is when (unix ns) the last successful acquire or renewal
	// was sent: the lease is good until ttl after it, less the margin.
	renewed atomic.Int64
}

func newLease(client redis.UniversalClient, key, name string, ttl time.Duration, clock clockwork.Clock) *lease {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &lease{client: client, key: key, value: name + " " + hex.EncodeToString(b[:]), ttl: ttl, clock: clock}
}

// margin is how long before the TTL could end in Redis the holder stops.
func (l *lease) margin() time.Duration { return l.ttl / 4 }

// try acquires or renews the lease once. It returns the time taken just
// before the call (the lease's validity counts from there) and "" when the
// lease is ours, or the current holder's value.
func (l *lease) try(ctx context.Context) (time.Time, string, error) {
	start := l.clock.Now()
	res, err := acquireScript.Run(ctx, l.client, []string{l.key}, l.value, l.ttl.Milliseconds()).Slice()
	if err != nil {
		return start, "", fmt.Errorf("lease %s: %w", l.key, err)
	}
	if len(res) == 3 && res[0] == int64(1) {
		sec, _ := strconv.ParseInt(fmt.Sprint(res[1]), 10, 64)
		usec, _ := strconv.ParseInt(fmt.Sprint(res[2]), 10, 64)
		mid := start.Add(l.clock.Since(start) / 2)
		l.skew.Store(time.Unix(sec, usec*1000).Sub(mid).Nanoseconds())
		l.renewed.Store(start.UnixNano())
		return start, "", nil
	}
	if len(res) == 2 {
		return start, fmt.Sprint(res[1]), nil
	}
	return start, "", fmt.Errorf("lease %s: unexpected reply %v", l.key, res)
}

// release gives the lease up if it is still ours.
func (l *lease) release(ctx context.Context) {
	_ = releaseScript.Run(ctx, l.client, []string{l.key}, l.value).Err()
}

// now is the current time on Redis's clock, as of the last renewal.
func (l *lease) now() time.Time {
	return l.clock.Now().Add(time.Duration(l.skew.Load()))
}

// heldLease is one term of holding the lease.
type heldLease struct {
	// ctx ends when the lease may have lapsed, or when stop is called.
	ctx  context.Context
	stop func()
}

// hold keeps the lease acquired at start renewed every ttl/4. Its context
// ends at start+ttl-margin unless a renewal moved that on: a timer of its
// own, so a renewal stuck on a hung Redis cannot hold it open.
func (l *lease) hold(start time.Time, log *slog.Logger) heldLease {
	ctx, cancel := context.WithCancelCause(context.Background())
	lapse := l.clock.AfterFunc(l.clock.Until(start.Add(l.ttl-l.margin())), func() {
		cancel(fmt.Errorf("%w: not renewed for %v", errLeaseLost, l.clock.Since(time.Unix(0, l.renewed.Load())).Round(time.Millisecond)))
	})
	done := make(chan struct{})
	go func() {
		tick := l.clock.NewTicker(l.ttl / 4)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.Chan():
			}
			rctx, rcancel := context.WithTimeout(ctx, l.ttl/4)
			at, holder, err := l.try(rctx)
			rcancel()
			switch {
			case ctx.Err() != nil:
				return // lapsed meanwhile: a late success must not revive it
			case err != nil:
				log.Warn("lease renewal failed", "error", err.Error())
			case holder != "":
				cancel(fmt.Errorf("%w: now held by %s", errLeaseLost, holder))
				return
			default:
				lapse.Reset(l.clock.Until(at.Add(l.ttl - l.margin())))
			}
		}
	}()
	return heldLease{ctx: ctx, stop: func() {
		lapse.Stop()
		close(done)
		cancel(context.Canceled)
	}}
}
