package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	vegeta "github.com/tsenart/vegeta/v12/lib"
	"github.com/valyala/fasthttp"
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

	stack *Stack // our own stack: the twins, Redis and the ceilings
}

// Config configures Run.
type Config struct {
	// Target is an existing deployment (nil: Run starts its own stack).
	// Against one, the scenarios that need our own parts (cache-off and
	// net/http twins, killing Redis, the ceilings on its database) are
	// skipped.
	Target *Target
	// Scenarios, if set, selects scenarios and ceilings by name prefix.
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
	Check     string         `json:"invariants"`
	Points    []Point        `json:"-"` // latency over time (open-loop attacks)
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
	Rows     []Row     `json:"rows"`
	RSSMiB   float64   `json:"bench_rss_mib_at_peak"`
	// RedisBytesPerKey is the cache Redis's used_memory over its keys after
	// the scenarios (our own stack only).
	RedisBytesPerKey float64  `json:"redis_bytes_per_key,omitempty"`
	Plots            []string `json:"plots,omitempty"`
}

// ErrInvariant marks a run in which the database broke an invariant.
var ErrInvariant = errors.New("bench: invariant violated")

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
	say := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, format+"\n", args...)
		}
	}
	tg := cfg.Target
	var st *Stack
	if tg == nil {
		say("starting Postgres (fsync on), redis-server and the edge ...")
		var err error
		if st, err = StartStack(ctx, StackConfig{Durable: !cfg.Quick, Budget: 2 * time.Second}); err != nil {
			return nil, err
		}
		defer st.Close()
		tg = &Target{URL: st.URL, DBURL: st.DBURL, Secret: Secret, Channel: Channel, stack: st}
	}
	db, err := pgxpool.New(ctx, tg.DBURL)
	if err != nil {
		return nil, fmt.Errorf("bench: database: %w", err)
	}
	defer db.Close()
	want := func(name string) bool {
		if len(cfg.Scenarios) == 0 {
			return true
		}
		for _, s := range cfg.Scenarios {
			if strings.HasPrefix(name, s) {
				return true
			}
		}
		return false
	}
	// Enough fresh orders that no "first" attack runs out (about 30k first
	// deliveries per attack-second in all, generously).
	poolSize := max(60_000, int(cfg.Duration.Seconds()*40_000))
	say("seeding %d orders ...", poolSize)
	prefix := "B" + time.Now().UTC().Format("150405") // a run's own orders, also on a shared database
	if _, err := seedPending(ctx, tg.DBURL, prefix+"-%07d", poolSize, 1999); err != nil {
		return nil, err
	}
	p := &pool{prefix: prefix, size: int64(poolSize)}
	rep := &Report{When: time.Now().UTC(), Machine: machine(), Duration: cfg.Duration.String()}
	var rssPeak float64
	closed := func(name, url string, src source, check bool) (Row, error) {
		t := newTally(tg.Channel)
		before := outcomes(tg)
		start := time.Now()
		lat := closedLoop(ctx, tg, url, cfg.Workers, cfg.Duration, src, t, liveLine(cfg.Progress, name, start))
		elapsed := time.Since(start)
		rssPeak = max(rssPeak, rssMiB())
		row := Row{Name: name, Driver: fmt.Sprintf("closed-loop %d", cfg.Workers), Requests: len(lat),
			ReqPerSec: float64(len(lat)) / elapsed.Seconds(), Lat: percentilesOf(lat), Errors: t.errors, Codes: t.codes,
			Outcomes: diff(outcomes(tg), before)}
		if check {
			row.Check = "ok"
			if err := invariants(ctx, db, tg.Channel, prefix, t); err != nil {
				row.Check = err.Error()
				return row, err
			}
		}
		return row, nil
	}
	rate := func(name, url string, perSec int, src source) (Row, error) {
		if cfg.Rate > 0 {
			perSec = cfg.Rate
		}
		t := newTally(tg.Channel)
		before := outcomes(tg)
		row := openLoop(ctx, tg, name, url, perSec, cfg.Duration, src, t, cfg.Progress)
		row.Outcomes, row.Check = diff(outcomes(tg), before), "ok"
		if err := invariants(ctx, db, tg.Channel, prefix, t); err != nil {
			row.Check = err.Error()
			return row, err
		}
		return row, nil
	}
	add := func(r Row, err error) error {
		if err == nil && r.Check == "ok" {
			// Every scenario's callbacks are valid: anything but 200 is a failure.
			bad := r.Errors
			for code, n := range r.Codes {
				if code != http.StatusOK {
					bad += n
				}
			}
			if bad > 0 {
				r.Check = fmt.Sprintf("FAILED: %d answers not 200", bad)
				err = fmt.Errorf("%w: %s: %d answers not 200", ErrInvariant, r.Name, bad)
			}
		}
		rep.Rows = append(rep.Rows, r)
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "\r%-60s\r", "")
		}
		say("%-26s %-16s %9.0f req/s  p50 %-9v p99 %-9v %s", r.Name, r.Driver, r.ReqPerSec, r.Lat.P50.Round(time.Microsecond), r.Lat.P99.Round(time.Microsecond), r.Check)
		return err
	}

	// The scenarios. first and hotdup also set the rates of the
	// constant-rate attacks.
	var firstPeak, hotPeak float64 = 1000, 2000
	// The smoke test shares the machine with other tests: it proves the
	// bench works, so its constant-rate attacks run well below the peak.
	share := 1.0
	if cfg.Quick {
		share = 0.5
	}
	run := func(name string, own bool, f func() (Row, error)) error {
		if !want(name) || (own && st == nil) {
			return nil
		}
		return add(f())
	}
	steps := []struct {
		name string
		own  bool // needs our own stack
		f    func() (Row, error)
	}{
		{"first", false, func() (Row, error) {
			r, err := closed("first", tg.URL, &firstSource{p}, true)
			firstPeak = r.ReqPerSec
			return r, err
		}},
		{"hotdup (cache on)", false, func() (Row, error) {
			r, err := closed("hotdup (cache on)", tg.URL, &dupSource{p: p, dupPct: 90}, true)
			hotPeak = r.ReqPerSec
			return r, err
		}},
		{"hotdup (cache off)", true, func() (Row, error) {
			return closed("hotdup (cache off)", st.URLNoCache, &dupSource{p: p, dupPct: 90}, true)
		}},
		{"hotdup (net/http edge)", true, func() (Row, error) {
			return closed("hotdup (net/http edge)", st.URLNetHTTP, &dupSource{p: p, dupPct: 90}, true)
		}},
		{"storm (64 copies a key)", false, func() (Row, error) {
			return closed("storm (64 copies a key)", tg.URL, &stormSource{p: p, copies: 64}, true)
		}},
		{"first at 80% of peak", false, func() (Row, error) {
			return rate("first at 80% of peak", tg.URL, max(int(firstPeak*0.8*share), 10), &firstSource{p})
		}},
		{"hotdup at 50% of peak", false, func() (Row, error) {
			return rate("hotdup at 50% of peak", tg.URL, max(int(hotPeak*0.5*share), 10), &dupSource{p: p, dupPct: 90})
		}},
		{"retry-schedule (x100)", false, func() (Row, error) {
			return rate("retry-schedule (x100)", tg.URL, max(int(firstPeak*0.3*share), 10), newRetrySource(p, 100))
		}},
		{"redis-down (killed at 1/2)", true, func() (Row, error) {
			// Redis stopped halfway through a hot-duplicate load.
			go func() {
				time.Sleep(cfg.Duration / 2)
				st.Redis.Kill()
			}()
			r, err := closed("redis-down (killed at 1/2)", tg.URL, &dupSource{p: p, dupPct: 90}, true)
			rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			if rerr := st.Redis.Restart(rctx); rerr != nil && err == nil {
				err = rerr
			}
			return r, err
		}},
	}
	for _, step := range steps {
		if err := run(step.name, step.own, step.f); err != nil {
			return rep, err
		}
	}

	if st != nil {
		rdb := redis.NewClient(&redis.Options{Addr: st.Redis.Addr()})
		info, _ := rdb.InfoMap(ctx, "memory").Result()
		keys, _ := rdb.DBSize(ctx).Result()
		rdb.Close()
		var used float64
		fmt.Sscan(info["Memory"]["used_memory"], &used)
		if keys > 0 {
			rep.RedisBytesPerKey = used / float64(keys)
		}
	}

	// The ceilings, same driver and concurrency.
	noop, err := serveFast(func(c *fasthttp.RequestCtx) { c.SetStatusCode(200); c.SetBodyString(`{"code":"SUCCESS"}`) })
	if err != nil {
		return rep, err
	}
	defer noop.Close()
	if want("ceiling: no-op fasthttp") {
		add(closed("ceiling: no-op fasthttp", "http://"+noop.Addr().String(), &firstSource{&pool{prefix: "N", size: 1 << 40}}, false))
	}
	if st != nil && want("ceiling: fasthttp + SET NX GET") {
		rdb := redis.NewClient(&redis.Options{Addr: st.Redis.Addr(), PoolSize: 128, MaxRetries: -1})
		defer rdb.Close()
		setnx, err := serveFast(func(c *fasthttp.RequestCtx) {
			h := fnv.New32a()
			h.Write(c.PostBody())
			v, err := rdb.SetArgs(context.Background(), fmt.Sprintf("ceil:{%d}", h.Sum32()%1000), "x", redis.SetArgs{Mode: "NX", Get: true, TTL: time.Minute}).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				c.SetStatusCode(503)
				return
			}
			c.SetStatusCode(200)
			c.SetBodyString(v)
		})
		if err != nil {
			return rep, err
		}
		defer setnx.Close()
		add(closed("ceiling: fasthttp + SET NX GET", "http://"+setnx.Addr().String(), &firstSource{&pool{prefix: "S", size: 1 << 40}}, false))
	}
	if st != nil && want("ceiling: raw pgx pipelined") {
		add(rawPgx(ctx, st, cfg, p, say))
	}
	if want("ceiling: vegeta vs no-op") {
		add(vegetaCeiling(ctx, tg, "http://"+noop.Addr().String(), cfg.Workers, cfg.Duration, cfg.Progress))
	}
	rep.RSSMiB = rssPeak
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

// openLoop is vegeta's constant-rate attack: the pace does not wait for
// answers, so latency is measured without coordinated omission.
func openLoop(ctx context.Context, tg *Target, name, base string, perSec int, d time.Duration, src source, t *tally, progress io.Writer) Row {
	return openLoopWorkers(ctx, tg, name, base, perSec, 512, d, src, t, progress)
}

func openLoopWorkers(ctx context.Context, tg *Target, name, base string, perSec, maxWorkers int, d time.Duration, src source, t *tally, progress io.Writer) Row {
	var byID sync.Map // "?p=" index -> payment, to know each answer's key
	var seq atomic.Int64
	targeter := func(tgt *vegeta.Target) error {
		p := src.next()
		body := p.body()
		id, ts, sig := signedHeaders(tg.Secret, idSeq.Add(1), body)
		n := seq.Add(1)
		byID.Store(n, p)
		tgt.Method, tgt.Body = http.MethodPost, body
		tgt.URL = base + "/notify/" + tg.Channel + "?p=" + fmt.Sprint(n)
		tgt.Header = http.Header{"Content-Type": {"application/json"}, "Webhook-Id": {id}, "Webhook-Timestamp": {ts}, "Webhook-Signature": {sig}}
		return nil
	}
	// A transport of our own, closed after the attack: idle keep-alive
	// connections left behind would pile up across attacks on the edge.
	tr := &http.Transport{MaxIdleConnsPerHost: maxWorkers, MaxConnsPerHost: maxWorkers, IdleConnTimeout: 5 * time.Second}
	defer tr.CloseIdleConnections()
	attacker := vegeta.NewAttacker(vegeta.Workers(uint64(min(64, maxWorkers))), vegeta.MaxWorkers(uint64(maxWorkers)),
		vegeta.Client(&http.Client{Transport: tr, Timeout: 5 * time.Second}))
	var m vegeta.Metrics
	var points []Point
	start := time.Now()
	live := liveLine(progress, name, start)
	var n int64
	for res := range attacker.Attack(vegeta.Targeter(targeter), vegeta.Rate{Freq: perSec, Per: time.Second}, d, name) {
		m.Add(res)
		points = append(points, Point{At: res.Timestamp.Sub(start), Latency: res.Latency})
		var p payment
		if u, err := url.Parse(res.URL); err == nil {
			var k int64
			fmt.Sscan(u.Query().Get("p"), &k)
			if v, ok := byID.LoadAndDelete(k); ok {
				p = v.(payment)
			}
		}
		var err error
		if res.Error != "" {
			err = errors.New(res.Error)
		}
		t.add(p, int(res.Code), res.Body, res.Headers.Get("Idempotent-Replayed") == "true", err)
		n++
		live(n)
		if ctx.Err() != nil {
			attacker.Stop()
		}
	}
	m.Close()
	return Row{Name: name, Driver: fmt.Sprintf("vegeta %d/s", perSec), Requests: int(m.Requests), ReqPerSec: m.Throughput,
		Lat:    percentiles{m.Latencies.P50, m.Latencies.P90, m.Latencies.P99, m.Latencies.Quantile(0.999), m.Latencies.Max},
		Errors: t.errors, Codes: t.codes, Points: points}
}

// vegetaCeiling is vegeta's own limit: as fast as it can against a no-op
// server (the figures above it are bounded by this generator).
func vegetaCeiling(ctx context.Context, tg *Target, base string, workers int, d time.Duration, progress io.Writer) (Row, error) {
	t := newTally(tg.Channel)
	row := openLoopWorkers(ctx, tg, "ceiling: vegeta vs no-op", base, 0, workers, d, &firstSource{&pool{prefix: "V", size: 1 << 40}}, t, progress)
	row.Driver = fmt.Sprintf("vegeta max, %d workers", workers)
	return row, nil
}

// rawPgx is the Postgres limit: the first delivery's transaction
// pipelined in one round trip, no HTTP, same concurrency.
func rawPgx(ctx context.Context, st *Stack, cfg Config, p *pool, say func(string, ...any)) (Row, error) {
	pc, err := pgxpool.ParseConfig(st.DBURL)
	if err != nil {
		return Row{}, err
	}
	pc.MaxConns, pc.MinConns = 40, 40
	db, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return Row{}, err
	}
	defer db.Close()
	deadline := time.Now().Add(cfg.Duration)
	lat := make([][]time.Duration, cfg.Workers)
	var errs atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				pm := p.take()
				var b pgx.Batch
				b.Queue(`INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state) VALUES ($1, $2, $3, 'PENDING') ON CONFLICT (biz_key) DO NOTHING`, "raw:"+pm.txn, pm.order, strings.Repeat("0", 64))
				b.Queue(`UPDATE biz_order SET status = 'PAID', updated_at = now() WHERE order_no = $1 AND status = ANY ('{PENDING_PAY}') AND amount = 1999 AND currency = 'CNY'`, pm.order)
				b.Queue(`INSERT INTO outbox (topic, order_no, payload) VALUES ('ORDER_PAID', $1::text, jsonb_build_object('order_no', $1::text))`, pm.order)
				b.Queue(`UPDATE notify_claim SET claim_state = 'DONE', result_json = '{}' WHERE biz_key = $1`, "raw:"+pm.txn)
				t0 := time.Now()
				if err := db.SendBatch(ctx, &b).Close(); err != nil {
					errs.Add(1)
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	// The raw rows are not deliveries: remove them before the next checks.
	db.Exec(ctx, `DELETE FROM outbox WHERE order_no IN (SELECT order_no FROM notify_claim WHERE biz_key LIKE 'raw:%')`)
	db.Exec(ctx, `DELETE FROM notify_claim WHERE biz_key LIKE 'raw:%'`)
	return Row{Name: "ceiling: raw pgx pipelined", Driver: fmt.Sprintf("%d goroutines", cfg.Workers), Requests: len(all),
		ReqPerSec: float64(len(all)) / elapsed.Seconds(), Lat: percentilesOf(all), Errors: int(errs.Load()), Codes: map[int]int{}}, nil
}

func serveFast(h fasthttp.RequestHandler) (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go (&fasthttp.Server{Handler: h}).Serve(ln)
	return ln, nil
}

// invariants checks by SQL, for this run's orders, what must hold whatever
// the load did: no order moved twice, one outbox row per applied
// transition, every SUCCESS answered has a DONE claim.
func invariants(ctx context.Context, db *pgxpool.Pool, channel, prefix string, t *tally) error {
	var twice, outbox, applied int
	err := db.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM (SELECT order_no FROM outbox WHERE topic = 'ORDER_PAID' AND order_no LIKE $1 GROUP BY order_no HAVING count(*) > 1) x),
		(SELECT count(*) FROM outbox WHERE topic = 'ORDER_PAID' AND order_no LIKE $1),
		(SELECT count(*) FROM notify_claim WHERE claim_state = 'DONE' AND biz_key LIKE $2 AND result_json LIKE '%"outcome":"applied"%')`,
		prefix+"-%", channel+":TX"+prefix+"-%").Scan(&twice, &outbox, &applied)
	if err != nil {
		return fmt.Errorf("invariants: %w", err)
	}
	if twice != 0 {
		return fmt.Errorf("%w: %d orders moved twice", ErrInvariant, twice)
	}
	if outbox != applied {
		return fmt.Errorf("%w: %d ORDER_PAID outbox rows for %d applied claims", ErrInvariant, outbox, applied)
	}
	keys := make([]string, 0, len(t.success))
	for k := range t.success {
		keys = append(keys, k)
	}
	var done int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM notify_claim WHERE claim_state = 'DONE' AND biz_key = ANY($1)`, keys).Scan(&done); err != nil {
		return fmt.Errorf("invariants: %w", err)
	}
	if done != len(keys) {
		return fmt.Errorf("%w: %d keys answered SUCCESS, %d DONE claims for them", ErrInvariant, len(keys), done)
	}
	return nil
}

// outcomes reads notifyedge_requests_total by outcome: from our own edge's
// registry, or from an existing deployment's /metrics.
func outcomes(tg *Target) map[string]int {
	out := map[string]int{}
	if tg.stack == nil {
		return scrapeOutcomes(tg.AdminURL)
	}
	mfs, err := tg.stack.Metrics.Registry.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != "notifyedge_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[label(m, "outcome")] += int(m.GetCounter().GetValue())
		}
	}
	return out
}

// scrapeOutcomes parses notifyedge_requests_total lines of a /metrics page.
func scrapeOutcomes(admin string) map[string]int {
	out := map[string]int{}
	if admin == "" {
		return out
	}
	resp, err := http.Get(strings.TrimSuffix(admin, "/") + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "notifyedge_requests_total{")
		if !ok {
			continue
		}
		_, after, _ := strings.Cut(rest, `outcome="`)
		outcome, tail, _ := strings.Cut(after, `"`)
		_, value, _ := strings.Cut(tail, "} ")
		var n float64
		fmt.Sscan(value, &n)
		out[outcome] += int(n)
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func diff(after, before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// liveLine returns a progress printer for one attack: one line, rewritten
// at most four times a second.
func liveLine(w io.Writer, name string, start time.Time) func(int64) {
	var last time.Time
	var mu sync.Mutex
	return func(n int64) {
		if w == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if time.Since(last) < 250*time.Millisecond {
			return
		}
		last = time.Now()
		el := time.Since(start).Seconds()
		fmt.Fprintf(w, "\r  %-26s %5.1fs  %8d sent  %8.0f/s", name, el, n, float64(n)/max(el, 0.001))
	}
}

func rssMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb float64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb / 1024
		}
	}
	return 0
}

func machine() string {
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%d cores (%s), %s %s/%s", runtime.NumCPU(), model, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

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
