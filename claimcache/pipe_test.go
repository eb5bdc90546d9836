package claimcache_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
)

// gatedClient holds every single SET until the test opens the gate, and
// counts the pipelines and the commands they carry.
type gatedClient struct {
	redis.UniversalClient
	gate      chan struct{}
	singles   atomic.Int64
	pipelines atomic.Int64
	piped     atomic.Int64
}

func (g *gatedClient) SetArgs(ctx context.Context, key string, value any, a redis.SetArgs) *redis.StatusCmd {
	g.singles.Add(1)
	<-g.gate
	return g.UniversalClient.SetArgs(ctx, key, value, a)
}

func (g *gatedClient) Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	g.pipelines.Add(1)
	cmds, err := g.UniversalClient.Pipelined(ctx, fn)
	g.piped.Add(int64(len(cmds)))
	return cmds, err
}

// newGatedCache is a cache on miniredis whose single SETs wait at g's gate.
func newGatedCache(t *testing.T) (*claimcache.Cache, *gatedClient) {
	t.Helper()
	mini := miniredis.RunT(t)
	client, err := claimcache.NewClient("redis://"+mini.Addr(), callTimeout, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	g := &gatedClient{UniversalClient: client, gate: make(chan struct{})}
	c, err := claimcache.New(claimcache.Config{Client: g})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, g
}

// While every slot is busy, claims queue, and the slot that frees next
// sends them all in one pipeline, each with its own verdict.
func TestClaimsQueuedWhileBusyShareOnePipeline(t *testing.T) {
	c, g := newGatedCache(t)

	const n = 50
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = newKey(t)
	}
	verdicts := make([]claimcache.Verdict, n)
	var wg sync.WaitGroup
	claim := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Claim(context.Background(), keys[i], digest("a"))
			if err != nil {
				t.Error(err)
			}
			verdicts[i] = r.Verdict
		}()
	}
	// Two claims take both slots and are held at the gate...
	claim(0)
	claim(1)
	claimcachetest.WaitFor(t, "both slots busy", func() (bool, string) { n := g.singles.Load(); return n == 2, fmt.Sprint(n, " held") })
	// ... while the rest queue behind them.
	for i := 2; i < n; i++ {
		claim(i)
	}
	claimcachetest.WaitFor(t, "the rest queued", func() (bool, string) { q := claimcache.PipeQueued(c); return q == n-2, fmt.Sprint(q, " queued") })
	close(g.gate)
	wg.Wait()
	for i, v := range verdicts {
		if v != claimcache.Won {
			t.Errorf("claim %d: %v, want won", i, v)
		}
	}
	if p, cmds := g.pipelines.Load(), g.piped.Load(); p != 1 || cmds != n-2 {
		t.Errorf("%d pipelines carried %d claims, want 1 carrying %d", p, cmds, n-2)
	}
}

// A claim whose caller gives up while it waits for a slot returns at once
// with the caller's error; the pipe still answers the others.
func TestQueuedClaimHonoursItsContext(t *testing.T) {
	c, g := newGatedCache(t)
	var wg sync.WaitGroup
	for _, k := range [][]byte{newKey(t), newKey(t)} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Claim(context.Background(), k, digest("a")); err != nil {
				t.Error(err)
			}
		}()
	}
	claimcachetest.WaitFor(t, "both slots busy", func() (bool, string) { n := g.singles.Load(); return n == 2, fmt.Sprint(n, " held") })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	k := newKey(t)
	go func() {
		_, err := c.Claim(ctx, k, digest("a"))
		done <- err
	}()
	claimcachetest.WaitFor(t, "the claim queued", func() (bool, string) { q := claimcache.PipeQueued(c); return q == 1, fmt.Sprint(q, " queued") })
	cancel()
	if err := <-done; err == nil {
		t.Error("a claim given up on returned no error")
	}
	close(g.gate)
	wg.Wait()
}
