package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable/invariant"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
)

// Target is the deployment a run attacks.
type Target struct {
	// URL is the edge's public base URL (http://host:port).
	URL string
	// AdminURL is its admin listener, for /metrics.
	AdminURL string
	// DBURL is its database: orders are seeded there under a prefix of the
	// run's own, and the invariants are checked for them.
	DBURL string
	// Secret and Channel are a generic channel configured on it.
	Secret, Channel string
}

// Config configures Run.
type Config struct {
	// Target is an existing deployment (nil: Run starts its own stack).
	// Against one, the scenarios that need our own parts (cache-off and
	// net/http twins, killing Redis, the ceilings on its database) are
	// skipped, and the CPU of parts whose process is not known here
	// (edge, Redis, relay) is not reported.
	Target *Target
	// Scenarios, if set, selects scenarios and ceilings by name prefix. An
	// empty name selects nothing: "first," is "first", not every row.
	Scenarios []string
	// Rate, if > 0, is the constant rate of the vegeta attacks instead of a
	// share of the measured peak.
	Rate int
	// Duration of each attack (default 10s; Quick: 1s).
	Duration time.Duration
	// Workers is the closed-loop concurrency (default 64).
	Workers int
	// Quick runs every scenario briefly on a small stack: the smoke test.
	Quick bool
	// JSONDir, if set, receives one JSON file per run.
	JSONDir string
	// Progress receives a live line while attacking.
	Progress io.Writer
	// Breakdown (own stack only) turns on pg_stat_statements and reports,
	// for every row, each Redis command's and Postgres statement's share
	// per answered request.
	Breakdown bool
	// StreamRedis (own stack only) puts the outbox stream on a
	// redis-server of its own: the redis column is then the claim cache's
	// alone, and the stream's is a column of its own.
	StreamRedis bool
	// Traces (own stack only) has the edge export spans over OTLP/HTTP to
	// a receiver in the bench's own process (its CPU is not the edge's),
	// sampling TraceSample (0 to 1) of the callbacks.
	Traces      bool
	TraceSample float64
}

// Row is one attack's figures.
type Row struct {
	Name      string         `json:"name"`
	Driver    string         `json:"driver"` // "closed-loop N" or "vegeta R/s"
	Requests  int            `json:"requests"`
	ReqPerSec float64        `json:"req_per_sec"`
	Lat       percentiles    `json:"latency"`
	Errors    int            `json:"errors"`
	Codes     map[int]int    `json:"codes"`
	Outcomes  map[string]int `json:"outcomes,omitempty"`
	// Group is what group commit did during the attack, from the edge's
	// notifyedge_group_* counters: "batches", and deliveries by how they
	// were decided ("batched", "alone", "busy", "retried").
	Group map[string]int `json:"group_commit,omitempty"`
	Check string         `json:"invariants"`
	// CPU is what each part spent per answered request.
	CPU CPUCost `json:"cpu_us_per_request"`
	// Breakdown is where Redis's and Postgres's time went (Config.Breakdown).
	Breakdown *Breakdown `json:"breakdown,omitempty"`
	Points    []Point    `json:"-"` // latency over time (open-loop attacks)
}

// Point is one answered request of an open-loop attack.
type Point struct {
	At      time.Duration
	Latency time.Duration
}

// Report is one run.
type Report struct {
	When     time.Time `json:"when"`
	Machine  string    `json:"machine"`
	Duration string    `json:"attack_duration"`
	// LoadAvg is /proc/loadavg's 1, 5 and 15 minute load averages before
	// the run: on a shared machine, what else was running.
	LoadAvg string  `json:"loadavg_before,omitempty"`
	Rows    []Row   `json:"rows"`
	RSSMiB  float64 `json:"bench_rss_mib_at_peak"`
	// EdgeRSSMiB is the edge process's peak resident set (our own stack
	// only).
	EdgeRSSMiB float64 `json:"edge_rss_mib_at_peak,omitempty"`
	// RedisBytesPerKey is the cache Redis's used_memory over its keys after
	// the scenarios (our own stack only).
	RedisBytesPerKey float64  `json:"redis_bytes_per_key,omitempty"`
	Plots            []string `json:"plots,omitempty"`
	// TraceSample and TraceSpans are, with Config.Traces, the sampled
	// share and the spans the receiver got.
	TraceSample *float64 `json:"trace_sample,omitempty"`
	TraceSpans  int      `json:"trace_spans,omitempty"`
	// Retention is the retention rows' figures (when they ran).
	Retention *RetentionFigures `json:"retention,omitempty"`
	// Grown is the grown rows' figures (when they ran).
	Grown *GrownFigures `json:"grown,omitempty"`
}

// ErrInvariant marks a run in which the database broke an invariant.
var ErrInvariant = errors.New("bench: invariant violated")

// env is one run's state, shared by its rows.
type env struct {
	cfg    Config
	tg     *Target
	st     *Stack // our own stack; nil against an existing deployment
	db     *pgxpool.Pool
	prefix string // of this run's orders
	pool   *pool  // this run's seeded orders
	cpu    *cpuProbe
	// share scales the constant rates: the smoke test shares the machine
	// with other tests and proves the bench works, so it runs well below
	// the peak.
	share   float64
	peaks   map[string]float64  // closed-loop req/s by scenario name
	rssPeak float64             // the bench process's, in MiB
	servers map[endpoint]string // the ceilings' in-process servers
	closers []func()
	// retention is the current pair of retention rows' shared state (nil
	// until one runs); retentions every pair that ran.
	retention  *retentionRun
	retentions []*retentionRun
	// pools counts the pools topUp added.
	pools int
	// grown is the grown rows' state (nil until they run).
	grown *grownRun
	// rep is the run's report, for a setup that runs a row it needs.
	rep *Report
	// stats reads the cache Redis's command counters (Config.Breakdown).
	stats redis.UniversalClient
}

// Run starts a stack with fsync on, runs every scenario and ceiling, checks
// the invariants by SQL after each scenario, and reports.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Duration == 0 {
		cfg.Duration = 10 * time.Second
		if cfg.Quick {
			cfg.Duration = time.Second
		}
	}
	if cfg.Workers == 0 {
		cfg.Workers = 64
	}
	rep := &Report{LoadAvg: loadAvg()}
	e := &env{cfg: cfg, tg: cfg.Target, share: 1, peaks: map[string]float64{}, servers: map[endpoint]string{}}
	if cfg.Quick {
		e.share = 0.5
	}
	defer e.close()
	if cfg.Traces && e.tg == nil {
		rcv, err := startTraceReceiver(cfg.TraceSample)
		if err != nil {
			return nil, err
		}
		defer func() {
			rep.TraceSample, rep.TraceSpans = &cfg.TraceSample, rcv.Count()
			rcv.Close()
		}()
	}
	if e.tg == nil {
		e.say("starting Postgres (fsync on), redis-server and the edge ...")
		sc := StackConfig{Durable: !cfg.Quick, Budget: 2 * time.Second, StreamRedis: cfg.StreamRedis}
		if cfg.Breakdown {
			sc.PostgresSettings = breakdownSettings
		}
		if e.optedIn(grownFirst) && !cfg.Quick {
			sc.PostgresSettings = append(sc.PostgresSettings, grownSettings...)
		}
		st, err := StartStack(ctx, sc)
		if err != nil {
			return nil, err
		}
		defer st.Close()
		e.st = st
		e.tg = &Target{URL: st.URL, AdminURL: st.AdminURL, DBURL: st.DBURL, Secret: Secret, Channel: Channel}
	}
	db, err := pgxpool.New(ctx, e.tg.DBURL)
	if err != nil {
		return nil, fmt.Errorf("bench: database: %w", err)
	}
	defer db.Close()
	e.db = db
	if cfg.Breakdown && e.st != nil {
		if _, err := db.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			return nil, fmt.Errorf("bench: breakdown: %w", err)
		}
		e.stats = redis.NewClient(&redis.Options{Addr: e.st.Redis.Addr()})
		defer e.stats.Close()
	}
	// Enough fresh orders that no "first" attack runs out (about 30k first
	// deliveries per attack-second in all, generously).
	poolSize := max(60_000, int(cfg.Duration.Seconds()*4*freshPerSecond))
	e.say("seeding %d orders ...", poolSize)
	e.prefix = "B" + time.Now().UTC().Format("150405") // a run's own orders, also on a shared database
	if _, err := pgtemp.SeedPending(ctx, e.tg.DBURL, e.prefix+"-%07d", poolSize, 1999); err != nil {
		return nil, err
	}
	e.pool = &pool{prefix: e.prefix, size: int64(poolSize)}
	e.cpu = e.probe(ctx)
	rep.When, rep.Machine, rep.Duration = time.Now().UTC(), machine(), cfg.Duration.String()

	e.rep = rep
	all := scenarios
	if e.optedIn(grownFirst) {
		all = append(all[:len(all):len(all)], grownScenarios...)
	}
	for _, s := range all {
		if err := e.attack(ctx, rep, s, true); err != nil {
			rep.Retention, rep.Grown = e.retentionFigures(rep, retentionBefore), e.grownFigures(rep) // what the retention rows found, if they failed
			return rep, err
		}
	}
	if e.st != nil {
		rdb := redis.NewClient(&redis.Options{Addr: e.st.Redis.Addr()})
		info, _ := rdb.InfoMap(ctx, "memory").Result()
		keys, _ := rdb.DBSize(ctx).Result()
		rdb.Close()
		var used float64
		fmt.Sscan(info["Memory"]["used_memory"], &used)
		if keys > 0 {
			rep.RedisBytesPerKey = used / float64(keys)
		}
	}
	for _, s := range ceilings {
		if err := e.attack(ctx, rep, s, false); err != nil {
			return rep, err
		}
	}

	rep.Retention, rep.Grown = e.retentionFigures(rep, retentionBefore), e.grownFigures(rep)
	rep.RSSMiB = e.rssPeak
	if e.st != nil {
		rep.EdgeRSSMiB = peakRSSMiB(e.st.edge.pid())
	}
	if cfg.JSONDir != "" {
		if err := writeJSON(cfg.JSONDir, rep); err != nil {
			return rep, err
		}
		if rep.Plots, err = WritePlots(rep, cfg.JSONDir); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// attack runs one row, if this run wants it and can serve it: setup, the
// top-up of fresh orders, ready, the attack between two CPU readings, after, then (scenarios only) the
// invariants by SQL; and adds the row to rep. A violation, or any answer
// but 200 to a scenario's valid callbacks, fails the run (ErrInvariant).
func (e *env) attack(ctx context.Context, rep *Report, s scenario, checked bool) error {
	if !e.wanted(s.name) || (e.st == nil && (s.ownStack || s.to.ownOnly())) {
		return nil
	}
	return e.row(ctx, rep, s, checked)
}

// row runs one row, whether or not the run selected it (attack).
func (e *env) row(ctx context.Context, rep *Report, s scenario, checked bool) error {
	url, err := e.url(s.to)
	if err != nil {
		return err
	}
	if s.setup != nil {
		if err := s.setup(ctx, e); err != nil {
			return fmt.Errorf("bench: %s: %w", s.name, err)
		}
	}
	if err := e.topUp(ctx, s); err != nil {
		return fmt.Errorf("bench: %s: %w", s.name, err)
	}
	if s.ready != nil {
		if err := s.ready(ctx, e); err != nil {
			return fmt.Errorf("bench: %s: %w", s.name, err)
		}
	}
	usedPool := e.pool
	t := newTally(e.tg.Channel)
	before := scrapeCounts(e.tg.AdminURL)
	if e.stats != nil {
		if err := resetBreakdown(ctx, e.db, e.stats); err != nil {
			return err
		}
	}
	cpu0 := e.cpu.sample()
	r, err := s.drive(ctx, e, s, url, t)
	cpu1 := e.cpu.sample()
	r.Name, r.CPU = s.name, cost(cpu0, cpu1, r.Requests)
	if e.stats != nil && err == nil {
		if r.Breakdown, err = readBreakdown(ctx, e.db, e.stats, r.Requests); err != nil {
			return err
		}
	}
	if s.after != nil {
		if aerr := s.after(ctx, e); aerr != nil && err == nil {
			err = fmt.Errorf("bench: %s: %w", s.name, aerr)
		}
	}
	if over := usedPool.next.Load() - usedPool.size; over > 0 && err == nil {
		err = fmt.Errorf("%w: %s: the fresh orders ran out: %d first deliveries repeated a key", ErrInvariant, s.name, over)
	}
	after := scrapeCounts(e.tg.AdminURL)
	r.Outcomes, r.Group = diff(after.outcomes, before.outcomes), diff(after.group, before.group)
	if checked {
		r.Check = "ok"
		if ierr := invariants(ctx, e.db, e.prefix, t); ierr != nil {
			r.Check, err = ierr.Error(), ierr
		}
	}
	if err == nil && r.Check == "ok" {
		// Every scenario's callbacks are valid: anything but 200 is a
		// failure, except in a quick run a 503. A quick run is a smoke
		// test on whatever machine runs the tests, where a busy one takes
		// a delivery past the latency budget; the edge's answer then is
		// 503 and the channel retries. What the smoke run must show holds
		// regardless: the invariants above, every other answer 200, and
		// each figure read.
		bad := r.Errors
		for code, n := range r.Codes {
			if code != http.StatusOK && !(e.cfg.Quick && code == http.StatusServiceUnavailable) {
				bad += n
			}
		}
		if bad > 0 {
			r.Check = fmt.Sprintf("FAILED: %d answers not 200", bad)
			err = fmt.Errorf("%w: %s: %d answers not 200", ErrInvariant, r.Name, bad)
			if t.firstErr != "" {
				err = fmt.Errorf("%w (%d transport errors, the first: %s)", err, r.Errors, t.firstErr)
			}
		}
	}
	rep.Rows = append(rep.Rows, r)
	if e.cfg.Progress != nil {
		fmt.Fprintf(e.cfg.Progress, "\r%-60s\r", "")
	}
	e.say("%-26s %-16s %9.0f req/s  p50 %-9v p99 %-9v %s", r.Name, r.Driver, r.ReqPerSec, r.Lat.P50.Round(time.Microsecond), r.Lat.P99.Round(time.Microsecond), r.Check)
	return err
}

// wanted reports whether -scenario selects the row named name.
func (e *env) wanted(name string) bool {
	if len(e.cfg.Scenarios) == 0 {
		return true
	}
	for _, s := range e.cfg.Scenarios {
		if s != "" && strings.HasPrefix(name, s) {
			return true
		}
	}
	return false
}

// topUp gives the run a new pool of fresh orders when the current one has
// fewer left than s may take (s.orders; by default a closed loop's worth),
// under the run's prefix (the invariants see them).
func (e *env) topUp(ctx context.Context, s scenario) error {
	need := int(e.cfg.Duration.Seconds() * freshPerSecond)
	if s.orders != nil {
		need = s.orders(e)
	}
	if e.pool.left() >= int64(need) {
		return nil
	}
	e.pools++
	p := &pool{prefix: fmt.Sprintf("%s-x%d", e.prefix, e.pools), size: int64(need)}
	e.say("seeding %d more orders ...", need)
	if _, err := pgtemp.SeedPending(ctx, e.tg.DBURL, p.prefix+"-%07d", need, 1999); err != nil {
		return err
	}
	e.pool = p
	return nil
}

// freshPerSecond is how many first deliveries a second a closed loop is
// given orders for: above any peak seen (7,000 a second), and the
// hot-duplicate rows' tenth of theirs.
const freshPerSecond = 10_000

// optedIn reports whether -scenario names an opt-in row: one a run
// without -scenario leaves out.
func (e *env) optedIn(name string) bool {
	return len(e.cfg.Scenarios) > 0 && e.wanted(name)
}

// probe finds the processes whose CPU the rows report: all of them on our
// own stack; against a deployment, Postgres only if it runs here.
func (e *env) probe(ctx context.Context) *cpuProbe {
	p := &cpuProbe{postgres: postmasterPID(ctx, e.db)}
	if e.st != nil {
		p.edge, p.relay, p.redis = e.st.edge.pid(), e.st.relay.pid(), e.st.Redis.Addr()
		if e.st.StreamRedis != nil {
			p.streamRedis = e.st.StreamRedis.Addr()
		}
		if p.postgres != 0 {
			p.db, p.edgeApp, p.shipApp, p.relayApp = e.db, edgeApplication, shipApplication, relayApplication
		}
	}
	return p
}

// say writes one progress line.
func (e *env) say(format string, args ...any) {
	if e.cfg.Progress != nil {
		fmt.Fprintf(e.cfg.Progress, format+"\n", args...)
	}
}

// close stops what the rows started, newest first.
func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// invariants checks by SQL, for this run's orders, what must hold whatever
// the load did (invariant.Check: no order moved twice, one outbox
// row per applied claim and none without one, a DONE claim for every key
// answered SUCCESS). A violation wraps ErrInvariant.
func invariants(ctx context.Context, db *pgxpool.Pool, prefix string, t *tally) error {
	keys := make([]string, 0, len(t.success))
	for k := range t.success {
		keys = append(keys, k)
	}
	err := invariant.Check(ctx, db, prefix+"-", keys)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, invariant.ErrViolated):
		return invariantError{err}
	default:
		return fmt.Errorf("bench: invariants: %w", err)
	}
}

// invariantError is a violation invariant.Check found: it is bench's
// ErrInvariant and invariant.ErrViolated, and reads without the prefix
// twice.
type invariantError struct{ err error }

func (v invariantError) Error() string {
	return ErrInvariant.Error() + ": " + strings.TrimPrefix(v.err.Error(), invariant.ErrViolated.Error()+": ")
}

func (v invariantError) Unwrap() []error { return []error{ErrInvariant, v.err} }

func writeJSON(dir string, rep *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, rep.When.Format("20060102T150405Z")+".json"), b, 0o644)
}
