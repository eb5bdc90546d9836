package claimcache_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// backend is one Redis the suite runs against.
type backend struct {
	name string
	url  func(t *testing.T) string
	// advance lets TTLs pass: FastForward on miniredis, sleeping on Redis.
	advance func(d time.Duration)
}

var realRedis struct {
	once sync.Once
	srv  *claimcachetest.Server
	err  error
}

// realCluster is a Redis Cluster of 3 masters with a replica each, shared
// by the tests that only read and write their own keys.
var realCluster struct {
	once sync.Once
	c    *claimcachetest.Cluster
	err  error
}

func sharedCluster(t *testing.T) *claimcachetest.Cluster {
	t.Helper()
	realCluster.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		realCluster.c, realCluster.err = claimcachetest.StartCluster(ctx, 3, 1, time.Second)
	})
	if realCluster.err != nil {
		t.Fatal(realCluster.err)
	}
	return realCluster.c
}

func TestMain(m *testing.M) {
	code := m.Run()
	if realRedis.srv != nil {
		realRedis.srv.Stop()
	}
	if realCluster.c != nil {
		realCluster.c.Stop()
	}
	os.Exit(code)
}

func backends(t *testing.T) []backend {
	var mini *miniredis.Miniredis
	return []backend{
		{
			name: "miniredis",
			url: func(t *testing.T) string {
				mini = miniredis.RunT(t)
				return "redis://" + mini.Addr()
			},
			advance: func(d time.Duration) { mini.FastForward(d) },
		},
		{
			name: "redis-server",
			url: func(t *testing.T) string {
				realRedis.once.Do(func() { realRedis.srv, realRedis.err = claimcachetest.Start() })
				if realRedis.err != nil {
					t.Fatal(realRedis.err)
				}
				return realRedis.srv.URL()
			},
			advance: func(d time.Duration) { time.Sleep(d) },
		},
		{
			name:    "redis-cluster",
			url:     func(t *testing.T) string { return sharedCluster(t).URL() },
			advance: func(d time.Duration) { time.Sleep(d) },
		},
	}
}

// fakeClock is a Config.Now that moves only when the test advances it.
type fakeClock struct{ nanos atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.nanos.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

// Now is the clock's time.
func (c *fakeClock) Now() time.Time { return time.Unix(0, c.nanos.Load()) }

// Advance moves the clock d forward.
func (c *fakeClock) Advance(d time.Duration) { c.nanos.Add(int64(d)) }

var keySeq int

// newKey is a key of the test's own: tests never flush a shared server.
func newKey(t *testing.T) []byte {
	keySeq++
	return fmt.Appendf(nil, "test:%s:%d:%d", t.Name(), time.Now().UnixNano(), keySeq)
}

func digest(s string) claimcache.Digest { return sha256.Sum256([]byte(s)) }

// callTimeout bounds each Redis call of the caches tests make. It is far
// above what a call takes on a loaded machine: a test asserts what Redis
// answered, never how fast (a timeout would be a failure of its own).
const callTimeout = 10 * time.Second

func newCache(t *testing.T, url string, cfg claimcache.Config) *claimcache.Cache {
	t.Helper()
	client, err := claimcache.NewClient(url, callTimeout, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	cfg.Client = client
	c, err := claimcache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// The conformance suite: the same cases against miniredis and redis-server.
func TestCacheConformance(t *testing.T) {
	ctx := context.Background()
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			url := be.url(t)
			// TTLs no step of a loaded machine outlasts: an entry expires
			// only in the subtest that lets it.
			c := newCache(t, url, claimcache.Config{PendingTTL: time.Minute, ResultTTL: time.Hour, WaitBudget: 150 * time.Millisecond})
			a, b := digest("a"), digest("b")
			claimOn := func(c *claimcache.Cache, key []byte, d claimcache.Digest) claimcache.Result {
				t.Helper()
				r, err := c.Claim(ctx, key, d)
				if err != nil {
					t.Fatalf("Claim: %v", err)
				}
				return r
			}
			claim := func(key []byte, d claimcache.Digest) claimcache.Result {
				t.Helper()
				return claimOn(c, key, d)
			}

			t.Run("every claim verdict", func(t *testing.T) {
				k := newKey(t)
				won := claim(k, a)
				if won.Verdict != claimcache.Won {
					t.Fatalf("first claim %v, want won", won.Verdict)
				}
				if r := claim(k, a); r.Verdict != claimcache.Busy {
					t.Errorf("same digest while pending: %v, want busy", r.Verdict)
				}
				if r := claim(k, b); r.Verdict != claimcache.Mismatch {
					t.Errorf("other digest while pending: %v, want mismatch", r.Verdict)
				}
				if err := c.Complete(ctx, k, a, []byte("first answer")); err != nil {
					t.Fatal(err)
				}
				if r := claim(k, a); r.Verdict != claimcache.Done || r.Response != "first answer" {
					t.Errorf("after complete: %v %q, want done with the answer", r.Verdict, r.Response)
				}
				if r := claim(k, b); r.Verdict != claimcache.Mismatch {
					t.Errorf("other digest when done: %v, want mismatch", r.Verdict)
				}
			})

			t.Run("complete never overwrites a done entry", func(t *testing.T) {
				k := newKey(t)
				claim(k, a)
				c.Complete(ctx, k, a, []byte("one"))
				if err := c.Complete(ctx, k, a, []byte("two")); err != nil {
					t.Fatal(err)
				}
				if r := claim(k, a); r.Response != "one" {
					t.Errorf("got %q, want the first answer", r.Response)
				}
			})

			t.Run("abort deletes only its own pending entry", func(t *testing.T) {
				k := newKey(t)
				mine := claim(k, a)
				var other claimcache.Token
				other[0] = 0xff
				if err := c.Abort(ctx, k, a, other); err != nil {
					t.Fatal(err)
				}
				if r := claim(k, a); r.Verdict != claimcache.Busy {
					t.Fatalf("after a stranger's abort: %v, want still busy", r.Verdict)
				}
				if err := c.Abort(ctx, k, a, mine.Token); err != nil {
					t.Fatal(err)
				}
				if r := claim(k, a); r.Verdict != claimcache.Won {
					t.Errorf("after own abort: %v, want won", r.Verdict)
				}
				// Abort after Complete must not delete the done entry.
				k2 := newKey(t)
				w := claim(k2, a)
				c.Complete(ctx, k2, a, []byte("kept"))
				c.Abort(ctx, k2, a, w.Token)
				if r := claim(k2, a); r.Verdict != claimcache.Done {
					t.Errorf("abort removed a done entry: %v", r.Verdict)
				}
			})

			t.Run("complete many in one pipeline", func(t *testing.T) {
				k1, k2, k3, k4 := newKey(t), newKey(t), newKey(t), newKey(t)
				claim(k1, a)                            // pending: completed
				claim(k2, a)                            // done already: kept
				c.Complete(ctx, k2, a, []byte("first")) //
				claim(k3, b)                            // another digest's pending: replaced (committed wins)
				err := c.CompleteMany(ctx, []claimcache.Completion{
					{Key: k1, Digest: a, Response: []byte("one")},
					{Key: k2, Digest: a, Response: []byte("second")},
					{Key: k3, Digest: a, Response: []byte("three")},
					{Key: k4, Digest: b, Response: []byte("four")}, // no claim at all
				})
				if err != nil {
					t.Fatal(err)
				}
				for _, w := range []struct {
					k    []byte
					d    claimcache.Digest
					want string
				}{{k1, a, "one"}, {k2, a, "first"}, {k3, a, "three"}, {k4, b, "four"}} {
					if r := claim(w.k, w.d); r.Verdict != claimcache.Done || r.Response != w.want {
						t.Errorf("%s: %v %q, want done %q", w.k, r.Verdict, r.Response, w.want)
					}
				}
			})

			t.Run("an owned completion replaces its own pending entry in one SET", func(t *testing.T) {
				k1, k2 := newKey(t), newKey(t)
				mine := claim(k1, a)
				if mine.Verdict != claimcache.Won {
					t.Fatalf("claim: %v", mine.Verdict)
				}
				claim(k2, a)
				c.Complete(ctx, k2, a, []byte("first"))
				err := c.CompleteMany(ctx, []claimcache.Completion{
					{Key: k1, Digest: a, Response: []byte("mine"), Owned: true, Epoch: mine.Epoch},
					{Key: k2, Digest: a, Response: []byte("second")}, // not owned: the done entry stays
				})
				if err != nil {
					t.Fatal(err)
				}
				for _, w := range []struct {
					k    []byte
					want string
				}{{k1, "mine"}, {k2, "first"}} {
					if r := claim(w.k, a); r.Verdict != claimcache.Done || r.Response != w.want {
						t.Errorf("%s: %v %q, want done %q", w.k, r.Verdict, r.Response, w.want)
					}
				}
			})

			t.Run("an owned completion of another epoch keeps a done entry", func(t *testing.T) {
				k := newKey(t)
				won := claim(k, a)
				if won.Verdict != claimcache.Won {
					t.Fatalf("claim: %v", won.Verdict)
				}
				c.Complete(ctx, k, a, []byte("first"))
				err := c.CompleteMany(ctx, []claimcache.Completion{
					{Key: k, Digest: a, Response: []byte("second"), Owned: true, Epoch: won.Epoch + 1},
				})
				if err != nil {
					t.Fatal(err)
				}
				if r := claim(k, a); r.Response != "first" {
					t.Errorf("got %q, want the first answer: a claim won under another epoch owns nothing now", r.Response)
				}
			})

			t.Run("concurrent claims each get their own verdict", func(t *testing.T) {
				// Enough at once that they share pipelines: every first
				// claim of a key wins, every second one finds it taken.
				const n = 200
				keys := make([][]byte, n)
				for i := range keys {
					keys[i] = newKey(t)
				}
				var wg sync.WaitGroup
				verdicts := make([][2]claimcache.Verdict, n)
				for i := range n {
					for j := range 2 {
						wg.Add(1)
						go func() {
							defer wg.Done()
							r, err := c.Claim(ctx, keys[i], a)
							if err != nil {
								t.Error(err)
							}
							verdicts[i][j] = r.Verdict
						}()
					}
				}
				wg.Wait()
				for i, v := range verdicts {
					won := (v[0] == claimcache.Won) != (v[1] == claimcache.Won)
					busy := v[0] == claimcache.Busy || v[1] == claimcache.Busy
					if !won || !busy {
						t.Errorf("key %d: verdicts %v, want one won and one busy", i, v)
					}
				}
			})

			t.Run("pending and result TTLs expire", func(t *testing.T) {
				// Only that entries are gone once their TTL has passed:
				// a delay can only make them more so.
				short := newCache(t, url, claimcache.Config{PendingTTL: 300 * time.Millisecond, ResultTTL: 600 * time.Millisecond})
				k := newKey(t)
				claimOn(short, k, a)
				be.advance(400 * time.Millisecond)
				if r := claimOn(short, k, b); r.Verdict != claimcache.Won {
					t.Errorf("after the pending TTL: %v, want won", r.Verdict)
				}
				if err := short.Complete(ctx, k, b, []byte("x")); err != nil {
					t.Fatal(err)
				}
				be.advance(700 * time.Millisecond)
				if r := claimOn(short, k, a); r.Verdict != claimcache.Won {
					t.Errorf("after the result TTL: %v, want won", r.Verdict)
				}
			})

			t.Run("wait sees the owner's result, or gives up", func(t *testing.T) {
				if be.name == "miniredis" {
					t.Skip("Wait polls on the wall clock; miniredis TTLs do not tick")
				}
				// A budget the owner's Complete cannot miss, however late
				// its goroutine runs.
				patient := newCache(t, url, claimcache.Config{PendingTTL: time.Minute, ResultTTL: time.Hour, WaitBudget: wait.Timeout})
				k := newKey(t)
				claimOn(patient, k, a)
				completed := make(chan error, 1)
				go func() { completed <- patient.Complete(ctx, k, a, []byte("owner's")) }()
				r, err := patient.Wait(ctx, k, a)
				if err != nil || r.Verdict != claimcache.Done || r.Response != "owner's" {
					t.Errorf("Wait: %v %q %v, want done", r.Verdict, r.Response, err)
				}
				if err := <-completed; err != nil {
					t.Fatal(err)
				}
				k2 := newKey(t)
				claim(k2, a)
				start := time.Now()
				r, err = c.Wait(ctx, k2, a)
				if err != nil || r.Verdict != claimcache.Busy {
					t.Errorf("Wait on a stuck owner: %v %v, want busy", r.Verdict, err)
				}
				// It gives up at its budget (a call later at most), not
				// when the owner's entry expires.
				if d := time.Since(start); d > 30*time.Second {
					t.Errorf("Wait took %v with a 150ms budget and a pending TTL of a minute", d)
				}
			})
		})
	}
}

// A dead Redis fails fast, then the breaker stops calls; a probe after the
// cooldown closes it once Redis is back. The cooldown runs on a fake clock:
// on the wall clock, a call delayed past it would be a probe.
func TestBreaker(t *testing.T) {
	ctx := context.Background()
	mini := miniredis.RunT(t)
	clock := newFakeClock()
	var opened, closed int
	var errs int
	c := newCache(t, "redis://"+mini.Addr(), claimcache.Config{
		BreakerFailures: 3, BreakerCooldown: 100 * time.Millisecond, Now: clock.Now,
		OnError: func(error) { errs++ },
		OnBreaker: func(_ string, open bool) {
			if open {
				opened++
			} else {
				closed++
			}
		},
	})
	k := newKey(t)
	mini.SetError("LOADING simulated failure")
	for i := range 3 {
		if _, err := c.Claim(ctx, k, digest("a")); err == nil || errors.Is(err, claimcache.ErrBreakerOpen) {
			t.Fatalf("call %d: %v, want a Redis error", i, err)
		}
	}
	if _, err := c.Claim(ctx, k, digest("a")); !errors.Is(err, claimcache.ErrBreakerOpen) {
		t.Fatalf("after 3 failures: %v, want ErrBreakerOpen", err)
	}
	if c.State() != "degraded" || opened != 1 || errs != 3 {
		t.Errorf("state %s opened %d errors %d", c.State(), opened, errs)
	}
	clock.Advance(99 * time.Millisecond)
	if _, err := c.Claim(ctx, k, digest("a")); !errors.Is(err, claimcache.ErrBreakerOpen) {
		t.Fatalf("within the cooldown: %v, want still open", err)
	}
	clock.Advance(2 * time.Millisecond)
	if _, err := c.Claim(ctx, k, digest("a")); err == nil || errors.Is(err, claimcache.ErrBreakerOpen) {
		t.Fatalf("probe while still failing: %v, want the Redis error", err)
	}
	if _, err := c.Claim(ctx, k, digest("a")); !errors.Is(err, claimcache.ErrBreakerOpen) {
		t.Fatalf("after a failed probe: %v, want open again", err)
	}
	mini.SetError("")
	clock.Advance(99 * time.Millisecond)
	if _, err := c.Claim(ctx, k, digest("a")); !errors.Is(err, claimcache.ErrBreakerOpen) {
		t.Fatalf("within the cooldown the failed probe began: %v, want still open", err)
	}
	clock.Advance(2 * time.Millisecond)
	if r, err := c.Claim(ctx, k, digest("a")); err != nil || r.Verdict != claimcache.Won {
		t.Fatalf("probe after recovery: %v %v", r.Verdict, err)
	}
	if c.State() != "ok" || closed != 1 {
		t.Errorf("state %s closed %d", c.State(), closed)
	}
}

// Against a server that is gone, a call costs one connection attempt (a
// refused connect), not go-redis's default retries, which take seconds:
// counted, not timed.
func TestDeadRedisFailsFast(t *testing.T) {
	srv, err := claimcachetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	url := srv.URL()
	srv.Stop()
	c, dials := newCountingCache(t, url, claimcache.Config{BreakerFailures: 1000})
	const calls = 10
	start := time.Now()
	for range calls {
		if _, err := c.Claim(context.Background(), newKey(t), digest("a")); err == nil {
			t.Fatal("claim against a dead server succeeded")
		}
	}
	took := time.Since(start)
	if n := dials.Load(); n == 0 || n > calls {
		t.Errorf("%d calls against a dead server attempted %d connections, want at most one each", calls, n)
	}
	t.Logf("%d connection attempts for %d calls, %v a call", dials.Load(), calls, took/calls)
}

// newCountingCache is newCache whose client counts its connection
// attempts.
func newCountingCache(t *testing.T, url string, cfg claimcache.Config) (*claimcache.Cache, *atomic.Int64) {
	t.Helper()
	client, err := claimcache.NewClient(url, callTimeout, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	dials := &dialCounter{}
	client.AddHook(dials)
	cfg.Client = client
	c, err := claimcache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, &dials.n
}

// dialCounter is a go-redis hook that counts connection attempts.
type dialCounter struct{ n atomic.Int64 }

func (d *dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.n.Add(1)
		return next(ctx, network, addr)
	}
}

func (d *dialCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (d *dialCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// With LocalEntries, a done entry answers its duplicates from the process:
// even with Redis flushed, the answer is the committed first one; another
// digest is a mismatch; after LocalTTL, Redis is asked again. The TTL runs
// on a fake clock: on the wall clock, a call delayed past it would go to
// Redis.
func TestLocalDoneEntries(t *testing.T) {
	ctx := context.Background()
	mini := miniredis.RunT(t)
	clock := newFakeClock()
	c := newCache(t, "redis://"+mini.Addr(), claimcache.Config{LocalEntries: 128, LocalTTL: 100 * time.Millisecond, Now: clock.Now})
	k := newKey(t)
	if r, _ := c.Claim(ctx, k, digest("a")); r.Verdict != claimcache.Won {
		t.Fatalf("first: %v", r.Verdict)
	}
	if err := c.Complete(ctx, k, digest("a"), []byte("answer")); err != nil {
		t.Fatal(err)
	}
	mini.FlushAll()
	mini.SetError("LOADING down")
	clock.Advance(100 * time.Millisecond) // the last instant of the TTL
	if r, err := c.Claim(ctx, k, digest("a")); err != nil || r.Verdict != claimcache.Done || r.Response != "answer" {
		t.Errorf("from the local table with Redis down: %v %q %v", r.Verdict, r.Response, err)
	}
	if r, err := c.Claim(ctx, k, digest("b")); err != nil || r.Verdict != claimcache.Mismatch {
		t.Errorf("other digest: %v %v, want mismatch", r.Verdict, err)
	}
	mini.SetError("")
	clock.Advance(time.Millisecond)
	if r, err := c.Claim(ctx, k, digest("a")); err != nil || r.Verdict != claimcache.Won {
		t.Errorf("after LocalTTL (Redis flushed): %v %v, want won from Redis", r.Verdict, err)
	}
	// After LocalTTL, a Done answer from Redis refreshes the expired local
	// entry: a hot key does not go to Redis on every request from then on.
	if err := c.Complete(ctx, k, digest("a"), []byte("answer")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(101 * time.Millisecond)
	if r, err := c.Claim(ctx, k, digest("a")); err != nil || r.Verdict != claimcache.Done {
		t.Fatalf("after LocalTTL: %v %v, want done from Redis", r.Verdict, err)
	}
	mini.SetError("LOADING down")
	if r, err := c.Claim(ctx, k, digest("a")); err != nil || r.Verdict != claimcache.Done || r.Response != "answer" {
		t.Errorf("expired entry not refreshed from Redis's answer: %v %q %v", r.Verdict, r.Response, err)
	}
	mini.SetError("")
}

// Bounded: many keys evict the oldest. Each shard of the local table is a
// FIFO of its own, so after many keys it holds exactly the newest keys of
// each shard, up to its capacity, and no more than LocalEntries in all.
func TestLocalDoneEntriesBounded(t *testing.T) {
	ctx := context.Background()
	mini := miniredis.RunT(t)
	const entries = 128
	c := newCache(t, "redis://"+mini.Addr(), claimcache.Config{LocalEntries: entries, LocalTTL: time.Minute})
	keys := make([][]byte, 1000)
	byShard := map[int][][]byte{}
	capacity := 0
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%s-%d", newKey(t), i)
		if r, err := c.Claim(ctx, keys[i], digest("a")); err != nil || r.Verdict != claimcache.Won {
			t.Fatalf("claim %s: %v %v", keys[i], r.Verdict, err)
		}
		if err := c.Complete(ctx, keys[i], digest("a"), []byte("x")); err != nil {
			t.Fatal(err)
		}
		var sh int
		sh, capacity = claimcache.LocalShard(c, keys[i])
		byShard[sh] = append(byShard[sh], keys[i])
	}
	want := map[string]bool{}
	for _, ks := range byShard {
		for _, k := range ks[max(len(ks)-capacity, 0):] {
			want[string(k)] = true
		}
	}
	n, slots := claimcache.LocalLen(c)
	if n > entries || n != len(want) || slots != n {
		t.Errorf("local table holds %d entries in %d slots, want %d (at most %d), one slot each", n, slots, len(want), entries)
	}
	// With Redis failing, only the local table answers.
	mini.SetError("LOADING down")
	var wrong int
	for i, k := range keys {
		r, err := c.Claim(ctx, k, digest("a"))
		if held := err == nil && r.Verdict == claimcache.Done; held != want[string(k)] {
			if wrong++; wrong <= 5 {
				t.Errorf("key %d of %d: held %v, want %v (%v %v)", i, len(keys), held, want[string(k)], r.Verdict, err)
			}
		}
	}
	if wrong > 0 {
		t.Errorf("%d keys held or evicted wrongly", wrong)
	}
}
