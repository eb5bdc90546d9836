package claimcache_test

import (
	"context"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
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
	if got := c.State(); got != "ok" {
		t.Fatalf("state with Redis up: %s", got)
	}
	waitState := func(want string) time.Duration {
		t.Helper()
		start := time.Now()
		for c.State() != want {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("state did not become %q within 5 s", want)
			}
			time.Sleep(50 * time.Millisecond)
		}
		return time.Since(start)
	}
	srv.Kill()
	t.Logf("degraded %v after the kill (no traffic)", waitState("degraded").Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("ok %v after the restart", waitState("ok").Round(time.Millisecond))
}
