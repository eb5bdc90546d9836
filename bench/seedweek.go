package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// Seeding a week of traffic fast: each table's indexes and unique
// constraints are dropped (not its partial indexes: their predicates keep
// out nearly every seeded row, and the relay's poll needs the outbox's), its rows written by the server itself (INSERT
// ... SELECT over generate_series, two tables at a time, in chunks that
// report progress), the same indexes built again from their saved
// definitions, then VACUUM (ANALYZE) and a CHECKPOINT, so that no attack
// pays for the seeding's dirty pages or its autovacuum. The seeded keys,
// orders and trades are of no channel the stack serves and no order of
// the run's prefix: the invariants never see them.

// refundedPct is the share of seeded orders refunded (the orders SQL's
// states), each with one trade_refund row.
const refundedPct = 6

// seedChunk is how many rows one INSERT writes.
const seedChunk = 2_000_000

// seedSession are the settings of the seeding's sessions: big sorts for
// the index builds, no statement timeout.
var seedSession = []string{
	`SET maintenance_work_mem = '512MB'`,
	`SET max_parallel_maintenance_workers = 1`,
	`SET statement_timeout = 0`,
	`SET synchronous_commit = off`,
}

// seedPlan is what one seeding writes: row counts by table, their
// created_at spread evenly over Span ending EndAgo before At (zero: when
// the seeding starts; one instant for every chunk, so that the rows'
// times leave no gap where a chunk took long), oldest first. Claims,
// outbox and review rows name orders among the first Orders of the
// seeded ones (at least 1).
type seedPlan struct {
	Claims, Orders, Outbox, Reviews int64
	Span, EndAgo                    time.Duration
	At                              time.Time
}

// plan is the week's seedPlan.
func (w grownWeek) plan() seedPlan {
	claims := int64(w.PerDay) * int64(w.Days)
	return seedPlan{Claims: claims, Orders: int64(w.Orders), Outbox: int64(float64(claims) * w.OutboxPerClaim),
		Reviews: claims / int64(w.ClaimsPerReview), Span: time.Duration(w.Days) * 24 * time.Hour}
}

// seedWeek seeds p into db, recording the rows written by table and the
// seconds each phase took ("rows", "indexes", "vacuum", "checkpoint").
func seedWeek(ctx context.Context, db *pgxpool.Pool, p seedPlan, rows map[string]int64, seconds map[string]float64, say func(string, ...any)) error {
	claims, outbox, reviews, span := p.Claims, p.Outbox, p.Reviews, p.Span
	orders := max(p.Orders, 1)
	refunds := p.Orders * refundedPct / 100
	counts := map[string]int64{"notify_claim": claims, "biz_order": p.Orders, "outbox": outbox, "trade_refund": refunds, "notify_review": reviews}
	// Rows already in the outbox (the run's own, published) move behind
	// the seeded ones, which are older: ids ascend with publish time, as
	// retention's walk of the outbox expects.
	moveFrom, err := count(ctx, db, `SELECT coalesce(max(id), 0) FROM outbox`)
	if err != nil {
		return err
	}
	var saved []savedIndexes
	for _, t := range grownTables {
		s, err := dropIndexes(ctx, db, t)
		if err != nil {
			return err
		}
		saved = append(saved, s)
	}
	say("seed: %d claims, %d orders, %d outbox rows, %d refunds, %d review rows over %s ...", claims, p.Orders, outbox, refunds, reviews, span)
	start := time.Now()
	var done atomic.Int64
	progress := func(n int64) {
		total := done.Add(n)
		// The refunds' statement walks the orders, writing a few of them.
		say("seed: %d of %d rows walked (%.0f s)", total, claims+outbox+2*p.Orders+reviews, time.Since(start).Seconds())
	}
	at := p.At
	if at.IsZero() {
		at = start
	}
	args := func(lo, hi int64, n int64) []any {
		return []any{lo, hi, n, span.Microseconds(), orders, p.EndAgo.Microseconds(), at}
	}
	chunked := func(sql string, n int64) func() error {
		return func() error {
			return withSeedConn(ctx, db, func(c *pgx.Conn) error {
				for lo := int64(0); lo < n; lo += seedChunk {
					hi := min(lo+seedChunk, n)
					if _, err := c.Exec(ctx, sql, args(lo, hi, n)...); err != nil {
						return fmt.Errorf("seed: %w", err)
					}
					progress(hi - lo)
				}
				return nil
			})
		}
	}
	// Claims on one session; everything else on the other.
	err = parallel(2, []func() error{
		chunked(seedClaimsSQL, claims),
		func() error {
			for _, step := range []struct {
				sql string
				n   int64
			}{{seedOrdersSQL, p.Orders}, {seedOutboxSQL, outbox}, {seedRefundsSQL, p.Orders}, {seedReviewsSQL, reviews}} {
				if err := chunked(step.sql, step.n)(); err != nil {
					return err
				}
			}
			return nil
		},
	})
	if err != nil {
		return err
	}
	if err := moveOutbox(ctx, db, moveFrom); err != nil {
		return err
	}
	seconds["rows"] = time.Since(start).Seconds()
	for t, n := range counts {
		rows[t] = n
	}
	say("seed: rows in %.0f s; building the indexes again ...", seconds["rows"])
	start = time.Now()
	var builds []func() error
	for _, s := range saved {
		for _, q := range s.create {
			builds = append(builds, func() error {
				return withSeedConn(ctx, db, func(c *pgx.Conn) error {
					if _, err := c.Exec(ctx, q); err != nil {
						return fmt.Errorf("seed: %s: %w", q, err)
					}
					say("seed: %s (%.0f s)", q, time.Since(start).Seconds())
					return nil
				})
			})
		}
	}
	if err := parallel(2, builds); err != nil {
		return err
	}
	for _, s := range saved {
		if err := s.check(ctx, db); err != nil {
			return err
		}
	}
	seconds["indexes"] = time.Since(start).Seconds()
	start = time.Now()
	var vacuums []func() error
	for _, t := range grownTables {
		vacuums = append(vacuums, func() error {
			return withSeedConn(ctx, db, func(c *pgx.Conn) error {
				if _, err := c.Exec(ctx, `VACUUM (ANALYZE) `+t); err != nil {
					return fmt.Errorf("seed: vacuum %s: %w", t, err)
				}
				return nil
			})
		})
	}
	if err := parallel(2, vacuums); err != nil {
		return err
	}
	seconds["vacuum"] = time.Since(start).Seconds()
	start = time.Now()
	if _, err := db.Exec(ctx, `CHECKPOINT`); err != nil {
		return fmt.Errorf("seed: checkpoint: %w", err)
	}
	seconds["checkpoint"] = time.Since(start).Seconds()
	say("seed: done; vacuumed in %.0f s, checkpointed in %.0f s", seconds["vacuum"], seconds["checkpoint"])
	return nil
}

// The seeding's statements. Each writes the rows lo..hi-1 of n ($1, $2,
// $3), spread over the span ($4, µs) ending $6 µs before now, oldest
// first; $5 is how many orders the rows name.
// Keys look like the channels' own: WeChat Pay's 28-digit transaction ids
// and Alipay's trade numbers, each with the day in it, three in five of
// them WeChat's; nineteen in twenty claims are payments, the rest refunds
// (keyed by refund id) and closes. Orders are in every state: 8 % pending,
// 10 % paid, 67 % shipped, 9 % closed, 6 % refunded.
const (
	seedClaimsSQL = `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json, created_at)
SELECT k.channel || ':' || k.id || ':' || k.ev, 'GW' || lpad(((g * 7919) % $5)::text, 10, '0'),
       md5(g::text) || md5((g + 1)::text), 'DONE',
       CASE WHEN k.ev = 'PAY_SUCCESS' AND g % 10 <> 0
            THEN '{"http":200,"code":"SUCCESS","outcome":"applied","status":"PAID"}'
            ELSE '{"http":200,"code":"SUCCESS","outcome":"skipped","status":"SHIPPED"}' END,
       k.at
  FROM generate_series($1::bigint, $2::bigint - 1) g,
       LATERAL (SELECT $7::timestamptz - ($4::bigint + $6::bigint) * interval '1 microsecond' + (g * ($4::bigint / $3::bigint)) * interval '1 microsecond' AS at) t,
       LATERAL (SELECT CASE WHEN g % 5 < 3 THEN 'wechatpay' ELSE 'alipay' END AS channel,
                       CASE WHEN g % 20 = 19 THEN 'PAY_CLOSED' WHEN g % 20 = 18 THEN 'REFUND_SUCCESS' ELSE 'PAY_SUCCESS' END AS ev) c,
       LATERAL (SELECT c.channel, c.ev, CASE
                  WHEN c.ev = 'REFUND_SUCCESS' AND c.channel = 'wechatpay' THEN '50300' || lpad((g % 99991)::text, 5, '0') || to_char(t.at, 'YYYYMMDD') || lpad(g::text, 10, '0')
                  WHEN c.ev = 'REFUND_SUCCESS' THEN 'RF' || to_char(t.at, 'YYYYMMDD') || lpad(g::text, 12, '0')
                  WHEN c.channel = 'wechatpay' THEN '42000' || lpad((g % 99991)::text, 5, '0') || to_char(t.at, 'YYYYMMDD') || lpad(g::text, 10, '0')
                  ELSE to_char(t.at, 'YYYYMMDD') || '2200' || lpad((g % 9973)::text, 4, '0') || lpad(g::text, 12, '0') END AS id,
                  t.at) k`

	seedOrdersSQL = `INSERT INTO biz_order (order_no, status, amount, currency, updated_at, paid_by, refunded_amount, channel, paid_at)
SELECT 'GW' || lpad(g::text, 10, '0'), s.status, 100 + (g * 37) % 50000, 'CNY', s.at,
       CASE WHEN s.status IN ('PAID', 'SHIPPED', 'REFUNDED') THEN 'T' || g END,
       CASE WHEN s.status = 'REFUNDED' THEN 100 + (g * 37) % 50000 ELSE 0 END,
       CASE WHEN g % 5 < 3 THEN 'wechatpay' ELSE 'alipay' END,
       CASE WHEN s.status IN ('PAID', 'SHIPPED', 'REFUNDED') THEN s.at END
  FROM generate_series($1::bigint, $2::bigint - 1) g,
       LATERAL (SELECT CASE WHEN g % 100 < 8 THEN 'PENDING_PAY' WHEN g % 100 < 18 THEN 'PAID' WHEN g % 100 < 85 THEN 'SHIPPED'
                            WHEN g % 100 < 94 THEN 'CLOSED' ELSE 'REFUNDED' END AS status,
                       $7::timestamptz - ($4::bigint + $6::bigint) * interval '1 microsecond' + (g * ($4::bigint / $3::bigint)) * interval '1 microsecond' AS at) s
 WHERE $5::int > 0`

	seedOutboxSQL = `INSERT INTO outbox (topic, order_no, payload, created_at, published_at)
SELECT p.topic, o.no,
       jsonb_build_object('order_no', o.no, 'event_type', p.ev, 'from', p.from, 'to', p.to,
                          'biz_key', 'wechatpay:42000' || lpad((g % 99991)::text, 5, '0') || lpad(g::text, 18, '0') || ':' || p.ev),
       o.at, o.at + interval '30 milliseconds'
  FROM generate_series($1::bigint, $2::bigint - 1) g,
       LATERAL (SELECT 'GW' || lpad(((g * 7919) % $5)::text, 10, '0') AS no,
                       $7::timestamptz - ($4::bigint + $6::bigint) * interval '1 microsecond' + (g * ($4::bigint / $3::bigint)) * interval '1 microsecond' AS at) o,
       LATERAL (SELECT CASE WHEN g % 20 < 17 THEN 'ORDER_PAID' WHEN g % 20 = 17 THEN 'ORDER_CLOSED' WHEN g % 20 = 18 THEN 'ORDER_REFUNDED' ELSE 'ORDER_PARTIALLY_REFUNDED' END AS topic,
                       CASE WHEN g % 20 < 17 THEN 'PAY_SUCCESS' WHEN g % 20 = 17 THEN 'PAY_CLOSED' ELSE 'REFUND_SUCCESS' END AS ev,
                       CASE WHEN g % 20 < 18 THEN 'PENDING_PAY' ELSE 'SHIPPED' END AS "from",
                       CASE WHEN g % 20 < 17 THEN 'PAID' WHEN g % 20 = 17 THEN 'CLOSED' WHEN g % 20 = 18 THEN 'REFUNDED' ELSE 'SHIPPED' END AS "to") p`

	// One refund a refunded order (orders whose g % 100 >= 94: refundedPct), by trade
	// and refund id; written for the orders lo..hi-1.
	seedRefundsSQL = `INSERT INTO trade_refund (trade, refund_id, order_no, amount, created_at)
SELECT 'T' || g, 'R' || g, 'GW' || lpad(g::text, 10, '0'), 100 + (g * 37) % 50000,
       $7::timestamptz - ($4::bigint + $6::bigint) * interval '1 microsecond' + (g * ($4::bigint / $3::bigint)) * interval '1 microsecond'
  FROM generate_series($1::bigint, $2::bigint - 1) g
 WHERE g % 100 >= 94 AND $5::int > 0`

	// Review rows hold the raw body: about 600 bytes, as a channel's
	// callback is. Nine in ten are resolved an hour after they opened.
	seedReviewsSQL = `INSERT INTO notify_review (biz_key, order_no, reason, payload_hash, raw_body, created_at, resolved_at, resolution, resolved_by)
SELECT 'wechatpay:42000' || lpad(g::text, 23, '0') || ':PAY_SUCCESS', 'GW' || lpad(((g * 7919) % $5)::text, 10, '0'),
       (ARRAY['DUPLICATE_PAYMENT', 'PAID_AFTER_CLOSE', 'AMOUNT_MISMATCH', 'UNKNOWN_ORDER'])[1 + g % 4],
       md5(g::text) || md5((g + 2)::text),
       '{"id":"' || md5(g::text) || '","create_time":"2026-12-01T10:00:00+08:00","resource_type":"encrypt-resource","event_type":"TRANSACTION.SUCCESS","summary":"pay success","resource":{"original_type":"transaction","algorithm":"AEAD_AES_256_GCM","ciphertext":"' || repeat(md5((g + 3)::text), 12) || '","associated_data":"transaction","nonce":"' || left(md5((g + 4)::text), 12) || '"}}',
       r.at, CASE WHEN g % 10 <> 0 THEN r.at + interval '1 hour' END,
       CASE WHEN g % 10 <> 0 THEN 'refunded the second payment' END, CASE WHEN g % 10 <> 0 THEN 'ops' END
  FROM generate_series($1::bigint, $2::bigint - 1) g,
       LATERAL (SELECT $7::timestamptz - ($4::bigint + $6::bigint) * interval '1 microsecond' + (g * ($4::bigint / $3::bigint)) * interval '1 microsecond' AS at) r`
)

// quiesce waits until what the seeding set going has settled, so that no
// attack pays for it: an AOF rewrite of the Redis it wrote to (started
// here if AOF is on, since the seeding's growth would start one in the
// middle of an attack), a checkpoint, and the kernel's dirty pages
// written back (sync, then Dirty and Writeback under 64 MiB). It returns
// how long that took.
func quiesce(ctx context.Context, db *pgxpool.Pool, rdb *redis.Client) (time.Duration, error) {
	start := time.Now()
	if rdb != nil {
		info, err := rdb.InfoMap(ctx, "persistence").Result()
		if err != nil {
			return 0, fmt.Errorf("quiesce: redis info: %w", err)
		}
		if info["Persistence"]["aof_enabled"] == "1" {
			if err := rdb.BgRewriteAOF(ctx).Err(); err != nil && !strings.Contains(err.Error(), "already in progress") {
				return 0, fmt.Errorf("quiesce: BGREWRITEAOF: %w", err)
			}
		}
		if !wait.Within(5*time.Minute, func() bool {
			info, err := rdb.InfoMap(ctx, "persistence").Result()
			p := info["Persistence"]
			return err == nil && p["aof_rewrite_in_progress"] == "0" && p["aof_rewrite_scheduled"] == "0" && p["rdb_bgsave_in_progress"] == "0"
		}) {
			return 0, errors.New("quiesce: Redis still rewriting its AOF after 5 minutes")
		}
	}
	if _, err := db.Exec(ctx, `CHECKPOINT`); err != nil {
		return 0, fmt.Errorf("quiesce: checkpoint: %w", err)
	}
	syscall.Sync()
	if !wait.Within(2*time.Minute, func() bool { return dirtyMiB() < 64 }) {
		return 0, fmt.Errorf("quiesce: %.0f MiB of dirty pages still not written back after 2 minutes", dirtyMiB())
	}
	return time.Since(start), nil
}

// dirtyMiB is the kernel's Dirty and Writeback pages, MiB.
func dirtyMiB() float64 {
	return statusMiB("/proc/meminfo", "Dirty:") + statusMiB("/proc/meminfo", "Writeback:")
}

// moveOutbox moves the outbox rows up to id last to new ids, after every
// other row: same content, event id included. It waits for the relay to
// have published them (an idle edge's take well under a second).
func moveOutbox(ctx context.Context, db *pgxpool.Pool, last int) error {
	if last == 0 {
		return nil
	}
	if !wait.Within(30*time.Second, func() bool {
		n, err := count(ctx, db, `SELECT count(*) FROM outbox WHERE id <= $1 AND published_at IS NULL`, last)
		return err == nil && n == 0
	}) {
		return errors.New("seed: the outbox's rows were not all published within 30 s")
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (topic, order_no, payload, created_at, published_at, event_id)
SELECT topic, order_no, payload, created_at, published_at, event_id FROM outbox WHERE id <= $1 ORDER BY id`, last); err != nil {
			return fmt.Errorf("seed: move the outbox's rows: %w", err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM outbox WHERE id <= $1`, last); err != nil {
			return fmt.Errorf("seed: move the outbox's rows: %w", err)
		}
		return nil
	})
}

// savedIndexes are a table's indexes and unique constraints, dropped for
// the seeding, and the statements that make them again.
type savedIndexes struct {
	table  string
	create []string
}

// dropIndexes drops every index of table but the partial ones
// (constraints' included) and returns what builds them again.
func dropIndexes(ctx context.Context, db *pgxpool.Pool, table string) (savedIndexes, error) {
	s := savedIndexes{table: table}
	var drops []string
	rows, err := db.Query(ctx, `SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
 WHERE conrelid = $1::regclass AND contype IN ('p', 'u') ORDER BY contype, conname`, table)
	if err != nil {
		return s, fmt.Errorf("seed: constraints of %s: %w", table, err)
	}
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			return s, err
		}
		drops = append(drops, fmt.Sprintf(`ALTER TABLE %s DROP CONSTRAINT %s`, table, name))
		s.create = append(s.create, fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT %s %s`, table, name, def))
	}
	if err := rows.Err(); err != nil {
		return s, fmt.Errorf("seed: constraints of %s: %w", table, err)
	}
	rows, err = db.Query(ctx, `SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = $1::regclass AND i.indpred IS NULL AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid) ORDER BY c.relname`, table)
	if err != nil {
		return s, fmt.Errorf("seed: indexes of %s: %w", table, err)
	}
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			return s, err
		}
		drops = append(drops, `DROP INDEX `+name)
		s.create = append(s.create, def)
	}
	if err := rows.Err(); err != nil {
		return s, fmt.Errorf("seed: indexes of %s: %w", table, err)
	}
	for _, q := range drops {
		if _, err := db.Exec(ctx, q); err != nil {
			return s, fmt.Errorf("seed: %s: %w", q, err)
		}
	}
	return s, nil
}

// check fails unless the table has every index it had before the seeding,
// valid: a unique constraint left out would let a duplicate through.
func (s savedIndexes) check(ctx context.Context, db *pgxpool.Pool) error {
	n, err := count(ctx, db, `SELECT count(*) FROM pg_index WHERE indrelid = $1::regclass AND indpred IS NULL AND indisvalid`, s.table)
	if err != nil {
		return err
	}
	if n != len(s.create) {
		return fmt.Errorf("seed: %s has %d full indexes after the seeding, want %d", s.table, n, len(s.create))
	}
	return nil
}

// withSeedConn runs f on a connection of db with the seeding's settings,
// reset when it is handed back.
func withSeedConn(ctx context.Context, db *pgxpool.Pool, f func(*pgx.Conn) error) error {
	c, err := db.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	defer c.Release()
	for _, q := range seedSession {
		if _, err := c.Exec(ctx, q); err != nil {
			return fmt.Errorf("seed: %s: %w", q, err)
		}
	}
	defer c.Exec(context.WithoutCancel(ctx), `RESET ALL`)
	return f(c.Conn())
}

// seedCacheDay writes n done entries into the cache's Redis, each a copy
// of a real one the edge wrote (its key's length and layout, its value's
// answer bytes; a digest of its own), with TTLs spread over the result
// TTL, as a day at a steady rate leaves them; and measures what they take.
func seedCacheDay(ctx context.Context, rdb *redis.Client, n int, r *RedisSizing, say func(string, ...any)) error {
	key, val, err := realDoneEntry(ctx, rdb)
	if err != nil {
		return err
	}
	r.KeyBytes, r.ValueBytes = len(key), len(val)
	if r.MemoryUsage, err = rdb.MemoryUsage(ctx, key).Result(); err != nil {
		return fmt.Errorf("seed cache: MEMORY USAGE: %w", err)
	}
	// The key's epoch prefix ("ne:<epoch>:{"), then a biz_key of the
	// real one's length.
	open := strings.IndexByte(key, '{') + 1
	prefix, bizLen := key[:open], len(key)-open-1
	if r.MemoryUsagePending, err = pendingUsage(ctx, rdb, prefix, key[open:len(key)-1]); err != nil {
		return err
	}
	used0, err := usedMemory(ctx, rdb)
	if err != nil {
		return err
	}
	say("grown: writing %d done entries of %d+%d bytes into the cache's Redis ...", n, len(key), len(val))
	const pipe = 1000
	digest := make([]byte, 32)
	value := []byte(val)
	const day = 24 * time.Hour
	for lo := 0; lo < n; lo += pipe {
		p := rdb.Pipeline()
		for i := lo; i < min(lo+pipe, n); i++ {
			id := "wechatpay:42000" + strconv.Itoa(100000000+i)
			biz := id + strings.Repeat("0", max(0, bizLen-len(id)-len(":PAY_SUCCESS"))) + ":PAY_SUCCESS"
			rand.Read(digest)
			copy(value[1:33], digest)
			// Spread over the day, the oldest entry first (in float: the
			// day in ns times the index overflows int64).
			ttl := time.Duration(float64(day)*float64(i)/float64(n)) + time.Minute
			p.Set(ctx, prefix+biz+"}", string(value), ttl)
		}
		if _, err := p.Exec(ctx); err != nil {
			return fmt.Errorf("seed cache: %w", err)
		}
		if lo%(500*pipe) == 0 && lo > 0 {
			say("grown: %d of %d cache entries", lo, n)
		}
	}
	used1, err := usedMemory(ctx, rdb)
	if err != nil {
		return err
	}
	r.Entries = int64(n)
	r.UsedBeforeMiB, r.UsedAfterMiB = float64(used0)/(1<<20), float64(used1)/(1<<20)
	r.PerEntry = float64(used1-used0) / float64(n)
	return nil
}

// pendingUsage is MEMORY USAGE of a pending claim the cache itself makes
// for a key as long as biz (reversed: another key), under the epoch of
// prefix ("ne:<epoch>:{", or "ne:{" for a cache without one); the claim is aborted afterwards.
func pendingUsage(ctx context.Context, rdb *redis.Client, prefix, biz string) (int64, error) {
	cfg := claimcache.Config{Client: rdb}
	if epoch, ok := strings.CutSuffix(strings.TrimPrefix(prefix, "ne:"), ":{"); ok {
		cfg.Epoch = func(context.Context) (string, error) { return epoch, nil }
	}
	c, err := claimcache.New(cfg)
	if err != nil {
		return 0, fmt.Errorf("seed cache: %w", err)
	}
	defer c.Close()
	b := []byte(biz)
	slices.Reverse(b)
	var d claimcache.Digest
	rand.Read(d[:])
	res, err := c.Claim(ctx, b, d)
	if err != nil || res.Verdict != claimcache.Won {
		return 0, fmt.Errorf("seed cache: a pending claim: %v %w", res.Verdict, err)
	}
	defer c.Abort(ctx, b, d, res.Token)
	n, err := rdb.MemoryUsage(ctx, prefix+string(b)+"}").Result()
	if err != nil {
		return 0, fmt.Errorf("seed cache: MEMORY USAGE of a pending claim: %w", err)
	}
	return n, nil
}

// realDoneEntry finds a done entry the edge wrote ('D' first).
func realDoneEntry(ctx context.Context, rdb *redis.Client) (string, string, error) {
	iter := rdb.Scan(ctx, 0, "ne:*", 1000).Iterator()
	for iter.Next(ctx) {
		v, err := rdb.Get(ctx, iter.Val()).Result()
		if err == nil && len(v) > 33 && v[0] == 'D' {
			return iter.Val(), v, nil
		}
	}
	if err := iter.Err(); err != nil {
		return "", "", fmt.Errorf("seed cache: scan: %w", err)
	}
	return "", "", errors.New("seed cache: no done entry in the cache's Redis to copy (the empty rows write them)")
}

// usedMemory is INFO memory's used_memory.
func usedMemory(ctx context.Context, rdb *redis.Client) (int64, error) {
	info, err := rdb.InfoMap(ctx, "memory").Result()
	if err != nil {
		return 0, fmt.Errorf("redis info: %w", err)
	}
	v, err := strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("redis used_memory: %w", err)
	}
	return v, nil
}
