package claimcache_test

import (
	"context"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// Readiness tells a dead Redis without any traffic (the breaker alone only
// opens once requests fail), and tells it is back once it answers.
func TestStateProbesRedis(t *testing.T) {
	srv, err := claimcachetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	c := newCache(t, srv.URL(), claimcache.Config{})
	// The probe's PING has a deadline of its own (100 ms): on a loaded
	// machine one may miss it, and the next probe, a second later, answers.
	waitState := func(want string) time.Duration {
		t.Helper()
		return wait.For(t, "state "+want, func() (bool, string) {
			got := c.State()
			return got == want, got
		})
	}
	t.Logf("ok %v after the start", waitState("ok").Round(time.Millisecond))
	srv.Kill()
	t.Logf("degraded %v after the kill (no traffic)", waitState("degraded").Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), wait.Timeout)
	defer cancel()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("ok %v after the restart", waitState("ok").Round(time.Millisecond))
}
