package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// The bloat bench: the tables retention keeps a week of (claims and the
// outbox) held at a week's rows while rows are inserted at the tail and
// retention deletes them at the head, with the server's autovacuum
// cleaning up behind it, for several weeks turned over in minutes. What it
// answers is whether the tables and their indexes stay flat once the first
// week has turned over, under which autovacuum settings.
//
// Time is compressed: a row inserted at wall time t is stamped so that it
// passes the 168 h retention at t + Week, so a week of rows turns over in
// Week of wall time. Retention runs as a node runs it (RunRetention, its
// defaults), with its Interval scaled as a minute of the simulated day;
// autovacuum_naptime is at its floor, 1 s. What is not compressed is
// autovacuum's own speed (its cost limit and delay): in a week turned
// over in minutes it has far less time per deleted row than in a real
// week, so a table flat here is flat with room in real time.

// BloatConfig configures RunBloat.
type BloatConfig struct {
	// Claims is the week of claims kept (default 1,000,000); the outbox
	// keeps bloatOutboxPerClaim of that, as a week of traffic leaves it.
	Claims int64
	// Week is the wall time a simulated week takes (default 3m30s: a day
	// every 30 s).
	Week time.Duration
	// Weeks is how many weeks are turned over after the seeded one
	// (default 2).
	Weeks int
	// Variants selects autovacuum settings by name (default all of
	// BloatVariants).
	Variants []string
	// Out is where the JSON and the plot go ("" writes none).
	Out string
	// Progress hears the bench's progress.
	Progress io.Writer
}

// bloatOutboxPerClaim is the outbox rows a week of traffic leaves per
// claim kept (the grown week's: an event per applied payment, close and
// refund, none per duplicate).
const bloatOutboxPerClaim = 0.67

// BloatVariant is one set of autovacuum settings for the two tables.
type BloatVariant struct {
	Name string `json:"name"`
	// TableOptions are storage parameters set on notify_claim and
	// outbox (ALTER TABLE ... SET (...)); none is the server's defaults.
	TableOptions string `json:"table_options,omitempty"`
}

// BloatVariants are the settings compared: the server's defaults
// (autovacuum when a fifth of a table is dead), and a vacuum for every
// 2 % of dead rows, which an operator sets on the two tables retention
// deletes from.
var BloatVariants = []BloatVariant{
	{Name: "defaults"},
	{Name: "vacuum at 2 %", TableOptions: "autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 10000"},
}

// bloatSettings are the server's settings in every variant: grownSettings'
// WAL and checkpoint room (a week of data is run with it), buffers for
// these smaller tables, and the autovacuum launcher's nap at its floor (a
// minute of the simulated day is far less).
var bloatSettings = []string{"shared_buffers=1GB", "max_wal_size=8GB", "checkpoint_timeout=15min", "autovacuum_naptime=1s"}

// bloatTables are the tables the bench measures.
var bloatTables = []string{durable.TableClaim, durable.TableOutbox}

// BloatReport is RunBloat's result.
type BloatReport struct {
	Claims      int64      `json:"claims_kept"`
	Outbox      int64      `json:"outbox_kept"`
	WeekSeconds float64    `json:"week_seconds"`
	Weeks       int        `json:"weeks"`
	Settings    []string   `json:"server_settings"`
	LoadBefore  string     `json:"load_average_before"`
	Runs        []BloatRun `json:"runs"`
	Plot        string     `json:"plot,omitempty"`
	Errors      []string   `json:"retention_errors,omitempty"`
	started     time.Time
	mu          sync.Mutex // guards Errors while retention runs
}

// BloatRun is one variant's series: the tables' sizes once a simulated
// day.
type BloatRun struct {
	Variant     BloatVariant `json:"variant"`
	SeedSeconds float64      `json:"seed_seconds"`
	Days        []BloatDay   `json:"days"`
}

// BloatDay is the tables' state at the end of a simulated day (day 0: the
// seeded week, vacuumed).
type BloatDay struct {
	Day    int              `json:"day"`
	Tables []BloatTableSize `json:"tables"`
	// WALMiB is the WAL written since the seeded week; Checkpoints how
	// many checkpoints began since (timed and requested).
	WALMiB      float64 `json:"wal_mib"`
	Checkpoints int64   `json:"checkpoints"`
}

// BloatTableSize is one table's size, its rows and its autovacuums.
type BloatTableSize struct {
	Table string `json:"table"`
	// Rows is count(*); Dead is the statistics' estimate of dead rows.
	Rows        int64              `json:"rows"`
	Dead        int64              `json:"dead_rows_estimate"`
	HeapMiB     float64            `json:"heap_mib"`
	IndexMiB    map[string]float64 `json:"index_mib"`
	Autovacuums int64              `json:"autovacuums"`
}

// indexTotal is the table's indexes' size.
func (t BloatTableSize) indexTotal() float64 {
	var s float64
	for _, v := range t.IndexMiB {
		s += v
	}
	return s
}

func (c BloatConfig) withDefaults() BloatConfig {
	if c.Claims <= 0 {
		c.Claims = 1_000_000
	}
	if c.Week <= 0 {
		c.Week = 210 * time.Second
	}
	if c.Weeks <= 0 {
		c.Weeks = 2
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c
}

// RunBloat runs each variant on a server of its own: it seeds a week of
// claims and outbox rows, starts retention, inserts at the week's rate for
// Weeks weeks, and reads the tables' sizes once a simulated day.
func RunBloat(ctx context.Context, cfg BloatConfig) (*BloatReport, error) {
	cfg = cfg.withDefaults()
	rep := &BloatReport{Claims: cfg.Claims, Outbox: int64(float64(cfg.Claims) * bloatOutboxPerClaim),
		WeekSeconds: cfg.Week.Seconds(), Weeks: cfg.Weeks, Settings: bloatSettings, LoadBefore: loadAvg(), started: time.Now()}
	for _, v := range BloatVariants {
		if len(cfg.Variants) > 0 && !slices.Contains(cfg.Variants, v.Name) {
			continue
		}
		run, err := bloatRun(ctx, cfg, rep, v)
		if run != nil {
			rep.Runs = append(rep.Runs, *run)
		}
		if err != nil {
			return rep, fmt.Errorf("bloat: %s: %w", v.Name, err)
		}
	}
	if cfg.Out != "" {
		if err := rep.write(cfg.Out); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// bloatRun is one variant on a server of its own.
func bloatRun(ctx context.Context, cfg BloatConfig, rep *BloatReport, v BloatVariant) (*BloatRun, error) {
	say := func(format string, args ...any) {
		fmt.Fprintf(cfg.Progress, "bloat: %s: "+format+"\n", append([]any{v.Name}, args...)...)
	}
	cluster, err := pgtemp.Start(ctx, pgtemp.Options{Settings: bloatSettings})
	if err != nil {
		return nil, err
	}
	defer cluster.Stop()
	url := cluster.URL("postgres")
	store, err := durable.New(ctx, durable.Config{URL: url})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	if err := setTableOptions(ctx, db, v.TableOptions); err != nil {
		return nil, err
	}
	run := &BloatRun{Variant: v}
	// A row g (0 the oldest seeded) is stamped start - 168 h + g*Week/n:
	// the seeded week's rows pass the retention during the first Week,
	// oldest first, and row n+g, inserted g*Week/n after start, one Week
	// after its insert.
	start := time.Now()
	plan := seedPlan{Claims: cfg.Claims, Orders: max(cfg.Claims/4, 1), Outbox: rep.Outbox,
		Span: cfg.Week, EndAgo: durable.DefaultClaimRetention - cfg.Week, At: start}
	say("seeding a week: %d claims, %d outbox rows ...", plan.Claims, plan.Outbox)
	if err := seedWeek(ctx, db, plan, map[string]int64{}, map[string]float64{}, func(string, ...any) {}); err != nil {
		return run, err
	}
	run.SeedSeconds = time.Since(start).Seconds()
	wal0, ckpt0, err := bloatCounters(ctx, db)
	if err != nil {
		return run, err
	}
	day0, err := bloatDay(ctx, db, 0, wal0, ckpt0)
	if err != nil {
		return run, err
	}
	run.Days = append(run.Days, day0)
	say("seeded in %.0f s: %s", run.SeedSeconds, day0.line())
	// Retention as a node runs it; a minute of the simulated day between
	// its cycles.
	rctx, stopRetention := context.WithCancel(ctx)
	retained := make(chan struct{})
	go func() {
		defer close(retained)
		store.RunRetention(rctx, durable.RetentionConfig{Interval: max(cfg.Week/7/1440, 20*time.Millisecond),
			OnError: func(err error) {
				rep.mu.Lock()
				rep.Errors = append(rep.Errors, v.Name+": "+err.Error())
				rep.mu.Unlock()
			}})
	}()
	defer func() { stopRetention(); <-retained }()
	// The seeded rows were stamped from start on; the inserts carry on
	// from there, at the week's rate, in steps of a quarter second.
	insert := bloatInserter{db: db, plan: plan, start: start, claims: plan.Claims, outbox: plan.Outbox}
	day := cfg.Week / 7
	for d := 1; d <= 7*cfg.Weeks; d++ {
		end := start.Add(time.Duration(d) * day)
		for time.Now().Before(end) {
			if err := insert.upTo(ctx, time.Now()); err != nil {
				return run, err
			}
			if !wait.Sleep(ctx, min(250*time.Millisecond, time.Until(end))) && ctx.Err() != nil {
				return run, ctx.Err()
			}
		}
		if err := insert.upTo(ctx, end); err != nil {
			return run, err
		}
		bd, err := bloatDay(ctx, db, d, wal0, ckpt0)
		if err != nil {
			return run, err
		}
		run.Days = append(run.Days, bd)
		say("day %d: %s", d, bd.line())
	}
	return run, nil
}

// setTableOptions sets storage parameters (ALTER TABLE ... SET (opts)) on
// the tables retention deletes from, as an operator tunes their
// autovacuum; "" sets none.
func setTableOptions(ctx context.Context, db *pgxpool.Pool, opts string) error {
	if opts == "" {
		return nil
	}
	for _, t := range bloatTables {
		if _, err := db.Exec(ctx, `ALTER TABLE `+t+` SET (`+opts+`)`); err != nil {
			return fmt.Errorf("%s: table options: %w", t, err)
		}
	}
	return nil
}

// bloatCounters reads the WAL position and how many checkpoints began:
// from pg_stat_checkpointer from PostgreSQL 17 on, which took them out of
// pg_stat_bgwriter.
func bloatCounters(ctx context.Context, db *pgxpool.Pool) (wal, checkpoints int64, err error) {
	var version int
	if err := db.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		return 0, 0, fmt.Errorf("server version: %w", err)
	}
	counted := `SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`
	if version >= 170000 {
		counted = `SELECT num_timed + num_requested FROM pg_stat_checkpointer`
	}
	err = db.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::int8, (`+counted+`)`).Scan(&wal, &checkpoints)
	if err != nil {
		return 0, 0, fmt.Errorf("wal position and checkpoints: %w", err)
	}
	return wal, checkpoints, nil
}

// bloatInserter inserts claims and outbox rows at the seeded week's rate,
// numbered on from the seeded ones (the seeding's statements, one step
// at a time), and publishes the outbox rows as the relay does: inserted
// unpublished, then updated, so that each leaves a dead version behind
// (published_at is in the unpublished index's predicate: the update is
// never HOT).
type bloatInserter struct {
	db             *pgxpool.Pool
	plan           seedPlan
	start          time.Time
	claims, outbox int64 // the next row of each
}

// upTo inserts every row due by at: row n+g of a table of n a week is due
// g*Week/n after start.
func (b *bloatInserter) upTo(ctx context.Context, at time.Time) error {
	frac := at.Sub(b.start).Seconds() / b.plan.Span.Seconds()
	for _, t := range []struct {
		sql    string
		n      int64
		next   *int64
		orders int64
	}{{seedClaimsSQL, b.plan.Claims, &b.claims, b.plan.Orders}, {bloatOutboxSQL, b.plan.Outbox, &b.outbox, b.plan.Orders}} {
		due := t.n + int64(frac*float64(t.n))
		if due <= *t.next {
			continue
		}
		if _, err := b.db.Exec(ctx, t.sql, *t.next, due, t.n, b.plan.Span.Microseconds(), t.orders,
			b.plan.EndAgo.Microseconds(), b.plan.At); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		*t.next = due
	}
	if _, err := b.db.Exec(ctx, sqlBloatPublish); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	return nil
}

// bloatOutboxSQL is the seeding's outbox statement with the rows left
// unpublished.
var bloatOutboxSQL = func() string {
	const published = "o.at + interval '30 milliseconds'"
	if !strings.Contains(seedOutboxSQL, published) {
		panic("bench: the outbox seeding no longer stamps published_at as " + published)
	}
	return strings.Replace(seedOutboxSQL, published, "NULL::timestamptz", 1)
}()

// sqlBloatPublish publishes what bloatOutboxSQL inserted, 30 ms after its
// creation as the seeded rows were, by the relay's index.
const sqlBloatPublish = `UPDATE outbox SET published_at = created_at + interval '30 milliseconds' WHERE published_at IS NULL`

// bloatDay reads the tables' sizes, rows and autovacuums.
func bloatDay(ctx context.Context, db *pgxpool.Pool, day int, wal0, ckpt0 int64) (BloatDay, error) {
	d := BloatDay{Day: day}
	wal, ckpt, err := bloatCounters(ctx, db)
	if err != nil {
		return d, err
	}
	d.WALMiB, d.Checkpoints = float64(wal-wal0)/(1<<20), ckpt-ckpt0
	for _, t := range bloatTables {
		s := BloatTableSize{Table: t, IndexMiB: map[string]float64{}}
		var heap int64
		if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+t+`), n_dead_tup, pg_table_size(relid), autovacuum_count
  FROM pg_stat_user_tables WHERE relid = $1::regclass`, t).Scan(&s.Rows, &s.Dead, &heap, &s.Autovacuums); err != nil {
			return d, fmt.Errorf("size of %s: %w", t, err)
		}
		s.HeapMiB = float64(heap) / (1 << 20)
		rows, err := db.Query(ctx, `SELECT indexrelname::text, pg_relation_size(indexrelid) FROM pg_stat_user_indexes WHERE relid = $1::regclass`, t)
		if err != nil {
			return d, fmt.Errorf("indexes of %s: %w", t, err)
		}
		for rows.Next() {
			var name string
			var size int64
			if err := rows.Scan(&name, &size); err != nil {
				rows.Close()
				return d, err
			}
			s.IndexMiB[name] = float64(size) / (1 << 20)
		}
		if err := rows.Err(); err != nil {
			return d, err
		}
		d.Tables = append(d.Tables, s)
	}
	return d, nil
}

// line is the day in one line of progress.
func (d BloatDay) line() string {
	var parts []string
	for _, t := range d.Tables {
		parts = append(parts, fmt.Sprintf("%s %d rows, %d dead, heap %.0f MiB, indexes %.0f MiB, %d autovacuums",
			t.Table, t.Rows, t.Dead, t.HeapMiB, t.indexTotal(), t.Autovacuums))
	}
	return strings.Join(parts, "; ")
}

// Table renders the report: per variant, each table's heap and indexes
// on the seeded day and at the end of each week, and the growth over the
// last week.
func (r *BloatReport) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nBloat: %d claims and %d outbox rows kept, a week turned over every %.0f s, %d weeks; settings %s; load average before %s\n",
		r.Claims, r.Outbox, r.WeekSeconds, r.Weeks, strings.Join(r.Settings, ", "), r.LoadBefore)
	for _, run := range r.Runs {
		fmt.Fprintf(&b, "\n%s", run.Variant.Name)
		if run.Variant.TableOptions != "" {
			fmt.Fprintf(&b, " (%s)", run.Variant.TableOptions)
		}
		fmt.Fprintf(&b, ", seeded in %.0f s\n\n", run.SeedSeconds)
		b.WriteString("| day | table | rows | dead rows (estimate) | heap MiB | indexes MiB | autovacuums | WAL MiB | checkpoints |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, d := range run.Days {
			if d.Day%7 != 0 {
				continue
			}
			for _, t := range d.Tables {
				fmt.Fprintf(&b, "| %d | %s | %d | %d | %.0f | %.0f | %d | %.0f | %d |\n",
					d.Day, t.Table, t.Rows, t.Dead, t.HeapMiB, t.indexTotal(), t.Autovacuums, d.WALMiB, d.Checkpoints)
			}
		}
		if g := run.lastWeekGrowth(); g != "" {
			b.WriteString("\nover the last week: " + g + "\n")
		}
	}
	if len(r.Errors) > 0 {
		fmt.Fprintf(&b, "\nretention recovered from %d errors; the first: %s\n", len(r.Errors), r.Errors[0])
	}
	if r.Plot != "" {
		fmt.Fprintf(&b, "\nplot: %s\n", r.Plot)
	}
	return b.String()
}

// lastWeekGrowth is each table's heap and indexes at the end against a
// week before, as ratios.
func (run BloatRun) lastWeekGrowth() string {
	if len(run.Days) < 8 {
		return ""
	}
	last, before := run.Days[len(run.Days)-1], run.Days[len(run.Days)-8]
	var parts []string
	for i, t := range last.Tables {
		p := before.Tables[i]
		parts = append(parts, fmt.Sprintf("%s heap %.2f×, indexes %.2f×", t.Table, t.HeapMiB/p.HeapMiB, t.indexTotal()/p.indexTotal()))
	}
	return strings.Join(parts, "; ")
}

// write saves the report as JSON and its plot in dir.
func (r *BloatReport) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	stamp := r.started.UTC().Format("20060102T150405Z")
	path := filepath.Join(dir, "bloat-"+stamp+".png")
	if err := r.plot(path); err != nil {
		return err
	}
	r.Plot = path
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "bloat-"+stamp+".json"), b, 0o644)
}

// plot draws each variant's tables' heap plus indexes by simulated day.
func (r *BloatReport) plot(path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Heap and indexes, %d claims and %d outbox rows kept, by simulated day", r.Claims, r.Outbox)
	p.X.Label.Text = "simulated day (day 0: the seeded week)"
	p.Y.Label.Text = "MiB"
	p.Legend.Top = true
	i := 0
	for _, run := range r.Runs {
		for ti, table := range bloatTables {
			pts := make(plotter.XYs, len(run.Days))
			for j, d := range run.Days {
				t := d.Tables[ti]
				pts[j] = plotter.XY{X: float64(d.Day), Y: t.HeapMiB + t.indexTotal()}
			}
			if err := addLine(p, run.Variant.Name+": "+table, pts, i); err != nil {
				return err
			}
			i++
		}
	}
	if i == 0 {
		return errors.New("bloat plot: no runs")
	}
	if err := p.Save(10*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("bloat plot: %w", err)
	}
	return nil
}
