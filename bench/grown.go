package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

// The grown rows: the "first" and "hotdup" rows again, over tables seeded
// as a week of traffic would leave them (grownWeek), and a pair of
// retention rows deleting the day the week has past the claim retention.
// Compared with the same rows on the run's empty tables, they show what
// the data's size costs a delivery. They are opt-in: a run has them only
// when -scenario names them (`make bench-grown`); a quick run seeds a few
// thousand rows (the smoke test).

// The grown rows' names ("-scenario grown" selects all of them).
const (
	grownFirst         = "grown: first"
	grownHotdup        = "grown: hotdup (cache on)"
	grownFirstAt       = "grown: first at 80% of peak"
	grownRetentionOff  = "grown: retention: before (a day expired)"
	grownRetentionOn   = "grown: retention: deleting the day"
	grownRetentionRate = 0.5
)

// grownScenarios are the grown rows, in the order they run.
var grownScenarios = []scenario{
	{name: grownFirst, to: edgeCacheOn, ownStack: true, drive: closedLoopWorkers, source: fresh, setup: seedGrown},
	{name: grownHotdup, to: edgeCacheOn, ownStack: true, drive: closedLoopWorkers, source: hot},
	{name: grownFirstAt, to: edgeCacheOn, ownStack: true, drive: atPeakShare(grownFirst, 0.8), source: fresh},
	{name: grownRetentionOff, to: edgeCacheOn, ownStack: true, drive: withoutRetention(grownFirst, grownRetentionRate), source: fresh,
		setup: grownRetention, ready: beginRetention, orders: ordersWithout(grownFirst, grownRetentionRate)},
	{name: grownRetentionOn, to: edgeCacheOn, ownStack: true, drive: untilDeleted(grownFirst, grownRetentionRate), source: fresh,
		ready: startRetention, after: finishGrownRetention, orders: ordersUntilDeleted(grownFirst, grownRetentionRate)},
}

// grownSettings are the server settings of a full run with the grown rows
// (its empty rows too: both sides run on one server), as an operator sizes
// a server for a week of claims: buffers that hold the hot index pages, and
// WAL room enough that a day's deletion does not force checkpoints (the
// default max_wal_size, 1 GB, is a few minutes of callbacks).
var grownSettings = []string{
	"shared_buffers=2GB",
	"max_wal_size=8GB",
	"checkpoint_timeout=15min",
}

// grownWeek is what the seeding writes: Days days of traffic at PerDay
// first deliveries a day, the oldest day past the claim and outbox
// retentions (168 h), so that retention has one day to delete.
type grownWeek struct {
	PerDay int `json:"claims_per_day"`
	Days   int `json:"days"`
	// Orders are biz_order rows in every state (refundedPct of them
	// refunded, one trade_refund row each); OutboxPerClaim published
	// outbox rows per claim; ClaimsPerReview claims per review row (nine
	// in ten resolved).
	Orders          int     `json:"orders"`
	OutboxPerClaim  float64 `json:"outbox_per_claim"`
	ClaimsPerReview int     `json:"claims_per_review"`
	// CachePerDay is how many done entries the cache's Redis gets: a day
	// at the same rate (the result TTL is 24 h).
	CachePerDay int `json:"cache_entries"`
}

// grownSize is the week of a full run (50 first deliveries a second: 30
// million claims kept, 4.3 million a day), or a smoke test's.
func grownSize(quick bool) grownWeek {
	if quick {
		return grownWeek{PerDay: 1_000, Days: 8, Orders: 2_000, OutboxPerClaim: 0.66, ClaimsPerReview: 2_000, CachePerDay: 1_000}
	}
	const perDay = 50 * 86_400
	return grownWeek{PerDay: perDay, Days: 8, Orders: 5_000_000, OutboxPerClaim: 0.66, ClaimsPerReview: 2_000, CachePerDay: perDay}
}

// GrownFigures are the grown rows' figures beside the run's empty rows.
type GrownFigures struct {
	Week grownWeek `json:"week"`
	// Rows are the seeded rows by table; Seconds how long each phase took
	// ("rows", "indexes", "vacuum", "checkpoint", "redis", and "quiesce":
	// waiting for Redis's AOF rewrite and the kernel's writeback).
	Rows    map[string]int64   `json:"rows"`
	Seconds map[string]float64 `json:"seed_seconds"`
	// Sizes are the tables' heap and index sizes in MiB after seeding,
	// and after retention deleted the day.
	Sizes      []tableSize `json:"sizes_after_seed"`
	SizesAfter []tableSize `json:"sizes_after_retention,omitempty"`
	// Redis is the cache Redis's size with a day of done entries.
	Redis RedisSizing `json:"redis"`
	// LoadAvgBefore is /proc/loadavg before the seeding.
	LoadAvgBefore string `json:"loadavg_before"`
	// Compare is empty against grown, row by row.
	Compare []grownCompare `json:"compare"`
	// Retention is the pair of retention rows over the grown tables.
	Retention *RetentionFigures `json:"retention,omitempty"`
}

// tableSize is one table's size.
type tableSize struct {
	Table    string  `json:"table"`
	Rows     int64   `json:"rows_estimate"`
	HeapMiB  float64 `json:"heap_mib"`
	IndexMiB float64 `json:"index_mib"`
}

// RedisSizing is the cache Redis's memory, measured.
type RedisSizing struct {
	// Entries is how many done entries the seeding wrote, each a copy of
	// a real one (same key length, value and layout), with TTLs spread
	// over the day.
	Entries int64 `json:"entries_seeded"`
	// UsedBefore and UsedAfter are used_memory (MiB) around the seeding;
	// PerEntry is their difference over Entries: allocator and dict
	// overhead included.
	UsedBeforeMiB float64 `json:"used_memory_before_mib"`
	UsedAfterMiB  float64 `json:"used_memory_after_mib"`
	PerEntry      float64 `json:"bytes_per_entry"`
	// MemoryUsage is MEMORY USAGE of a real done entry; KeyBytes and
	// ValueBytes its key's and value's lengths.
	MemoryUsage int64 `json:"memory_usage_done_entry"`
	KeyBytes    int   `json:"key_bytes"`
	ValueBytes  int   `json:"value_bytes"`
	// MemoryUsagePending is MEMORY USAGE of a pending claim for a key as
	// long, made by the cache itself.
	MemoryUsagePending int64 `json:"memory_usage_pending_claim"`
}

// grownCompare is one row on empty tables against its grown twin.
type grownCompare struct {
	Empty, Grown string
	// ReqPerSec, P99 (ms) and CPU µs per request by process, each as
	// empty and grown.
	ReqPerSec [2]float64 `json:"req_per_sec"`
	P99       [2]float64 `json:"p99_ms"`
	Edge      [2]float64 `json:"edge_us"`
	Postgres  [2]float64 `json:"postgres_us"`
	Redis     [2]float64 `json:"redis_us"`
}

// grownRun is the grown rows' state.
type grownRun struct {
	figures GrownFigures
}

// seedGrown (the first grown row's setup) measures the empty rows it is
// compared with if this run has none, then seeds Postgres and the cache's
// Redis as a week of traffic leaves them.
func seedGrown(ctx context.Context, e *env) error {
	for _, name := range []string{"first", "hotdup (cache on)", "first at 80% of peak"} {
		if e.rep.find(name) != nil {
			continue
		}
		// The empty rows this one is compared with, were they not selected.
		for _, s := range scenarios {
			if s.name == name {
				if err := e.row(ctx, e.rep, s, true); err != nil {
					return err
				}
			}
		}
	}
	w := grownSize(e.cfg.Quick)
	g := &grownRun{figures: GrownFigures{Week: w, Rows: map[string]int64{}, Seconds: map[string]float64{}, LoadAvgBefore: loadAvg()}}
	e.grown = g
	if err := seedWeek(ctx, e.db, w.plan(), g.figures.Rows, g.figures.Seconds, e.say); err != nil {
		return err
	}
	sizes, err := tableSizes(ctx, e.db)
	if err != nil {
		return err
	}
	g.figures.Sizes = sizes
	start := time.Now()
	rdb := redis.NewClient(&redis.Options{Addr: e.st.Redis.Addr()})
	defer rdb.Close()
	if err := seedCacheDay(ctx, rdb, w.CachePerDay, &g.figures.Redis, e.say); err != nil {
		return err
	}
	g.figures.Seconds["redis"] = time.Since(start).Seconds()
	quiet, err := quiesce(ctx, e.db, rdb)
	g.figures.Seconds["quiesce"] = quiet.Seconds()
	return err
}

// grownRetention (the first grown retention row's setup) makes the pair:
// the day past retention is already in the seeded week.
func grownRetention(ctx context.Context, e *env) error {
	if e.grown == nil {
		return fmt.Errorf("the %q row did not run (select the grown rows together)", grownFirst)
	}
	r := &retentionRun{before: grownRetentionOff, during: grownRetentionOn, of: grownFirst, figures: RetentionFigures{Target: 1.5},
		turn: grownTurn, turns: grownTurns}
	if e.cfg.Quick {
		r.turn = e.cfg.Duration / 4
	}
	r.figures.TurnSeconds, r.figures.Turns = r.turn.Seconds(), r.turns
	r.figures.Backlog = int(e.grown.figures.Rows["notify_claim"]) / e.grown.figures.Week.Days
	r.outboxBacklog = int(e.grown.figures.Rows["outbox"]) / e.grown.figures.Week.Days
	if err := r.measurePeak(ctx, e); err != nil {
		return err
	}
	r.register(e)
	return nil
}

// grownTurn is the turn the grown day's deletion alternates in with none,
// for grownTurns turns (retention first) before it runs to its end: 40
// minutes, half of them deleting, about a quarter of the day. Five minutes
// hold a checkpoint's flush or most of one; eight turns give each side
// four (Quick: a quarter of the attack's second each).
const (
	grownTurn  = 5 * time.Minute
	grownTurns = 8
)

// finishGrownRetention is finishRetention, then the tables' sizes after the
// deletion (dead rows and all: no vacuum is forced).
func finishGrownRetention(ctx context.Context, e *env) error {
	err := finishRetention(ctx, e)
	sizes, serr := tableSizes(ctx, e.db)
	if serr == nil {
		e.grown.figures.SizesAfter = sizes
	}
	if err != nil {
		return err
	}
	return serr
}

// grownFigures completes the grown figures with the rows' figures (nil if
// the grown rows did not run).
func (e *env) grownFigures(rep *Report) *GrownFigures {
	if e.grown == nil {
		return nil
	}
	f := e.grown.figures
	f.Compare = nil
	for _, pair := range [][2]string{{"first", grownFirst}, {"hotdup (cache on)", grownHotdup}, {"first at 80% of peak", grownFirstAt}} {
		a, b := rep.find(pair[0]), rep.find(pair[1])
		if a == nil || b == nil {
			continue
		}
		c := grownCompare{Empty: pair[0], Grown: pair[1]}
		for i, r := range []*Row{a, b} {
			c.ReqPerSec[i], c.P99[i] = r.ReqPerSec, millis(r.Lat.P99)
			c.Edge[i], c.Postgres[i], c.Redis[i] = deref(r.CPU.Edge), deref(r.CPU.Postgres), deref(r.CPU.Redis)
		}
		f.Compare = append(f.Compare, c)
	}
	f.Retention = e.retentionFigures(rep, grownRetentionOff)
	return &f
}

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}

// table renders the figures for Report.Table.
func (f *GrownFigures) table() string {
	var b strings.Builder
	w := f.Week
	fmt.Fprintf(&b, "\nGrown: %d days at %d first deliveries a day (the oldest past retention), %d orders; load average before %s\n",
		w.Days, w.PerDay, w.Orders, f.LoadAvgBefore)
	fmt.Fprintf(&b, "  seeded:")
	for _, t := range grownTables {
		fmt.Fprintf(&b, " %s %d,", t, f.Rows[t])
	}
	fmt.Fprintf(&b, " cache entries %d\n  seconds:", f.Redis.Entries)
	for _, p := range []string{"rows", "indexes", "vacuum", "checkpoint", "redis", "quiesce"} {
		fmt.Fprintf(&b, " %s %.1f,", p, f.Seconds[p])
	}
	b.WriteString("\n")
	b.WriteString(sizesTable("after seeding", f.Sizes))
	if len(f.SizesAfter) > 0 {
		b.WriteString(sizesTable("after retention deleted the day", f.SizesAfter))
	}
	r := f.Redis
	fmt.Fprintf(&b, "  redis: used_memory %.1f -> %.1f MiB for %d done entries: %.0f bytes an entry; MEMORY USAGE of a real one %d (key %d bytes, value %d), of a pending claim %d\n",
		r.UsedBeforeMiB, r.UsedAfterMiB, r.Entries, r.PerEntry, r.MemoryUsage, r.KeyBytes, r.ValueBytes, r.MemoryUsagePending)
	fmt.Fprintf(&b, "  %-22s %21s %21s %21s %21s %21s\n", "empty -> grown", "req/s", "p99 ms", "edge µs", "postgres µs", "redis µs")
	for _, c := range f.Compare {
		pair := func(v [2]float64) string {
			if v[0] == 0 {
				return fmt.Sprintf("%8.1f %8.1f    -", v[0], v[1])
			}
			return fmt.Sprintf("%8.1f %8.1f %4.2fx", v[0], v[1], v[1]/v[0])
		}
		fmt.Fprintf(&b, "  %-22s %21s %21s %21s %21s %21s\n", c.Empty, pair(c.ReqPerSec), pair(c.P99), pair(c.Edge), pair(c.Postgres), pair(c.Redis))
	}
	if f.Retention != nil {
		b.WriteString(strings.Replace(f.Retention.table(), "\nRetention:", "\nGrown retention:", 1))
	}
	return b.String()
}

// sizesTable renders table sizes.
func sizesTable(when string, sizes []tableSize) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  sizes %s (MiB):", when)
	if len(sizes) == 0 {
		b.WriteString(" not read")
	}
	for _, t := range sizes {
		fmt.Fprintf(&b, " %s %d rows heap %.0f index %.0f;", t.Table, t.Rows, t.HeapMiB, t.IndexMiB)
	}
	b.WriteString("\n")
	return b.String()
}

// grownTables are the tables the seeding fills, in the order reported.
var grownTables = []string{"notify_claim", "biz_order", "outbox", "trade_refund", "notify_review"}

// tableSizes reads the sizes of tables (default: the grown tables).
func tableSizes(ctx context.Context, db *pgxpool.Pool, tables ...string) ([]tableSize, error) {
	if len(tables) == 0 {
		tables = grownTables
	}
	var out []tableSize
	for _, t := range tables {
		s := tableSize{Table: t}
		var heap, idx int64
		if err := db.QueryRow(ctx, `SELECT reltuples::bigint, pg_table_size(oid), pg_indexes_size(oid) FROM pg_class WHERE oid = $1::regclass`, t).
			Scan(&s.Rows, &heap, &idx); err != nil {
			return nil, fmt.Errorf("size of %s: %w", t, err)
		}
		s.HeapMiB, s.IndexMiB = float64(heap)/(1<<20), float64(idx)/(1<<20)
		out = append(out, s)
	}
	return out, nil
}

// parallel runs fs on at most n goroutines, waits for all, and returns
// the first error.
func parallel(n int, fs []func() error) error {
	var g errgroup.Group
	g.SetLimit(n)
	for _, f := range fs {
		g.Go(f)
	}
	return g.Wait()
}
