package edge_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
)

const appliedPaid = `{"code":"SUCCESS","outcome":"applied","status":"PAID"}`

// cachedDuplicate posts payload until a duplicate is answered from the
// cache (the Complete after the first answer is asynchronous) and returns
// the count of cache replays then.
func (b *bundle) cachedDuplicate(t *testing.T, payload string) float64 {
	t.Helper()
	const sample = `notifyedge_requests_total{channel="acme",outcome="replayed_cache"}`
	before := b.metric(t, sample)
	var n float64
	wait.For(t, "a duplicate answered from the cache", func() (bool, string) {
		r := b.post(t, payload)
		if r.status != 200 || !r.replayed || r.body != appliedPaid {
			t.Fatalf("duplicate: %d %q replayed=%v", r.status, r.body, r.replayed)
		}
		n = b.metric(t, sample)
		return n > before, fmt.Sprintf("%v cache replays", n)
	})
	return n
}

// entryKeys are the Redis keys of biz_key, under any epoch (claimcache
// tests the layout itself).
func entryKeys(t *testing.T, rdb *redis.Client, bizKey string) []string {
	t.Helper()
	keys, err := rdb.Keys(context.Background(), "*{"+bizKey+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// A manual repair (here: a restore that lost a payment) followed by a bump
// of the epoch through the admin API: within 2 s the next duplicate is no
// longer answered from Redis or from the node's own table, but decided by
// Postgres again, which applies the payment it no longer holds.
func TestEpochBumpForgetsCachedAnswers(t *testing.T) {
	b := setup(t, options{cache: true, localEntries: 1024, epoch: true})
	ctx := context.Background()
	b.order(t, "O-ep", durable.PendingPay, 1999)
	pay := body("T-ep", "PAY_SUCCESS", "O-ep", 1999)
	const bizKey = "acme:T-ep:PAY_SUCCESS"
	if r := b.post(t, pay); r.status != 200 || r.replayed || r.body != appliedPaid {
		t.Fatalf("first delivery: %d %q replayed=%v", r.status, r.body, r.replayed)
	}
	b.cachedDuplicate(t, pay)

	// The answer is in Redis under the epoch, and in the node's table:
	// with the Redis entry out of the way a duplicate still makes no query.
	epoch0 := b.cache.Epoch()
	if want, err := b.store.CacheEpoch(ctx); err != nil || epoch0 != want {
		t.Fatalf("the cache runs under %q, the database's epoch is %q (%v)", epoch0, want, err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: b.redis.Addr()})
	defer rdb.Close()
	keys := entryKeys(t, rdb, bizKey)
	if len(keys) != 1 {
		t.Fatalf("Redis keys of %s: %q, want the done entry", bizKey, keys)
	}
	key := keys[0]
	if err := rdb.Rename(ctx, key, key+".aside").Err(); err != nil {
		t.Fatal(err)
	}
	queries := b.queries.n.Load()
	b.cachedDuplicate(t, pay)
	if q := b.queries.n.Load(); q != queries {
		t.Fatalf("with the Redis entry aside, the duplicate made %d claim queries: not answered by the node's table", q-queries)
	}
	if err := rdb.Rename(ctx, key+".aside", key).Err(); err != nil {
		t.Fatal(err)
	}

	// The database loses the payment (a point-in-time restore to before it,
	// or a repair by hand); the cache still answers for it.
	for _, q := range []string{
		`DELETE FROM notify_claim WHERE biz_key = '` + bizKey + `'`,
		`DELETE FROM outbox WHERE order_no = 'O-ep'`,
		`UPDATE biz_order SET status = 'PENDING_PAY', paid_by = NULL, refunded_amount = 0 WHERE order_no = 'O-ep'`,
	} {
		if _, err := b.db.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	b.cachedDuplicate(t, pay) // the hazard the bump is for

	code, resp := b.admin(t, http.MethodPost, "/cache/epoch", adminToken, "")
	bumped := time.Now()
	epoch1, _ := resp["epoch"].(string)
	if code != 200 || epoch1 == "" || epoch1 == epoch0 {
		t.Fatalf("POST /cache/epoch: %d %v, want 200 and an epoch other than %s", code, resp, epoch0)
	}
	if want, err := b.store.CacheEpoch(ctx); err != nil || epoch1 != want {
		t.Fatalf("answered epoch %q, the database's is %q (%v)", epoch1, want, err)
	}
	// The epoch is re-read about once a second.
	wait.For(t, "the lost payment applied again after the bump, not answered by the cache", func() (bool, string) {
		r := b.post(t, pay)
		if r.status == 200 && !r.replayed && r.body == appliedPaid {
			return true, ""
		}
		if r.status != 200 || !r.replayed || r.body != appliedPaid {
			t.Fatalf("duplicate after the bump: %d %q replayed=%v", r.status, r.body, r.replayed)
		}
		return false, "replayed"
	})
	t.Logf("applied again %v after the bump", time.Since(bumped).Round(time.Millisecond))
	if b.cache.Epoch() != epoch1 {
		t.Errorf("the cache runs under %q, want %q", b.cache.Epoch(), epoch1)
	}
	if got := b.status(t, "O-ep"); got != "PAID" {
		t.Errorf("order %s, want PAID", got)
	}
	if n := b.count(t, `SELECT count(*) FROM notify_claim WHERE biz_key = $1 AND claim_state = 'DONE'`, bizKey); n != 1 {
		t.Errorf("%d DONE claims, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE order_no = 'O-ep' AND topic = 'ORDER_PAID'`); n != 1 {
		t.Errorf("%d ORDER_PAID rows, want 1", n)
	}
	// The old epoch's entry is left to expire; the new one fills in.
	b.cachedDuplicate(t, pay)
	if keys := entryKeys(t, rdb, bizKey); len(keys) != 2 {
		t.Errorf("Redis keys of %s: %q, want the old epoch's and the new one's", bizKey, keys)
	}
}

// POST /cache/epoch takes the admin token, and is 404 where no epoch is
// configured.
func TestEpochEndpointAccess(t *testing.T) {
	b := setup(t, options{cache: true, epoch: true})
	if code, _ := b.admin(t, http.MethodPost, "/cache/epoch", "", ""); code != 401 {
		t.Errorf("without a token: %d, want 401", code)
	}
	if code, _ := b.admin(t, http.MethodPost, "/cache/epoch", ordersToken, ""); code != 401 {
		t.Errorf("with the orders token: %d, want 401", code)
	}
	if code, _ := b.admin(t, http.MethodGet, "/cache/epoch", adminToken, ""); code != 405 {
		t.Errorf("GET: %d, want 405", code)
	}
	plain := setup(t, options{cache: true})
	if code, _ := plain.admin(t, http.MethodPost, "/cache/epoch", adminToken, ""); code != 404 {
		t.Errorf("without an epoch configured: %d, want 404", code)
	}
}

// A result cached against a primary is not answered for the standby
// promoted after it: the promoted database starts a new timeline, so its
// epoch, and every key, differ. Here the standby had stopped streaming
// before the payment (asynchronous replication lost it), so the duplicate
// must reach Postgres and be applied there, not replayed from the cache.
func TestPromotedStandbyIsNotAnsweredFromTheCache(t *testing.T) {
	ctx := context.Background()
	primary, err := pgtemp.Start(ctx, pgtemp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Stop() })
	b1 := setup(t, options{dbURL: primary.URL("postgres"), cache: true, localEntries: 1024, epoch: true})
	b1.order(t, "O-pr", durable.PendingPay, 1999)

	// A long checkpoint_timeout keeps the end-of-recovery checkpoint after
	// the promotion spread out: pg_control_checkpoint() keeps the old
	// timeline meanwhile, which the epoch must not rely on.
	standby, err := pgtemp.StartStandby(ctx, primary, pgtemp.Options{Settings: []string{"checkpoint_timeout=1h"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() })
	sc, err := pgx.Connect(ctx, standby.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close(ctx)
	poll := func(what, sql string, want int) {
		t.Helper()
		wait.For(t, what, func() (bool, string) {
			var n int
			err := sc.QueryRow(ctx, sql).Scan(&n)
			return err == nil && n == want, fmt.Sprint(n, err)
		})
	}
	poll("the order on the standby", `SELECT count(*) FROM biz_order WHERE order_no = 'O-pr'`, 1)
	for _, q := range []string{`ALTER SYSTEM SET primary_conninfo = ''`, `SELECT pg_reload_conf()`} {
		if _, err := sc.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	poll("the standby to stop streaming", `SELECT count(*) FROM pg_stat_wal_receiver`, 0)

	pay := body("T-pr", "PAY_SUCCESS", "O-pr", 1999)
	if r := b1.post(t, pay); r.status != 200 || r.replayed || r.body != appliedPaid {
		t.Fatalf("first delivery: %d %q replayed=%v", r.status, r.body, r.replayed)
	}
	b1.cachedDuplicate(t, pay)
	epoch0 := b1.cache.Epoch()
	var lost int
	if err := sc.QueryRow(ctx, `SELECT count(*) FROM notify_claim`).Scan(&lost); err != nil || lost != 0 {
		t.Fatalf("the standby holds %d claims (%v), want the payment missing", lost, err)
	}

	if err := primary.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	var checkpointTL int64
	if err := sc.QueryRow(ctx, `SELECT timeline_id FROM pg_control_checkpoint()`).Scan(&checkpointTL); err != nil {
		t.Fatal(err)
	}
	b2 := setup(t, options{dbURL: standby.URL("postgres"), redis: b1.redis, cache: true, localEntries: 1024, epoch: true})
	epoch1 := b2.cache.Epoch()
	t.Logf("epoch on the primary %s, on the promoted standby %s; pg_control_checkpoint() says timeline %d", epoch0, epoch1, checkpointTL)
	p0, p1 := strings.Split(epoch0, "-"), strings.Split(epoch1, "-")
	if len(p0) != 3 || len(p1) != 3 || p0[0] != p1[0] || p0[1] != "1" || p1[1] != "2" || p0[2] != p1[2] {
		t.Fatalf("epochs %s then %s: want the same system identifier and counter, timeline 1 then 2", epoch0, epoch1)
	}

	r := b2.post(t, pay)
	if r.status != 200 || r.replayed || r.body != appliedPaid {
		t.Fatalf("duplicate on the promoted database: %d %q replayed=%v, want applied by Postgres (the payment was lost with the old primary)", r.status, r.body, r.replayed)
	}
	if got := b2.status(t, "O-pr"); got != "PAID" {
		t.Errorf("order %s on the promoted database, want PAID", got)
	}
	b2.cachedDuplicate(t, pay)
}
