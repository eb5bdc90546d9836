package claimcache_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// epochSource is a database's epoch as a test controls it.
type epochSource struct {
	mu    sync.Mutex
	epoch string
	err   error
	seen  []string // what OnEpoch reported
	errs  []error  // what OnError reported
}

func (s *epochSource) set(epoch string, err error) {
	s.mu.Lock()
	s.epoch, s.err = epoch, err
	s.mu.Unlock()
}

func (s *epochSource) read(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch, s.err
}

func (s *epochSource) config(cfg claimcache.Config) claimcache.Config {
	cfg.Epoch = s.read
	cfg.OnEpoch = func(e string) { s.mu.Lock(); s.seen = append(s.seen, e); s.mu.Unlock() }
	cfg.OnError = func(err error) { s.mu.Lock(); s.errs = append(s.errs, err); s.mu.Unlock() }
	return cfg
}

func (s *epochSource) epochErrors() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, err := range s.errs {
		if errors.Is(err, claimcache.ErrEpoch) {
			n++
		}
	}
	return n
}

// errors is what OnError reported, for a failure message.
func (s *epochSource) errors() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprint(s.errs)
}

// refused reports whether OnError reported the epoch with a brace.
func (s *epochSource) refused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, err := range s.errs {
		if errors.Is(err, claimcache.ErrEpoch) && strings.Contains(err.Error(), "braces") {
			return true
		}
	}
	return false
}

// eventually waits until cond holds (the epoch is read about once a
// second, later on a loaded machine), reporting got() if it never does.
func eventually(t *testing.T, what string, cond func() bool, got func() string) time.Duration {
	t.Helper()
	return wait.For(t, what, func() (bool, string) { return cond(), got() })
}

func startRedis(t *testing.T, extra ...string) *claimcachetest.Server {
	t.Helper()
	srv, err := claimcachetest.Start(extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv
}

// The epoch is in every key, before the hash tag: a key's cluster slot is
// its biz_key's, whatever the epoch (checked by a cluster-enabled
// redis-server: miniredis fakes CLUSTER KEYSLOT).
func TestEpochKeyLayout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := startRedis(t)
	src := &epochSource{epoch: "7714999904600278144-1-0"}
	c := newCache(t, srv.URL(), src.config(claimcache.Config{}))
	plain := newCache(t, srv.URL(), claimcache.Config{})
	key := []byte("acme:T-1:PAY_SUCCESS")
	if err := c.Complete(ctx, key, digest("a"), []byte("with epoch")); err != nil {
		t.Fatal(err)
	}
	if err := plain.Complete(ctx, key, digest("a"), []byte("without")); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"ne:7714999904600278144-1-0:{acme:T-1:PAY_SUCCESS}": true, "ne:{acme:T-1:PAY_SUCCESS}": true}
	if len(keys) != 2 || !want[keys[0]] || !want[keys[1]] {
		t.Fatalf("keys %q, want %v", keys, want)
	}
	if c.Epoch() != src.epoch || plain.Epoch() != "" {
		t.Errorf("Epoch() = %q and %q", c.Epoch(), plain.Epoch())
	}

	cluster := startRedis(t, "--cluster-enabled", "yes")
	crdb := redis.NewClient(&redis.Options{Addr: cluster.Addr()})
	defer crdb.Close()
	slot := func(k string) int64 {
		t.Helper()
		s, err := crdb.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	slots := map[int64]bool{}
	for i := range 20 {
		biz := fmt.Sprintf("acme:T-%d:PAY_SUCCESS", i)
		s := slot(biz)
		for _, e := range []string{"7714999904600278144-1-0", "7714999904600278144-2-1796288394452"} {
			if got := slot("ne:" + e + ":{" + biz + "}"); got != s {
				t.Fatalf("epoch %s moved %s from slot %d to %d", e, biz, s, got)
			}
		}
		slots[s] = true
	}
	if len(slots) < 15 {
		t.Errorf("20 biz_keys share %d slots: the keys do not spread", len(slots))
	}
}

// When the epoch changes, the per-node table is emptied and new keys carry
// the new epoch: an entry of the old one answers nothing, from the table or
// from Redis, and stays in Redis until its TTL.
func TestEpochChangeForgetsEntries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := startRedis(t)
	src := &epochSource{epoch: "1-1-0"}
	// The new claim must outlive the checks below on a loaded machine (the
	// default pending TTL is 200 ms).
	c := newCache(t, srv.URL(), src.config(claimcache.Config{LocalEntries: 1024, PendingTTL: time.Minute}))
	key, d := []byte("acme:T-2:PAY_SUCCESS"), digest("a")
	if err := c.Complete(ctx, key, d, []byte("answer of 1-1-0")); err != nil {
		t.Fatal(err)
	}
	if n, _ := claimcache.LocalLen(c); n != 1 {
		t.Fatalf("the local table holds %d entries, want the completed one", n)
	}
	if r, err := c.Claim(ctx, key, d); err != nil || r.Verdict != claimcache.Done {
		t.Fatalf("before the change: %v %v, want done", r.Verdict, err)
	}

	src.set("1-2-0", nil) // promoted: a new timeline
	took := eventually(t, "the new epoch", func() bool { return c.Epoch() == "1-2-0" }, c.Epoch)
	t.Logf("switched %v after the change", took.Round(time.Millisecond))
	if n, _ := claimcache.LocalLen(c); n != 0 {
		t.Errorf("the local table still holds %d entries of the old epoch", n)
	}
	r, err := c.Claim(ctx, key, d)
	if err != nil || r.Verdict != claimcache.Won {
		t.Fatalf("after the change: %v %v, want won (Postgres decides again)", r.Verdict, err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	if n, _ := rdb.Exists(ctx, "ne:1-1-0:{acme:T-2:PAY_SUCCESS}", "ne:1-2-0:{acme:T-2:PAY_SUCCESS}").Result(); n != 2 {
		t.Errorf("%d of the old entry and the new claim exist, want both", n)
	}
	if err := c.Complete(ctx, key, d, []byte("answer of 1-2-0")); err != nil {
		t.Fatal(err)
	}
	if r, _ := c.Claim(ctx, key, d); r.Verdict != claimcache.Done || r.Response != "answer of 1-2-0" {
		t.Errorf("under the new epoch: %v %q", r.Verdict, r.Response)
	}
	src.mu.Lock()
	seen := fmt.Sprint(src.seen)
	src.mu.Unlock()
	if seen != "[1-1-0 1-2-0]" {
		t.Errorf("OnEpoch saw %s", seen)
	}
}

// A failed read keeps the last epoch (and is reported); a cache that never
// read one answers nothing until it does; an epoch with a brace is refused.
func TestEpochReadFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := startRedis(t)
	key, d := []byte("acme:T-3:PAY_SUCCESS"), digest("a")

	src := &epochSource{epoch: "1-1-0"}
	c := newCache(t, srv.URL(), src.config(claimcache.Config{LocalEntries: 1024}))
	if err := c.Complete(ctx, key, d, []byte("kept")); err != nil {
		t.Fatal(err)
	}
	src.set("", errors.New("postgres down"))
	eventually(t, "a reported read failure", func() bool { return src.epochErrors() > 0 }, src.errors)
	src.set("1-{2}-0", nil)
	eventually(t, "a refused epoch", func() bool { return src.refused() }, src.errors)
	if c.Epoch() != "1-1-0" {
		t.Fatalf("epoch %q after failed reads, want the last good one", c.Epoch())
	}
	if r, err := c.Claim(ctx, key, d); err != nil || r.Verdict != claimcache.Done || r.Response != "kept" {
		t.Fatalf("after failed reads: %v %q %v, want the entry of the kept epoch", r.Verdict, r.Response, err)
	}

	down := &epochSource{err: errors.New("postgres down")}
	cold := newCache(t, srv.URL(), down.config(claimcache.Config{LocalEntries: 1024}))
	// New reads once before it returns; the background reads may have
	// failed again since.
	if down.epochErrors() == 0 {
		t.Errorf("the failed first read was not reported: %s", down.errors())
	}
	for name, err := range map[string]error{
		"claim":    func() error { _, err := cold.Claim(ctx, key, d); return err }(),
		"wait":     func() error { _, err := cold.Wait(ctx, key, d); return err }(),
		"complete": cold.Complete(ctx, key, d, []byte("x")),
		"abort":    cold.Abort(ctx, key, d, claimcache.Token{}),
	} {
		if !errors.Is(err, claimcache.ErrNoEpoch) {
			t.Errorf("%s without an epoch: %v, want ErrNoEpoch", name, err)
		}
	}
	if s := cold.State(); s != "degraded" {
		t.Errorf("state without an epoch: %s", s)
	}
	down.set("1-1-0", nil)
	eventually(t, "the first epoch", func() bool { return cold.Epoch() == "1-1-0" }, cold.Epoch)
	if r, err := cold.Claim(ctx, key, d); err != nil || r.Verdict != claimcache.Done || r.Response != "kept" {
		t.Errorf("once the epoch is known: %v %q %v", r.Verdict, r.Response, err)
	}
}
