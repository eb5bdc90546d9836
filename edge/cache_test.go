package edge_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge"
)

// seedPaid seeds n PENDING_PAY orders and delivers each one's payment.
func (b *bundle) seedPaid(t *testing.T, prefix string, n int) []string {
	t.Helper()
	orders := make([]pgtemp.Order, n)
	payloads := make([]string, n)
	for i := range n {
		no := fmt.Sprintf("%s-%04d", prefix, i)
		orders[i] = pgtemp.Order{No: no, Status: "PENDING_PAY", Amount: 1999, Currency: "CNY"}
		payloads[i] = body("T"+no, "PAY_SUCCESS", no, 1999)
	}
	if err := pgtemp.SeedOrders(context.Background(), b.dbURL, orders); err != nil {
		t.Fatal(err)
	}
	for _, p := range payloads {
		if got := b.post(t, p); got.status != 200 || got.replayed {
			t.Fatalf("first delivery: %+v", got)
		}
	}
	if b.redis != nil {
		b.waitDone(t, n)
	}
	return payloads
}

// doneEntries counts the done entries ("D" values) of the cache's keys on
// one Redis server.
func doneEntries(ctx context.Context, c *redis.Client) (int, error) {
	done := 0
	iter := c.Scan(ctx, 0, "ne:*", 1000).Iterator()
	for iter.Next(ctx) {
		if v, err := c.Get(ctx, iter.Val()).Result(); err == nil && strings.HasPrefix(v, "D") {
			done++
		}
	}
	return done, iter.Err()
}

// waitDone waits until Redis holds at least n done entries: the cache's
// Complete runs after the answer, so a duplicate sent at once may still
// find the pending entry.
func (b *bundle) waitDone(t *testing.T, n int) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: b.redis.Addr()})
	defer c.Close()
	ctx := context.Background()
	wait.For(t, fmt.Sprintf("%d done entries in Redis after the answers", n), func() (bool, string) {
		done, err := doneEntries(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		return done >= n, fmt.Sprintf("%d done", done)
	})
}

// storm sends every payload copies times from workers goroutines, each
// copy with its own webhook-id, and returns the answers per payload.
func (b *bundle) storm(t *testing.T, payloads []string, copies, workers int) [][]reply {
	t.Helper()
	out := make([][]reply, len(payloads))
	var mu sync.Mutex
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				r := b.post(t, payloads[i])
				mu.Lock()
				out[i] = append(out[i], r)
				mu.Unlock()
			}
		}()
	}
	for i := range payloads {
		for range copies {
			jobs <- i
		}
	}
	close(jobs)
	wg.Wait()
	return out
}

// Point 2: hot duplicates are answered by Redis; Postgres sees no query.
func TestHotDuplicatesNeverReachPostgres(t *testing.T) {
	b := setup(t, options{cache: true, cacheTimeout: 2 * time.Second})
	payloads := b.seedPaid(t, "H", 100)
	firstBody := `{"code":"SUCCESS","outcome":"applied","status":"PAID"}`
	before := b.queries.n.Load()
	answers := b.storm(t, payloads, 100, 32)
	if q := b.queries.n.Load() - before; q != 0 {
		t.Errorf("Postgres saw %d claim queries for 10,000 hot duplicates, want 0", q)
	}
	for i, rs := range answers {
		for _, r := range rs {
			if r.status != 200 || !r.replayed || r.body != firstBody || r.ctype != "application/json" {
				t.Fatalf("key %d: %+v", i, r)
			}
		}
	}
	if got := b.metric(t, `notifyedge_requests_total{channel="acme",outcome="replayed_cache"}`); got != 10000 {
		t.Errorf("replayed_cache = %v, want 10000", got)
	}
	if got := b.metric(t, `notifyedge_requests_total{channel="acme",outcome="replayed_db"}`); got != 0 {
		t.Errorf("replayed_db = %v, want 0", got)
	}
}

// Point 3: Redis killed mid-load. Every answer stays correct and nothing is
// 5xx; the breaker opens; Redis restarted empty is refilled from Postgres.
func TestRedisKilledMidLoad(t *testing.T) {
	b := setup(t, options{cache: true})
	const n = 200
	orders := make([]pgtemp.Order, n)
	payloads := make([]string, n)
	for i := range n {
		no := fmt.Sprintf("K-%04d", i)
		orders[i] = pgtemp.Order{No: no, Status: "PENDING_PAY", Amount: 1999, Currency: "CNY"}
		payloads[i] = body("T"+no, "PAY_SUCCESS", no, 1999)
	}
	if err := pgtemp.SeedOrders(context.Background(), b.dbURL, orders); err != nil {
		t.Fatal(err)
	}
	var sent atomic.Int64
	killed := make(chan struct{})
	go func() {
		for sent.Load() < 1500 {
			time.Sleep(time.Millisecond)
		}
		b.redis.Kill()
		close(killed)
	}()
	// 200 keys x 15 copies, interleaved: first deliveries and duplicates
	// land before, during and after the kill.
	var mu sync.Mutex
	applied := make([]int, n)
	var bad []string
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				r := b.post(t, payloads[i])
				sent.Add(1)
				mu.Lock()
				switch {
				case r.status != 200 || r.body != `{"code":"SUCCESS","outcome":"applied","status":"PAID"}`:
					bad = append(bad, fmt.Sprintf("%d %s", r.status, r.body))
				case !r.replayed:
					applied[i]++
				}
				mu.Unlock()
			}
		}()
	}
	for c := range 15 {
		for i := range n {
			jobs <- (i + c*7) % n
		}
	}
	close(jobs)
	wg.Wait()
	<-killed
	if len(bad) > 0 {
		t.Fatalf("%d wrong answers, first: %s", len(bad), bad[0])
	}
	for i, a := range applied {
		if a != 1 {
			t.Errorf("key %d applied %d times", i, a)
		}
	}
	if got := b.metric(t, `notifyedge_cache_errors_total`); got == 0 {
		t.Error("no cache errors counted: was Redis really killed mid-load?")
	}
	if got := b.metric(t, `notifyedge_cache_breaker_open{node=""}`); got != 1 {
		t.Errorf("breaker_open = %v, want 1 while Redis is down", got)
	}
	wait.For(t, "readyz 200 with redis degraded (its probes run every 500 ms)", func() (bool, string) {
		code, ready := b.admin(t, "GET", "/readyz", "", "")
		return code == 200 && ready["redis"] == "degraded", fmt.Sprint(code, ready)
	})
	b.invariants(t, n)

	// Back, empty: the first duplicate per key replays from Postgres and
	// refills the cache; the next one is answered by Redis.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.redis.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The breaker closes on the first request after its cooldown: send
	// one key the rounds below do not use until it has.
	wait.For(t, "the breaker closed after Redis came back", func() (bool, string) {
		if b.metric(t, `notifyedge_cache_breaker_open{node=""}`) == 0 {
			return true, ""
		}
		b.post(t, payloads[n-1])
		return false, "breaker open"
	})
	replays := func() (db, cache float64) {
		return b.metric(t, `notifyedge_requests_total{channel="acme",outcome="replayed_db"}`),
			b.metric(t, `notifyedge_requests_total{channel="acme",outcome="replayed_cache"}`)
	}
	const refilled = 20
	var fromDB, fromCache [3]float64
	for round := range 3 {
		db0, cache0 := replays()
		for i := range refilled {
			r := b.post(t, payloads[i])
			if r.status != 200 || !r.replayed {
				t.Fatalf("after restart, round %d: %+v", round, r)
			}
		}
		db1, cache1 := replays()
		fromDB[round], fromCache[round] = db1-db0, cache1-cache0
	}
	// Redis came back empty: each key's first duplicate must be answered by
	// Postgres (nothing else holds it), and by the last round the cache
	// must have been refilled and answer every one of them.
	if fromDB[0] != refilled {
		t.Errorf("first round after the restart: %v of %d replayed from Postgres, want all", fromDB[0], refilled)
	}
	if fromCache[2] != refilled {
		t.Errorf("third round after the restart: %v of %d replayed from the cache, want all (refilled)", fromCache[2], refilled)
	}
	if b.metric(t, `notifyedge_cache_breaker_open{node=""}`) != 0 {
		t.Error("breaker still open after Redis came back")
	}
	keys := b.redisKeys(t)
	if keys < refilled {
		t.Errorf("cache holds %d keys after the restart, want the %d replayed ones refilled", keys, refilled)
	}
	t.Logf("after the restart, per round: from Postgres %v, from Redis %v", fromDB, fromCache)
	b.invariants(t, n)
}

// redisKeys counts the keys in the test's own redis-server.
func (b *bundle) redisKeys(t *testing.T) int {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: b.redis.Addr()})
	defer c.Close()
	n, err := c.DBSize(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// invariants checks by SQL the shared money invariants, and that each of
// the test's orders was paid once: one outbox row and one DONE claim each.
func (b *bundle) invariants(t *testing.T, orders int) {
	t.Helper()
	if err := durabletest.Invariants(context.Background(), b.db, "", nil); err != nil {
		t.Error(err)
	}
	durabletest.StormPaidOnce(t, b.db, orders)
}

// Point 4: the owner's pending entry expires while its transaction is
// still waiting on a row lock; the second request goes to Postgres, waits
// on the unique index, and replays.
func TestPendingExpiresWhileOwnerIsSlow(t *testing.T) {
	b := setup(t, options{cache: true, pendingTTL: 100 * time.Millisecond})
	b.order(t, "O-slow", durable.PendingPay, 1999)
	release := b.lockOrder(t, "O-slow")
	payload := body("T-slow", "PAY_SUCCESS", "O-slow", 1999)
	first := b.postAsync(t, payload)
	durabletest.WaitLockWaiters(t, b.db, 1, "%")
	wait.For(t, "the owner's pending entry expired (100 ms TTL)", func() (bool, string) {
		n := b.redisKeys(t)
		return n == 0, fmt.Sprintf("%d keys", n)
	})
	second := b.postAsync(t, payload)
	durabletest.WaitLockWaiters(t, b.db, 2, "%") // the second waits on the first's claim
	release()
	r1, r2 := <-first, <-second
	if r1.status != 200 || r2.status != 200 || r1.body != r2.body || r1.replayed == r2.replayed {
		t.Fatalf("answers %+v and %+v: want one applied and one identical replay", r1, r2)
	}
	if got := b.metric(t, `notifyedge_requests_total{channel="acme",outcome="replayed_db"}`); got != 1 {
		t.Errorf("replayed_db = %v, want 1 (the second went to Postgres)", got)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox`); n != 1 {
		t.Errorf("outbox rows %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM notify_claim`); n != 1 {
		t.Errorf("claims %d, want 1", n)
	}
	if r3 := b.post(t, payload); !r3.replayed || r3.body != r1.body {
		t.Errorf("third: %+v", r3)
	}
}

// noComplete is the cache of a process that dies between its commit and
// its Complete: the pending entry stays until its TTL.
type noComplete struct{ edge.Cache }

func (noComplete) CompleteMany(context.Context, []claimcache.Completion) error { return nil }

// Point 5: the process stops between commit and Complete. The next
// duplicate replays from Postgres; the cache never answers SUCCESS for what
// is not committed.
func TestStopBetweenCommitAndComplete(t *testing.T) {
	b := setup(t, options{cache: true, pendingTTL: 2 * time.Second,
		wrapCache: func(c edge.Cache) edge.Cache { return noComplete{c} }})
	b.order(t, "O-c", durable.PendingPay, 1999)
	payload := body("T-c", "PAY_SUCCESS", "O-c", 1999)
	first := b.post(t, payload)
	if first.status != 200 || first.replayed {
		t.Fatalf("first: %+v", first)
	}
	dup := b.post(t, payload) // finds the dead owner's pending entry, waits, goes to Postgres
	if dup.status != 200 || !dup.replayed || dup.body != first.body {
		t.Fatalf("duplicate: %+v", dup)
	}
	if got := b.metric(t, `notifyedge_requests_total{channel="acme",outcome="replayed_db"}`); got != 1 {
		t.Errorf("replayed_db = %v, want 1", got)
	}
	if got := b.metric(t, `notifyedge_requests_total{channel="acme",outcome="replayed_cache"}`); got != 0 {
		t.Errorf("replayed_cache = %v, want 0: nothing was completed", got)
	}

	// A delivery that fails in Postgres (503) leaves nothing the cache
	// could answer with: its pending entry is aborted.
	b.order(t, "O-c2", durable.PendingPay, 1999)
	release := b.lockOrder(t, "O-c2")
	s := setup(t, options{budget: 200 * time.Millisecond, dbURL: b.dbURL, redis: b.redis})
	p2 := body("T-c2", "PAY_SUCCESS", "O-c2", 1999)
	if r := s.post(t, p2); r.status != 503 {
		t.Fatalf("locked: %+v, want 503", r)
	}
	// The Abort runs after the answer: give it a moment.
	wait.For(t, "only O-c's pending entry left in Redis after the 503", func() (bool, string) {
		n := b.redisKeys(t)
		return n == 1, fmt.Sprintf("%d keys", n)
	})
	// With group commit the 503 came at the deadline, before the cancel
	// reached Postgres: released earlier, the lock would let the delivery
	// commit (correct, a retry replays it, but not the rollback under test).
	durabletest.WaitCancelled(t, b.db)
	release()
	if r := s.post(t, p2); r.status != 200 || r.replayed || !strings.Contains(r.body, `"applied"`) {
		t.Errorf("retry: %+v, want applied", r)
	}
}

// Point 6: two edged instances on one Redis and one Postgres; 64 copies of
// each of 1,000 keys, split across both.
func TestTwoNodesDuplicateStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("64,000 requests")
	}
	a := setup(t, options{cache: true})
	b := setup(t, options{dbURL: a.dbURL, redis: a.redis})
	const keys, copies = 1000, 64
	orders := make([]pgtemp.Order, keys)
	payloads := make([]string, keys)
	for i := range keys {
		no := fmt.Sprintf("S-%04d", i)
		orders[i] = pgtemp.Order{No: no, Status: "PENDING_PAY", Amount: int64(100 + i), Currency: "CNY"}
		payloads[i] = body("T"+no, "PAY_SUCCESS", no, int64(100+i))
	}
	if err := pgtemp.SeedOrders(context.Background(), a.dbURL, orders); err != nil {
		t.Fatal(err)
	}
	type job struct{ key, copy int }
	jobs := make(chan job, 256)
	var mu sync.Mutex
	applied := make([]int, keys)
	bodies := make([]map[string]int, keys)
	var failures []string
	var wg sync.WaitGroup
	nodes := []*bundle{a, b}
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				// A 503 (the budget passed on a loaded machine) is retried, as
				// a channel retries: exactly-once is about what the retry gets.
				r := nodes[(j.copy+w)%2].post(t, payloads[j.key])
				for try := 0; r.status == 503 && try < 20; try++ {
					r = nodes[(j.copy+w)%2].post(t, payloads[j.key])
				}
				mu.Lock()
				if r.status != 200 {
					failures = append(failures, fmt.Sprintf("key %d: %d %s", j.key, r.status, r.body))
				}
				if !r.replayed {
					applied[j.key]++
				}
				if bodies[j.key] == nil {
					bodies[j.key] = map[string]int{}
				}
				bodies[j.key][r.body]++
				mu.Unlock()
			}
		}()
	}
	for k := range keys {
		for c := range copies {
			jobs <- job{k, c}
		}
	}
	close(jobs)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d failures, first: %s", len(failures), failures[0])
	}
	for k := range keys {
		if applied[k] != 1 || len(bodies[k]) != 1 {
			t.Fatalf("key %d: applied %d, distinct answers %v", k, applied[k], bodies[k])
		}
	}
	a.invariants(t, keys)
	// The nodes share one Redis: each must answer duplicates of keys whose
	// first delivery the other one applied from the cache. Copies of a key
	// go to both nodes, so a node that answered a large share of all its
	// duplicates from the cache answered the other's keys too.
	dups := float64(keys * (copies - 1))
	var cached float64
	for i, n := range nodes {
		c := n.metric(t, `notifyedge_requests_total{channel="acme",outcome="replayed_cache"}`)
		if c < dups/2/4 {
			t.Errorf("node %d answered %v of its ~%v duplicates from the shared cache, want at least a quarter", i, c, dups/2)
		}
		cached += c
	}
	t.Logf("of %v duplicates, %v were answered by Redis", dups, cached)
}
