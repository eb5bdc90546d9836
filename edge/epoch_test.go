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
	// The watermark on, as edged runs: a promotion is no restore.
	b1 := setup(t, options{dbURL: primary.URL("postgres"), cache: true, localEntries: 1024, epoch: true, watermark: true})
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
	b2 := setup(t, options{dbURL: standby.URL("postgres"), redis: b1.redis, cache: true, localEntries: 1024, epoch: true, watermark: true})
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

// A base backup of a running database, started as the primary after more
// payments were applied and cached: the restored database has the same
// system identifier, timeline and counter, so the same epoch, and lacks
// every payment written after the backup. The node started on it finds the
// database behind the cache's watermark and moves the epoch on: each
// re-delivery of a payment written after the backup is applied again (the
// order PAID once), none is answered from the cache; those written before
// are replayed.
func TestRestoredBaseBackupIsNotAnsweredFromTheCache(t *testing.T) {
	restoredBackupScenario(t, true)
}

// Without the watermark the same restore is answered from the cache: the
// scenario above would catch a watermark that does not work.
func TestRestoredBaseBackupWithoutWatermarkIsAnsweredFromTheCache(t *testing.T) {
	if n := restoredBackupScenario(t, false); n == 0 {
		t.Error("with the watermark off no re-delivery was answered from the cache: the scenario does not restore what it should")
	}
}

// restoredBackupScenario runs the restore, with the cache's watermark on
// or off, and returns how many re-deliveries of payments written after the
// backup the cache answered.
func restoredBackupScenario(t *testing.T, watermark bool) int {
	ctx := context.Background()
	primary, err := pgtemp.Start(ctx, pgtemp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Stop() })
	opts := options{dbURL: primary.URL("postgres"), cache: true, localEntries: 1024, epoch: true, watermark: watermark}
	b1 := setup(t, opts)
	const before, after = 5, 10
	pay := func(i int) string {
		return body(fmt.Sprintf("T-bk%d", i), "PAY_SUCCESS", fmt.Sprintf("O-bk%d", i), 1999)
	}
	for i := range before + after {
		b1.order(t, fmt.Sprintf("O-bk%d", i), durable.PendingPay, 1999)
	}
	deliver := func(b *bundle, i int) {
		t.Helper()
		if r := b.post(t, pay(i)); r.status != 200 || r.replayed || r.body != appliedPaid {
			t.Fatalf("payment %d: %d %q replayed=%v, want applied", i, r.status, r.body, r.replayed)
		}
		b.cachedDuplicate(t, pay(i))
	}
	for i := range before {
		deliver(b1, i)
	}
	backup, err := pgtemp.TakeBackup(ctx, primary)
	if err != nil {
		t.Fatal(err)
	}
	for i := before; i < before+after; i++ {
		deliver(b1, i)
	}
	epoch0 := b1.cache.Epoch()
	if err := primary.Stop(); err != nil {
		t.Fatal(err)
	}
	restored, err := backup.Start(ctx, pgtemp.Options{})
	if err != nil {
		backup.Remove()
		t.Fatal(err)
	}
	t.Cleanup(func() { restored.Stop() })

	// The node restarted on the restored database, with the same Redis.
	opts.dbURL, opts.redis = restored.URL("postgres"), b1.redis
	b2 := setup(t, opts)
	epoch1 := b2.cache.Epoch()
	const sample = `notifyedge_requests_total{channel="acme",outcome="replayed_cache"}`
	fromCache := 0
	for i := range before + after {
		cached := b2.metric(t, sample)
		r := b2.post(t, pay(i))
		if b2.metric(t, sample) > cached {
			if i >= before {
				fromCache++
			}
			continue
		}
		want := i < before // a payment the backup holds is replayed by Postgres
		if r.status != 200 || r.replayed != want || r.body != appliedPaid {
			t.Errorf("payment %d re-delivered: %d %q replayed=%v, want replayed=%v", i, r.status, r.body, r.replayed, want)
		}
	}
	var paid, events int
	if err := b2.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'PAID'), (SELECT count(*) FROM outbox WHERE order_no LIKE 'O-bk%')
		FROM biz_order WHERE order_no LIKE 'O-bk%'`).Scan(&paid, &events); err != nil {
		t.Fatal(err)
	}
	t.Logf("watermark %v: epoch %s before, %s on the restored database; %d payments after the backup re-delivered, %d answered from the cache; %d orders PAID, %d order events",
		watermark, epoch0, epoch1, after, fromCache, paid, events)
	if watermark {
		if fromCache != 0 || paid != before+after || events != before+after || epoch1 == epoch0 {
			t.Errorf("%d of %d payments after the backup answered from the cache, %d orders PAID, %d events, epoch %s then %s: "+
				"want none from the cache, every order PAID once, a new epoch", fromCache, after, paid, events, epoch0, epoch1)
		}
	}
	return fromCache
}

// A crash of the database (every backend gone, recovery at the next
// start) is no restore: the node reconnects, the epoch stays, and
// duplicates are answered from the cache again.
func TestDatabaseCrashKeepsTheCacheEpoch(t *testing.T) {
	ctx := context.Background()
	db, err := pgtemp.Start(ctx, pgtemp.Options{Durable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Stop() })
	b := setup(t, options{dbURL: db.URL("postgres"), cache: true, localEntries: 1024, epoch: true, watermark: true})
	b.order(t, "O-cr1", durable.PendingPay, 1999)
	b.order(t, "O-cr2", durable.PendingPay, 1999)
	pay1, pay2 := body("T-cr1", "PAY_SUCCESS", "O-cr1", 1999), body("T-cr2", "PAY_SUCCESS", "O-cr2", 1999)
	if r := b.post(t, pay1); r.status != 200 || r.body != appliedPaid {
		t.Fatalf("first delivery: %d %q", r.status, r.body)
	}
	b.cachedDuplicate(t, pay1)
	epoch0 := b.cache.Epoch()

	db.Crash()
	if err := db.Restart(ctx, pgtemp.Options{Durable: true}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "a payment applied after the restart", func() (bool, string) {
		r := b.post(t, pay2)
		return r.status == 200 && r.body == appliedPaid, fmt.Sprint(r.status, " ", r.body)
	})
	b.cachedDuplicate(t, pay2)
	if err := b.cache.RefreshEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.cache.Epoch(); got != epoch0 {
		t.Errorf("epoch %s after the crash, want %s (no restore)", got, epoch0)
	}
	b.cachedDuplicate(t, pay1)
}
