package claimcache_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache"
)

// database is what the cache learns of a database through its Config: an
// epoch ("1-1-<counter>") and a WAL position that grows with each write,
// which a restore takes back. The end-to-end test on Postgres is edge's
// TestRestoredBaseBackupIsNotAnsweredFromTheCache.
type database struct {
	mu       sync.Mutex
	timeline int
	counter  int64
	pos      uint64
	bumps    int
	bumpErr  error
}

func (db *database) epoch(context.Context) (string, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	return fmt.Sprintf("1-%d-%d", db.timeline, db.counter), nil
}

func (db *database) position(context.Context) (uint64, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.pos, nil
}

// write is a commit: the position moves on.
func (db *database) write() {
	db.mu.Lock()
	db.pos += 100
	db.mu.Unlock()
}

// bumpFrom moves the counter on if epoch is still the database's, as
// durable.Store.BumpCacheEpochFrom does.
func (db *database) bumpFrom(_ context.Context, epoch string, _, _ uint64) (string, error) {
	db.mu.Lock()
	if db.bumpErr != nil {
		db.mu.Unlock()
		return "", db.bumpErr
	}
	if epoch == fmt.Sprintf("1-%d-%d", db.timeline, db.counter) {
		db.counter++
		db.bumps++
	}
	db.mu.Unlock()
	return db.epoch(context.Background())
}

func (db *database) config(cfg claimcache.Config) claimcache.Config {
	cfg.Epoch, cfg.Position, cfg.OnBehind = db.epoch, db.position, db.bumpFrom
	return cfg
}

// refresh reads the epoch now, as the background reads do each second.
func refresh(t *testing.T, cs ...*claimcache.Cache) {
	t.Helper()
	for _, c := range cs {
		if err := c.RefreshEpoch(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// A done entry is written only once the watermark covers what the database
// had written when CompleteMany was called; a position that cannot be read
// writes no entry (the next duplicate goes to Postgres).
func TestWatermarkRaisedBeforeEntries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := startRedis(t)
	db := &database{timeline: 1, pos: 0x1234}
	failing := errors.New("position unreadable")
	var fail bool
	var mu sync.Mutex
	cfg := db.config(claimcache.Config{})
	cfg.Position = func(ctx context.Context) (uint64, error) {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return 0, failing
		}
		return db.position(ctx)
	}
	c := newCache(t, srv.URL(), cfg)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()

	if err := c.Complete(ctx, []byte("k1"), digest("a"), []byte("answer")); err != nil {
		t.Fatal(err)
	}
	if got, err := rdb.Get(ctx, "ne:1-1-0:watermark").Result(); err != nil || got != "0000000000001234" {
		t.Errorf("watermark %q (%v), want the position 0000000000001234", got, err)
	}
	if ttl := rdb.PTTL(ctx, "ne:1-1-0:watermark").Val(); ttl <= 0 {
		t.Errorf("watermark TTL %v, want the entries' own", ttl)
	}
	mu.Lock()
	fail = true
	mu.Unlock()
	if err := c.Complete(ctx, []byte("k2"), digest("a"), []byte("answer")); !errors.Is(err, failing) {
		t.Errorf("Complete with the position unreadable: %v, want its error", err)
	}
	if n := rdb.Exists(ctx, "ne:1-1-0:{k2}").Val(); n != 0 {
		t.Error("an entry was written with the watermark not raised")
	}
}

// A database restored behind what the cache holds (same epoch: a snapshot
// or a base backup) gets one new epoch, however many nodes find it at
// once: no entry written before answers a duplicate, and its watermark
// starts from the database's position.
func TestRestoredDatabaseGetsANewEpoch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := startRedis(t)
	db := &database{timeline: 1, pos: 1000}
	a := newCache(t, srv.URL(), db.config(claimcache.Config{LocalEntries: 100}))
	b := newCache(t, srv.URL(), db.config(claimcache.Config{}))
	key := []byte("acme:T-after-backup:PAY_SUCCESS")
	db.write()
	if err := a.Complete(ctx, key, digest("a"), []byte("applied")); err != nil {
		t.Fatal(err)
	}
	if r, err := b.Claim(ctx, key, digest("a")); err != nil || r.Verdict != claimcache.Done {
		t.Fatalf("before the restore: %+v, %v, want Done", r, err)
	}

	db.mu.Lock()
	db.pos = 1000 // the backup, taken before the write
	db.mu.Unlock()
	refresh(t, a, b)
	if db.bumps != 1 || a.Epoch() != "1-1-1" || b.Epoch() != "1-1-1" {
		t.Fatalf("after the restore: %d bumps, epochs %q and %q; want one bump, both on 1-1-1", db.bumps, a.Epoch(), b.Epoch())
	}
	if r, err := a.Claim(ctx, key, digest("a")); err != nil || r.Verdict != claimcache.Won {
		t.Errorf("a payment the restored database lost: %+v, %v; want Won (Postgres decides)", r, err)
	}
	if r, err := b.Claim(ctx, key, digest("a")); err != nil || r.Verdict != claimcache.Busy {
		t.Errorf("the same on the other node: %+v, %v; want Busy (the first node's claim)", r, err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	if got := rdb.Get(ctx, "ne:1-1-1:watermark").Val(); got != fmt.Sprintf("%016x", 1000) {
		t.Errorf("the new epoch's watermark %q, want the database's position", got)
	}
	refresh(t, a, b)
	if db.bumps != 1 {
		t.Errorf("%d bumps after another read, want 1", db.bumps)
	}
}

// What is not a restore never moves the epoch: a restart (the position
// goes on from where it was), a promotion (a new timeline, with no
// watermark yet), Redis flushed or replaced, several nodes starting at
// once, and a slow position read overtaken by another node's raise.
func TestWatermarkNoFalseAlarms(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	db := &database{timeline: 1, pos: 5000}
	// a's position reads may be held (a slow read); the other nodes' never.
	var hold atomic.Pointer[func()]
	acfg := db.config(claimcache.Config{})
	acfg.Position = func(ctx context.Context) (uint64, error) {
		pos, err := db.position(ctx)
		if h := hold.Swap(nil); h != nil {
			(*h)()
		}
		return pos, err
	}
	a := newCache(t, srv.URL(), acfg)
	write := func(c *claimcache.Cache, k string) error {
		db.write()
		return c.Complete(ctx, []byte(k), digest("a"), []byte("applied"))
	}
	complete := func(c *claimcache.Cache, k string) {
		t.Helper()
		if err := write(c, k); err != nil {
			t.Fatal(err)
		}
	}
	complete(a, "k1")

	// A restart: the same position (nothing written since) or later.
	refresh(t, a)
	complete(a, "k2")
	refresh(t, a)

	// Several nodes starting at once.
	nodes := make([]*claimcache.Cache, 4)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			client, err := claimcache.NewClient(srv.URL(), callTimeout, 0)
			if err != nil {
				t.Error(err)
				return
			}
			t.Cleanup(func() { client.Close() })
			cfg := db.config(claimcache.Config{Client: client})
			c, err := claimcache.New(cfg)
			if err != nil {
				t.Error(err)
				return
			}
			t.Cleanup(c.Close)
			nodes[i] = c
		})
	}
	wg.Wait()

	// A slow read: a's position is taken, then another node raises the
	// watermark from a later one before a compares. The watermark is read
	// before the position, so a compares its position with the older one.
	b := nodes[0]
	overtaken := make(chan error, 1)
	h := func() { overtaken <- write(b, "k3") }
	hold.Store(&h)
	refresh(t, a)
	if err := <-overtaken; err != nil { // a's check (this one or a background one) was held
		t.Fatal(err)
	}

	// A promotion: a new timeline, no watermark under it yet.
	db.mu.Lock()
	db.timeline = 2
	db.mu.Unlock()
	refresh(t, a)
	complete(a, "k4")

	// Redis flushed, entries and watermarks with it.
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	refresh(t, append(nodes, a)...)
	if db.bumps != 0 {
		t.Errorf("%d bumps where nothing was restored, want 0", db.bumps)
	}
	if a.Epoch() != "1-2-0" {
		t.Errorf("epoch %q, want the promotion's 1-2-0", a.Epoch())
	}
}

// Until the new epoch is had, a node that found the database behind
// answers nothing from the cache (it may hold what the database lost), and
// says why.
func TestBehindWithoutANewEpochAnswersNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := startRedis(t)
	db := &database{timeline: 1, pos: 100}
	var errs []error
	var mu sync.Mutex
	cfg := db.config(claimcache.Config{OnError: func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }})
	c := newCache(t, srv.URL(), cfg)
	key := []byte("k")
	db.write()
	if err := c.Complete(ctx, key, digest("a"), []byte("applied")); err != nil {
		t.Fatal(err)
	}
	db.mu.Lock()
	db.pos, db.bumpErr = 100, errors.New("the counter could not be bumped")
	db.mu.Unlock()
	if err := c.RefreshEpoch(ctx); !errors.Is(err, claimcache.ErrBehind) {
		t.Fatalf("RefreshEpoch: %v, want ErrBehind", err)
	}
	if _, err := c.Claim(ctx, key, digest("a")); !errors.Is(err, claimcache.ErrNoEpoch) {
		t.Errorf("Claim while behind: %v, want ErrNoEpoch", err)
	}
	mu.Lock()
	reported := len(errs) > 0 && errors.Is(errs[len(errs)-1], claimcache.ErrBehind) &&
		strings.Contains(errs[len(errs)-1].Error(), strconv.FormatUint(100, 16))
	mu.Unlock()
	if !reported {
		t.Errorf("OnError got %v, want ErrBehind with the position", errs)
	}
	db.mu.Lock()
	db.bumpErr = nil
	db.mu.Unlock()
	refresh(t, c)
	if r, err := c.Claim(ctx, key, digest("a")); err != nil || r.Verdict != claimcache.Won {
		t.Errorf("after the bump: %+v, %v, want Won", r, err)
	}
}

// An answer that carries its position (the decision's own) is cached with
// no read of the database: the watermark takes the highest of a batch's,
// and a database gone right after its commit does not keep it out.
func TestWatermarkFromTheAnswersPositions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := startRedis(t)
	db := &database{timeline: 1, pos: 1}
	var reads atomic.Int32
	cfg := db.config(claimcache.Config{})
	cfg.Position = func(ctx context.Context) (uint64, error) { reads.Add(1); return db.position(ctx) }
	c := newCache(t, srv.URL(), cfg)
	reads.Store(0) // the first epoch read's
	if err := c.CompleteMany(ctx, []claimcache.Completion{
		{Key: []byte("k1"), Digest: digest("a"), Response: []byte("1"), Position: 0x700},
		{Key: []byte("k2"), Digest: digest("a"), Response: []byte("2"), Position: 0x900},
	}); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	if got := rdb.Get(ctx, "ne:1-1-0:watermark").Val(); got != fmt.Sprintf("%016x", 0x900) || reads.Load() != 0 {
		t.Errorf("watermark %q after %d position reads; want the batch's highest, 0x900, and no read", got, reads.Load())
	}
}
