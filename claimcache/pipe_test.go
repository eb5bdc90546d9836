package claimcache_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// gatedClient holds every send (a single SET or a pipeline) until the test
// opens the gate, and counts them and the commands pipelines carry.
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
	<-g.gate
	cmds, err := g.UniversalClient.Pipelined(ctx, fn)
	g.piped.Add(int64(len(cmds)))
	return cmds, err
}

// sends reports what g has been asked to send so far.
func (g *gatedClient) sends() string {
	return fmt.Sprintf("%d single, %d pipelines", g.singles.Load(), g.pipelines.Load())
}

// newGatedCache is a cache on miniredis (cfg, if given, its configuration;
// else an hour's WaitBudget) whose sends wait at g's gate.
func newGatedCache(t *testing.T, cfg ...claimcache.Config) (*claimcache.Cache, *gatedClient) {
	t.Helper()
	mini := miniredis.RunT(t)
	client, err := claimcache.NewClient("redis://"+mini.Addr(), callTimeout, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	g := &gatedClient{UniversalClient: client, gate: make(chan struct{})}
	// The gate holds sends as long as a test needs, on a machine as busy
	// as it is: no call queued behind it gives up meanwhile unless the
	// test sets a budget of its own.
	conf := claimcache.Config{WaitBudget: time.Hour}
	if len(cfg) > 0 {
		conf = cfg[0]
	}
	conf.Client = g
	c, err := claimcache.New(conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, g
}

// A claim with nothing in flight goes at once, alone; behind it, a lone
// claim waits and two take the second slot together; while both slots are
// busy, claims queue, and the slot that frees next sends them all in one
// pipeline, each with its own verdict.
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
	sent := func(what string, single, pipelines int64) {
		t.Helper()
		wait.For(t, what, func() (bool, string) {
			return g.singles.Load() == single && g.pipelines.Load() == pipelines, g.sends()
		})
	}
	queued := func(what string, n int) {
		t.Helper()
		wait.For(t, what, func() (bool, string) {
			q := claimcache.PipeQueued(c)
			return q == n, fmt.Sprint(q, " queued; ", g.sends())
		})
	}
	claim(0)
	sent("the first claim sent alone", 1, 0)
	claim(1)
	queued("a lone claim behind it waiting", 1)
	claim(2)
	sent("two claims in the second slot", 1, 1)
	for i := 3; i < n; i++ {
		claim(i)
	}
	queued("the rest queued", n-3)
	close(g.gate)
	wg.Wait()
	for i, v := range verdicts {
		if v != claimcache.Won {
			t.Errorf("claim %d: %v, want won", i, v)
		}
	}
	if p, cmds := g.pipelines.Load(), g.piped.Load(); p != 2 || cmds != n-1 {
		t.Errorf("%d pipelines carried %d claims, want 2 carrying %d (2, then the %d queued)", p, cmds, n-1, n-3)
	}
}

// A claim whose caller gives up while it waits its turn returns at once
// with the caller's error; the pipe still answers the others.
func TestQueuedClaimHonoursItsContext(t *testing.T) {
	c, g := newGatedCache(t)
	held := make(chan error, 1)
	k := newKey(t)
	go func() {
		_, err := c.Claim(context.Background(), k, digest("a"))
		held <- err
	}()
	wait.For(t, "a claim in flight", func() (bool, string) { return g.singles.Load() == 1, g.sends() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	k2 := newKey(t)
	go func() {
		_, err := c.Claim(ctx, k2, digest("a"))
		done <- err
	}()
	wait.For(t, "the claim queued", func() (bool, string) {
		q := claimcache.PipeQueued(c)
		return q == 1, fmt.Sprint(q, " queued")
	})
	cancel()
	if err := <-done; err == nil {
		t.Error("a claim given up on returned no error")
	}
	close(g.gate)
	if err := <-held; err != nil {
		t.Error(err)
	}
}

// An owned completion has no caller waiting: it waits for the next claim
// and rides in its pipeline instead of a round trip of its own.
func TestCompletionRidesWithTheNextClaim(t *testing.T) {
	c, g := newGatedCache(t)
	close(g.gate)
	claimcache.SetCarryWait(c, time.Hour) // only a claim sends it
	ctx := context.Background()
	done, next := newKey(t), newKey(t)
	won, err := c.Claim(ctx, done, digest("a"))
	if err != nil || won.Verdict != claimcache.Won {
		t.Fatalf("claim: %v %v", won.Verdict, err)
	}
	g.singles.Store(0)
	completed := make(chan error, 1)
	go func() {
		completed <- c.CompleteMany(ctx, []claimcache.Completion{{Key: done, Digest: digest("a"), Response: []byte("answer"), Owned: true, Epoch: won.Epoch}})
	}()
	wait.For(t, "the completion waiting to ride", func() (bool, string) {
		return claimcache.PipeRiders(c) == 1, g.sends()
	})
	if r, err := c.Claim(ctx, next, digest("a")); err != nil || r.Verdict != claimcache.Won {
		t.Fatalf("claim: %v %v", r.Verdict, err)
	}
	if err := <-completed; err != nil {
		t.Fatal(err)
	}
	if p, cmds := g.pipelines.Load(), g.piped.Load(); g.singles.Load() != 0 || p != 1 || cmds != 2 {
		t.Errorf("%s carrying %d commands, want one pipeline carrying the claim and the completion", g.sends(), cmds)
	}
	if r, err := c.Claim(ctx, done, digest("a")); err != nil || r.Verdict != claimcache.Done || r.Response != "answer" {
		t.Errorf("after the completion: %v %q %v, want done", r.Verdict, r.Response, err)
	}
}

// A call that waits its turn longer than the cache's WaitBudget (Redis too
// slow to serve the queue) gives up with ErrSlow, and the breaker and
// OnError hear it as a failed call.
func TestQueuedClaimGivesUpAtTheWaitBudget(t *testing.T) {
	var slow atomic.Int64
	c, g := newGatedCache(t, claimcache.Config{WaitBudget: 50 * time.Millisecond,
		OnError: func(err error) {
			if errors.Is(err, claimcache.ErrSlow) {
				slow.Add(1)
			}
		}})
	held := make(chan error, 1)
	k, k2 := newKey(t), newKey(t)
	go func() {
		_, err := c.Claim(context.Background(), k, digest("a"))
		held <- err
	}()
	wait.For(t, "a claim in flight", func() (bool, string) { return g.singles.Load() == 1, g.sends() })
	_, err := c.Claim(context.Background(), k2, digest("a")) // queued behind it, never sent while the gate is shut
	if !errors.Is(err, claimcache.ErrSlow) {
		t.Errorf("a claim that waited past the budget: %v, want ErrSlow", err)
	}
	if slow.Load() != 1 {
		t.Errorf("OnError heard %d slow calls, want 1", slow.Load())
	}
	close(g.gate)
	if err := <-held; err != nil {
		t.Error(err)
	}
}
