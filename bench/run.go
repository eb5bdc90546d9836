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

	"github.com/notifyedge/notifyedge/durable/durabletest"
)

// Config configures Run.
type Config struct {
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
	Plots    []string  `json:"plots,omitempty"`
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
	say("starting Postgres (fsync on), redis-server and the edge ...")
	st, err := StartStack(ctx, StackConfig{Durable: !cfg.Quick, Budget: 2 * time.Second})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	// Enough fresh orders that no "first" attack runs out (about 30k first
	// deliveries per attack-second in all, generously).
	poolSize := max(60_000, int(cfg.Duration.Seconds()*40_000))
	say("seeding %d orders ...", poolSize)
	orders := make([]durabletest.Order, poolSize)
	for i := range orders {
		orders[i] = durabletest.Order{No: fmt.Sprintf("B-%07d", i), Status: "PENDING_PAY", Amount: 1999, Currency: "CNY"}
	}
	if err := durabletest.SeedOrders(ctx, st.DBURL, orders); err != nil {
		return nil, err
	}
	p := &pool{prefix: "B", size: int64(poolSize)}
	rep := &Report{When: time.Now().UTC(), Machine: machine(), Duration: cfg.Duration.String()}
	var rssPeak float64
	closed := func(name, url string, src source, check bool) (Row, error) {
		t := newTally()
		before := outcomes(st)
		start := time.Now()
		lat := closedLoop(ctx, url, cfg.Workers, cfg.Duration, src, t, liveLine(cfg.Progress, name, start))
		elapsed := time.Since(start)
		rssPeak = max(rssPeak, rssMiB())
		row := Row{Name: name, Driver: fmt.Sprintf("closed-loop %d", cfg.Workers), Requests: len(lat),
			ReqPerSec: float64(len(lat)) / elapsed.Seconds(), Lat: percentilesOf(lat), Errors: t.errors, Codes: t.codes,
			Outcomes: diff(outcomes(st), before)}
		if check {
			row.Check = "ok"
			if err := invariants(ctx, st, t); err != nil {
				row.Check = err.Error()
				return row, err
			}
		}
		return row, nil
	}
	rate := func(name, url string, perSec int, src source) (Row, error) {
		t := newTally()
		before := outcomes(st)
		row := openLoop(ctx, name, url, perSec, cfg.Duration, src, t, cfg.Progress)
		row.Outcomes, row.Check = diff(outcomes(st), before), "ok"
		if err := invariants(ctx, st, t); err != nil {
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

	// The scenarios.
	first, err := closed("first", st.URL, &firstSource{p}, true)
	if err := add(first, err); err != nil {
		return rep, err
	}
	hot, err := closed("hotdup (cache on)", st.URL, &dupSource{p: p, dupPct: 90}, true)
	if err := add(hot, err); err != nil {
		return rep, err
	}
	if err := add(closed("hotdup (cache off)", st.URLNoCache, &dupSource{p: p, dupPct: 90}, true)); err != nil {
		return rep, err
	}
	if err := add(closed("hotdup (net/http edge)", st.URLNetHTTP, &dupSource{p: p, dupPct: 90}, true)); err != nil {
		return rep, err
	}
	if err := add(closed("storm (64 copies a key)", st.URL, &stormSource{p: p, copies: 64}, true)); err != nil {
		return rep, err
	}
	if err := add(rate("first at 80% of peak", st.URL, max(int(first.ReqPerSec*0.8), 10), &firstSource{p})); err != nil {
		return rep, err
	}
	if err := add(rate("hotdup at 50% of peak", st.URL, max(int(hot.ReqPerSec*0.5), 10), &dupSource{p: p, dupPct: 90})); err != nil {
		return rep, err
	}
	if err := add(rate("retry-schedule (x100)", st.URL, max(int(first.ReqPerSec*0.3), 10), newRetrySource(p, 100))); err != nil {
		return rep, err
	}
	// Redis stopped halfway through a hot-duplicate load.
	go func() {
		time.Sleep(cfg.Duration / 2)
		st.Redis.Kill()
	}()
	down, err := closed("redis-down (killed at 1/2)", st.URL, &dupSource{p: p, dupPct: 90}, true)
	if err := add(down, err); err != nil {
		return rep, err
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err = st.Redis.Restart(rctx)
	cancel()
	if err != nil {
		return rep, err
	}

	// The ceilings, same driver and concurrency.
	noop, err := serveFast(func(c *fasthttp.RequestCtx) { c.SetStatusCode(200); c.SetBodyString(`{"code":"SUCCESS"}`) })
	if err != nil {
		return rep, err
	}
	defer noop.Close()
	add(closed("ceiling: no-op fasthttp", "http://"+noop.Addr().String(), &firstSource{&pool{prefix: "N", size: 1 << 40}}, false))
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
	add(rawPgx(ctx, st, cfg, p, say))
	add(vegetaCeiling(ctx, "http://"+noop.Addr().String(), cfg.Workers, cfg.Duration, cfg.Progress))
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
func openLoop(ctx context.Context, name, base string, perSec int, d time.Duration, src source, t *tally, progress io.Writer) Row {
	return openLoopWorkers(ctx, name, base, perSec, 512, d, src, t, progress)
}

func openLoopWorkers(ctx context.Context, name, base string, perSec, maxWorkers int, d time.Duration, src source, t *tally, progress io.Writer) Row {
	var byID sync.Map // "?p=" index -> payment, to know each answer's key
	var seq atomic.Int64
	targeter := func(tgt *vegeta.Target) error {
		p := src.next()
		body := p.body()
		id, ts, sig := signedHeaders(idSeq.Add(1), body)
		n := seq.Add(1)
		byID.Store(n, p)
		tgt.Method, tgt.Body = http.MethodPost, body
		tgt.URL = base + "/notify/" + Channel + "?p=" + fmt.Sprint(n)
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
func vegetaCeiling(ctx context.Context, base string, workers int, d time.Duration, progress io.Writer) (Row, error) {
	t := newTally()
	row := openLoopWorkers(ctx, "ceiling: vegeta vs no-op", base, 0, workers, d, &firstSource{&pool{prefix: "V", size: 1 << 40}}, t, progress)
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

// invariants checks by SQL what must hold whatever the load did: no order
// moved twice, one outbox row per applied transition, every SUCCESS answered
// has a DONE claim.
func invariants(ctx context.Context, st *Stack, t *tally) error {
	var twice, outbox, applied int
	err := st.DB.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM (SELECT order_no FROM outbox WHERE topic = 'ORDER_PAID' GROUP BY order_no HAVING count(*) > 1) x),
		(SELECT count(*) FROM outbox WHERE topic = 'ORDER_PAID'),
		(SELECT count(*) FROM notify_claim WHERE claim_state = 'DONE' AND result_json LIKE '%"outcome":"applied"%')`).Scan(&twice, &outbox, &applied)
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
	if err := st.DB.QueryRow(ctx, `SELECT count(*) FROM notify_claim WHERE claim_state = 'DONE' AND biz_key = ANY($1)`, keys).Scan(&done); err != nil {
		return fmt.Errorf("invariants: %w", err)
	}
	if done != len(keys) {
		return fmt.Errorf("%w: %d keys answered SUCCESS, %d DONE claims for them", ErrInvariant, len(keys), done)
	}
	return nil
}

// outcomes reads notifyedge_requests_total by outcome from the edge's
// metrics.
func outcomes(st *Stack) map[string]int {
	out := map[string]int{}
	mfs, err := st.Metrics.Registry.Gather()
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
