package bench

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
)

// A scenario is one row of the report. To add one, add a row to scenarios
// (or to ceilings): Run skips the rows this run cannot serve, reads CPU
// from /proc just before and after each attack, checks the invariants by
// SQL after every scenario (not after the ceilings), and reports.
type scenario struct {
	// name names the row; -scenario selects rows by name prefix.
	name string
	// to is what the attack goes to. The cache-off and net/http edges and
	// the SET NX GET server exist in our own stack only.
	to endpoint
	// ownStack marks a row that needs more of our own stack than its
	// endpoint (killing its Redis, raw statements on its database): it is
	// skipped against an existing deployment (-target).
	ownStack bool
	// drive is the load: closedLoopWorkers, atPeakShare(...), vegetaMax, or an
	// attack of its own (rawPgx).
	drive driver
	// source makes the attack's callbacks from the run's order pool.
	source func(*pool) source
	// setup runs before the row's fresh orders are topped up; ready after
	// them, just before the attack (what the attack's figures time starts
	// there, not before seeding that may take minutes); after just after
	// the attack, before the invariants are checked. Any may be nil.
	setup, ready, after func(ctx context.Context, e *env) error
	// orders is how many fresh orders the attack may take, once setup ran
	// (nil: a closed loop's worth for Config.Duration).
	orders func(e *env) int
}

// scenarios are the edge under load. first and hotdup (cache on) also set
// the rates of the constant-rate rows (their closed-loop req/s).
var scenarios = []scenario{
	{name: "first", to: edgeCacheOn, drive: closedLoopWorkers, source: fresh},
	{name: nameFirstAlone, to: edgeAlone, drive: closedLoopWorkers, source: fresh},
	{name: nameFirstOne, to: edgeCacheOn, drive: closedLoopOf(1), source: fresh},
	{name: nameFirstOneAlone, to: edgeAlone, drive: closedLoopOf(1), source: fresh},
	{name: "hotdup (cache on)", to: edgeCacheOn, drive: closedLoopWorkers, source: hot},
	{name: "hotdup (cache off)", to: edgeCacheOff, drive: closedLoopWorkers, source: hot},
	{name: "hotdup (net/http edge)", to: edgeNetHTTP, drive: closedLoopWorkers, source: hot},
	{name: "storm (64 copies a key)", to: edgeCacheOn, drive: closedLoopWorkers, source: storm},
	{name: "first at 80% of peak", to: edgeCacheOn, drive: atPeakShare("first", 0.8), source: fresh},
	{name: "hotdup at 50% of peak", to: edgeCacheOn, drive: atPeakShare("hotdup (cache on)", 0.5), source: hot},
	{name: "retry-schedule (x100)", to: edgeCacheOn, drive: atPeakShare("first", 0.3), source: retrySchedule},
	// Redis stopped halfway through a hot-duplicate load.
	{name: "redis-down (killed at 1/2)", to: edgeCacheOn, ownStack: true, drive: closedLoopWorkers, source: hot,
		setup: killRedisHalfway, after: restartRedis},
	// First deliveries over a backlog of 1M expired claims, then while the
	// retention loop deletes it (retention.go); ownStack: it deletes claims.
	{name: retentionBefore, to: edgeCacheOn, ownStack: true, drive: withoutRetention("first", 0.5), source: fresh,
		setup: seedExpiredClaims, ready: beginRetention, orders: ordersWithout("first", 0.5)},
	{name: retentionDuring, to: edgeCacheOn, ownStack: true, drive: untilDeleted("first", 0.5), source: fresh,
		ready: startRetention, after: finishRetention, orders: ordersUntilDeleted("first", 0.5)},
}

// ceilings are the limits the scenarios are read against: the same
// drivers and concurrency on servers that do (almost) nothing. Their
// servers run inside the bench process, so their driver CPU includes them.
var ceilings = []scenario{
	{name: "ceiling: no-op fasthttp", to: noopServer, drive: closedLoopWorkers, source: endless("N")},
	{name: "ceiling: fasthttp + SET NX GET", to: setNXServer, drive: closedLoopWorkers, source: endless("S")},
	{name: "ceiling: raw pgx pipelined", to: noEndpoint, ownStack: true, drive: rawPgx, source: fresh},
	{name: "ceiling: vegeta vs no-op", to: noopServer, drive: vegetaMax, source: endless("V")},
}

// defaultPeaks are the closed-loop req/s assumed for a constant-rate row
// whose reference scenario did not run (-scenario).
var defaultPeaks = map[string]float64{"first": 1000, "hotdup (cache on)": 2000}

// The callbacks.
var (
	// fresh: 100 % first deliveries.
	fresh = func(p *pool) source { return &firstSource{p} }
	// hot: 90 % duplicates of recent keys.
	hot = func(p *pool) source { return &dupSource{p: p, dupPct: 90} }
	// storm: 64 copies of each key in a row.
	storm = func(p *pool) source { return &stormSource{p: p, copies: 64} }
	// retrySchedule: a channel's retry schedule, compressed 100 times.
	retrySchedule = func(p *pool) source { return newRetrySource(p, 100) }
)

// endless: fresh keys of unseeded orders, for servers that look at none.
func endless(prefix string) func(*pool) source {
	return func(*pool) source { return &firstSource{&pool{prefix: prefix, size: 1 << 40}} }
}

// endpoint is what a scenario attacks.
type endpoint int

const (
	// edgeCacheOn is the edge with Redis in front: ours, or the target.
	edgeCacheOn endpoint = iota
	// edgeCacheOff is the same flow over the same Postgres, cache off.
	edgeCacheOff
	// edgeNetHTTP is the cache-on flow behind net/http.
	edgeNetHTTP
	// edgeAlone is the cache-on flow over a store without group commit.
	edgeAlone
	// noopServer answers SUCCESS and does nothing else.
	noopServer
	// setNXServer does one SET NX GET on our Redis per request.
	setNXServer
	// noEndpoint: the driver talks to Postgres itself.
	noEndpoint
)

// ownOnly reports whether only our own stack has the endpoint.
func (p endpoint) ownOnly() bool {
	return p == edgeCacheOff || p == edgeNetHTTP || p == edgeAlone || p == setNXServer
}

// A driver runs one attack of s on url and returns its row: the figures of
// the load (Driver, Requests, ReqPerSec, Lat, Errors, Codes, Points).
type driver func(ctx context.Context, e *env, s scenario, url string, t *tally) (Row, error)

// closedLoopWorkers is Config.Workers workers, each sending the next callback as
// soon as the last was answered: the peak a node sustains. It records the
// peak for the constant-rate rows.
func closedLoopWorkers(ctx context.Context, e *env, s scenario, url string, t *tally) (Row, error) {
	row, err := closedLoopOf(e.cfg.Workers)(ctx, e, s, url, t)
	e.rssPeak = max(e.rssPeak, rssMiB())
	e.peaks[s.name] = row.ReqPerSec
	return row, err
}

// closedLoopOf is closedLoopWorkers with n workers: at 1, no concurrency,
// the latency a lone delivery sees.
func closedLoopOf(n int) driver {
	return func(ctx context.Context, e *env, s scenario, url string, t *tally) (Row, error) {
		start := time.Now()
		lat := closedLoop(ctx, e.tg, url, n, e.cfg.Duration, s.source(e.pool), t, liveLine(e.cfg.Progress, s.name, start))
		elapsed := time.Since(start)
		return Row{Name: s.name, Driver: fmt.Sprintf("closed-loop %d", n), Requests: len(lat),
			ReqPerSec: float64(len(lat)) / elapsed.Seconds(), Lat: percentilesOf(lat), Errors: t.errors, Codes: t.codes}, nil
	}
}

// atPeakShare is vegeta at a constant rate: share of the named scenario's
// closed-loop req/s in this run (Config.Rate, if set, instead).
func atPeakShare(of string, share float64) driver {
	return func(ctx context.Context, e *env, s scenario, url string, t *tally) (Row, error) {
		return openLoop(ctx, e.tg, s.name, url, e.rateAt(of, share), e.cfg.Duration, s.source(e.pool), t, e.cfg.Progress), nil
	}
}

// rateAt is share of the named scenario's closed-loop req/s in this run
// (Config.Rate, if set, instead).
func (e *env) rateAt(of string, share float64) int {
	if e.cfg.Rate > 0 {
		return e.cfg.Rate
	}
	peak, ok := e.peaks[of]
	if !ok {
		peak = defaultPeaks[of]
	}
	return max(int(peak*share*e.share), 10)
}

// vegetaMax is vegeta as fast as it goes with Config.Workers workers: the
// generator's own limit (the figures above it are bounded by it).
func vegetaMax(ctx context.Context, e *env, s scenario, url string, t *tally) (Row, error) {
	row := openLoopWorkers(ctx, e.tg, s.name, url, 0, e.cfg.Workers, e.cfg.Duration, s.source(e.pool), t, e.cfg.Progress)
	row.Driver = fmt.Sprintf("vegeta max, %d workers", e.cfg.Workers)
	return row, nil
}

// rawPgx is the Postgres limit: the first delivery's transaction
// pipelined in one round trip, no HTTP, same concurrency.
func rawPgx(ctx context.Context, e *env, s scenario, _ string, _ *tally) (Row, error) {
	pc, err := pgxpool.ParseConfig(e.st.DBURL)
	if err != nil {
		return Row{}, fmt.Errorf("bench: raw pgx: %w", err)
	}
	pc.MaxConns, pc.MinConns = 40, 40
	db, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return Row{}, fmt.Errorf("bench: raw pgx: %w", err)
	}
	defer db.Close()
	src := s.source(e.pool)
	deadline := time.Now().Add(e.cfg.Duration)
	lat := make([][]time.Duration, e.cfg.Workers)
	var errs atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range e.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				pm := src.next()
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
	return Row{Name: s.name, Driver: fmt.Sprintf("%d goroutines", e.cfg.Workers), Requests: len(all),
		ReqPerSec: float64(len(all)) / elapsed.Seconds(), Lat: percentilesOf(all), Errors: int(errs.Load()), Codes: map[int]int{}}, nil
}

// killRedisHalfway kills our Redis halfway through the attack (a crash,
// not a shutdown).
func killRedisHalfway(ctx context.Context, e *env) error {
	go func() {
		select {
		case <-time.After(e.cfg.Duration / 2):
			e.st.Redis.Kill()
		case <-ctx.Done():
		}
	}()
	return nil
}

// restartRedis starts our Redis again, with what it had written (AOF).
func restartRedis(ctx context.Context, e *env) error {
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return e.st.Redis.Restart(rctx)
}

// url returns the base URL of endpoint p, starting a ceiling's in-process
// server on first use.
func (e *env) url(p endpoint) (string, error) {
	switch p {
	case edgeCacheOn:
		return e.tg.URL, nil
	case edgeCacheOff:
		return e.st.URLNoCache, nil
	case edgeNetHTTP:
		return e.st.URLNetHTTP, nil
	case edgeAlone:
		return e.st.URLAlone, nil
	case noEndpoint:
		return "", nil
	}
	if u, ok := e.servers[p]; ok {
		return u, nil
	}
	var h fasthttp.RequestHandler
	switch p {
	case noopServer:
		h = func(c *fasthttp.RequestCtx) { c.SetStatusCode(200); c.SetBodyString(`{"code":"SUCCESS"}`) }
	case setNXServer:
		rdb := redis.NewClient(&redis.Options{Addr: e.st.Redis.Addr(), PoolSize: 128, MaxRetries: -1})
		e.closers = append(e.closers, func() { rdb.Close() })
		h = func(c *fasthttp.RequestCtx) {
			f := fnv.New32a()
			f.Write(c.PostBody())
			v, err := rdb.SetArgs(context.Background(), fmt.Sprintf("ceil:{%d}", f.Sum32()%1000), "x", redis.SetArgs{Mode: "NX", Get: true, TTL: time.Minute}).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				c.SetStatusCode(503)
				return
			}
			c.SetStatusCode(200)
			c.SetBodyString(v)
		}
	default:
		return "", fmt.Errorf("bench: no endpoint %d", p)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("bench: ceiling server: %w", err)
	}
	go (&fasthttp.Server{Handler: h}).Serve(ln)
	e.closers = append(e.closers, func() { ln.Close() })
	u := "http://" + ln.Addr().String()
	e.servers[p] = u
	return u, nil
}
