package bench

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
)

// The soak: edged, the shipper and the forwarder as operators run them (the
// built binaries; edged's leaders run the outbox relay and retention), at
// half the closed-loop peak of first deliveries for an hour after a
// lead-in at the same rate (SoakConfig.LeadIn), over tables
// where claims and outbox rows cross the 168 h retention at the rate
// callbacks arrive, so that retention deletes as fast as callbacks insert,
// as in any week after the first. Every Sample it reads the processes'
// resident memory, the cache Redis's memory and the backlogs; every Slice
// is one open-loop attack on orders of its own, whose latency is a point
// of the series and whose answers the invariants check at the end.

// soakCheckpointTimeout is the soak's checkpoint_timeout: the server's
// default, not the grown runs' 15 minutes, so that each ten-minute window
// whose p99 the soak compares holds two whole checkpoint cycles. With 15,
// the first ten minutes and the last fall at different points of the
// cycle, and a checkpoint's writes and the full-page images after its
// start cost the callbacks more than the minutes between checkpoints.
const soakCheckpointTimeout = 5 * time.Minute

// SoakConfig configures RunSoak.
type SoakConfig struct {
	// Edged, Shipper and Forwarder are the binaries to run.
	Edged, Shipper, Forwarder string
	// Duration is the soak's length (default 1h), Slice one attack's
	// (default 1m), Sample how often memory and backlogs are read
	// (default 10s), Warmup after which resident memory must stay flat
	// (default 10m).
	Duration, Slice, Sample, Warmup time.Duration
	// LeadIn is the soak's rate run before Duration begins and outside its
	// figures (default two checkpoint cycles, 10m; negative: none), so
	// that the hour begins as it goes on: checkpoints on their timeout's
	// cycle, the first one after the seeding's behind it, retention
	// deleting.
	LeadIn time.Duration
	// Share is the rate as a share of the closed-loop peak (default 0.5);
	// Workers the closed-loop concurrency that measures it (default 64).
	Share   float64
	Workers int
	// TableOptions, if set, are storage parameters set on the tables
	// retention deletes from (notify_claim and outbox), as an operator
	// sets autovacuum for them (BloatVariants); none leaves the server's
	// defaults.
	TableOptions string
	// Quick is the smoke test's soak: seconds long, a small window seeded.
	Quick bool
	// Out, if set, receives the report's JSON and plots.
	Out      string
	Progress io.Writer
}

// SoakReport is what RunSoak measured.
type SoakReport struct {
	When time.Time `json:"when"`
	// TableOptions are SoakConfig's, set on the tables.
	TableOptions string `json:"table_options,omitempty"`
	// Checkpoints are the server's checkpoint settings, as it reports
	// them (SHOW).
	Checkpoints   map[string]string `json:"checkpoint_settings"`
	Machine       string            `json:"machine"`
	LoadAvgBefore string            `json:"loadavg_before"`
	LoadAvgAfter  string            `json:"loadavg_after"`
	// Peak is the closed-loop req/s of first deliveries, Rate the soak's.
	Peak float64 `json:"peak_req_per_sec"`
	Rate int     `json:"rate"`
	// LeadIn is the lead-in's length, seconds, LeadInP99 its p99, ms, and
	// LeadInNon200 its answers other than 200: run before the soak's time
	// 0, in none of its other figures.
	LeadIn       float64 `json:"lead_in_s"`
	LeadInP99    float64 `json:"lead_in_p99_ms"`
	LeadInNon200 int     `json:"lead_in_non_200"`
	// Seeded are the rows seeded to cross the retention during the soak.
	Seeded      map[string]int64   `json:"seeded_rows"`
	SeedSeconds map[string]float64 `json:"seed_seconds"`
	Slices      []SoakSlice        `json:"slices"`
	Samples     []SoakSample       `json:"samples"`
	// P99First and P99Last are the p99 of every request in the first and
	// in the last P99Minutes of the soak (a tenth of a soak shorter than
	// half an hour); P99Ratio Last over First (target at most 1.2).
	P99Minutes float64 `json:"p99_window_minutes"`
	P99First   float64 `json:"p99_first_ms"`
	P99Last    float64 `json:"p99_last_ms"`
	P99Ratio   float64 `json:"p99_ratio"`
	// CheckpointWindows are the p99 inside each checkpoint the soak ran
	// through, for comparing like with like.
	CheckpointWindows []CheckpointWindow `json:"checkpoint_windows,omitempty"`
	// RSSGrowth is each process's resident memory at the end over its
	// memory at Warmup, each the median of a minute's samples (target at
	// most 1.10).
	RSSGrowth map[string]float64 `json:"rss_growth"`
	// CPUPerRequest is each process's CPU over the soak's slices, in µs
	// per first delivery sent, and Cores the same as cores kept busy:
	// edged, the shipper, the forwarder, Postgres (its backends and
	// workers with it), the cache's and the stream's redis-server, the
	// bench (the load and the receiver) and the machine as a whole: what
	// the rate costs, and whether the machine had room for it.
	CPUPerRequest map[string]float64 `json:"cpu_us_per_request"`
	Cores         map[string]float64 `json:"cores_busy"`
	// RetentionFrom is when the oldest seeded claim crossed the retention,
	// in seconds into the soak (negative: before it, in the lead-in).
	RetentionFrom float64 `json:"retention_from_s"`
	// MaxPastRetention is, by table, the most any sample's oldest row was
	// past its retention, in seconds (notifyedge_oldest_row_age_seconds
	// less the retention): above a couple of minutes, retention fell
	// behind the callbacks.
	MaxPastRetention map[string]float64 `json:"max_past_retention_s"`
	// RedisPerKey is the cache Redis's used_memory growth over its key
	// count's growth during the soak.
	RedisPerKey float64 `json:"redis_bytes_per_key"`
	// Deleted are retention's deletions by table (edged's counter).
	Deleted map[string]float64 `json:"retention_deleted"`
	// Forwarded is how many events the receiver took (2xx), Published
	// how many outbox rows the soak's payments wrote.
	Forwarded int64 `json:"forwarded"`
	Published int64 `json:"published"`
	// Events are the checkpoints and the autovacuum runs of retention's
	// tables the Postgres log reports, with their time into the soak;
	// CallbackLockWaits the log's lock waits over 50 ms by callback
	// sessions for any lock but a table's extension (any fails the soak),
	// CallbackExtensionWaits theirs for a table's extension lock
	// (reported), OtherLockWaits everyone else's.
	Events                 []string `json:"postgres_events,omitempty"`
	CallbackLockWaits      []string `json:"callback_lock_waits,omitempty"`
	CallbackExtensionWaits []string `json:"callback_extension_waits,omitempty"`
	OtherLockWaits         []string `json:"other_lock_waits,omitempty"`
	Checks                 []string `json:"checks"`
	Plots                  []string `json:"plots,omitempty"`
}

// SoakSlice is one attack's figures.
type SoakSlice struct {
	At        float64 `json:"at_s"`
	Requests  int     `json:"requests"`
	ReqPerSec float64 `json:"req_per_sec"`
	P50       float64 `json:"p50_ms"`
	P99       float64 `json:"p99_ms"`
	Max       float64 `json:"max_ms"`
	Non200    int     `json:"non_200"`
	// Codes counts the answers by HTTP status (0: no answer).
	Codes map[int]int `json:"codes"`
}

// SoakSample is one reading of memory and backlogs.
type SoakSample struct {
	At           float64 `json:"at_s"`
	EdgedMiB     float64 `json:"edged_rss_mib"`
	ShipperMiB   float64 `json:"shipper_rss_mib"`
	ForwarderMiB float64 `json:"forwarder_rss_mib"`
	RedisMiB     float64 `json:"redis_used_mib"`
	RedisKeys    int64   `json:"redis_keys"`
	Unpublished  int     `json:"outbox_unpublished"`
	Deleted      float64 `json:"retention_deleted"`
	// PastRetention is, by table, how far the oldest row is past its
	// retention, in seconds (negative: none is due yet).
	PastRetention map[string]float64 `json:"past_retention_s"`
	// StreamForks is the stream Redis's total_forks: one more between
	// samples is an AOF rewrite (or a save) forking meanwhile.
	StreamForks int64 `json:"stream_redis_forks"`
	// Tables are notify_claim's and outbox's heap and index sizes, MiB:
	// flat while retention deletes what callbacks insert, if vacuum keeps
	// up.
	Tables []tableSize `json:"tables"`
}

// soakStack is the soak's processes and servers.
type soakStack struct {
	procs                      scaleStack // the directory the children log into
	pg                         *pgtemp.Cluster
	cache, stream              *claimcachetest.Server
	edged, shipper, forwarder  *scaleProc
	db                         *pgxpool.Pool
	tg                         *Target
	received                   atomic.Int64
	receiver                   net.Listener
	edgedAdmin, forwarderAdmin string
	edgedBin                   string
	edgedArgs, edgedEnv        []string
}

func (c *SoakConfig) defaults() {
	if c.Quick {
		c.Duration, c.Slice, c.Sample, c.Warmup = cmp.Or(c.Duration, 6*time.Second), cmp.Or(c.Slice, 2*time.Second), cmp.Or(c.Sample, time.Second), cmp.Or(c.Warmup, 2*time.Second)
		c.LeadIn = cmp.Or(c.LeadIn, time.Second)
	}
	c.Duration, c.Slice, c.Sample, c.Warmup = cmp.Or(c.Duration, time.Hour), cmp.Or(c.Slice, time.Minute), cmp.Or(c.Sample, 10*time.Second), cmp.Or(c.Warmup, 10*time.Minute)
	c.LeadIn = cmp.Or(c.LeadIn, 2*soakCheckpointTimeout)
	c.Share, c.Workers = cmp.Or(c.Share, 0.5), cmp.Or(c.Workers, 64)
}

// RunSoak starts the stack, measures the peak, seeds the rows that will
// cross the retention, soaks, and checks by SQL.
func RunSoak(ctx context.Context, cfg SoakConfig) (*SoakReport, error) {
	cfg.defaults()
	rep := &SoakReport{When: time.Now().UTC(), TableOptions: cfg.TableOptions, Machine: machine(), LoadAvgBefore: loadAvg(),
		Seeded: map[string]int64{}, SeedSeconds: map[string]float64{}, RSSGrowth: map[string]float64{}, Deleted: map[string]float64{},
		MaxPastRetention: map[string]float64{}}
	say := func(f string, a ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, f+"\n", a...)
		}
	}
	st := &soakStack{}
	defer st.close()
	say("soak: starting Postgres (fsync on), two redis-servers, edged, the shipper, the forwarder and a receiver ...")
	if err := st.start(ctx, cfg); err != nil {
		return rep, err
	}
	rep.Checkpoints = map[string]string{}
	for _, name := range []string{"checkpoint_timeout", "max_wal_size", "checkpoint_completion_target"} {
		var v string
		if err := st.db.QueryRow(ctx, "SHOW "+name).Scan(&v); err != nil {
			return rep, fmt.Errorf("soak: SHOW %s: %w", name, err)
		}
		rep.Checkpoints[name] = v
	}
	stamp := time.Now().UTC().Format("150405")
	peakPool := &pool{prefix: "P" + stamp, size: 400_000}
	if cfg.Quick {
		peakPool.size = 20_000
	}
	if _, err := pgtemp.SeedPending(ctx, st.tg.DBURL, peakPool.prefix+"-%07d", int(peakPool.size), 1999); err != nil {
		return rep, err
	}
	peakFor := 10 * time.Second
	if cfg.Quick {
		peakFor = time.Second
	}
	lat := closedLoop(ctx, st.tg, st.tg.URL, cfg.Workers, peakFor, &firstSource{peakPool}, newTally(Channel), func(int64) {})
	rep.Peak = float64(len(lat)) / peakFor.Seconds()
	rep.Rate = max(int(rep.Peak*cfg.Share), 10)
	say("soak: peak %.0f first deliveries a second; soaking at %d a second for %s", rep.Peak, rep.Rate, cfg.Duration)

	slices := int((cfg.Duration + cfg.Slice - 1) / cfg.Slice)
	pools := make([]*pool, slices)
	perSlice := int(float64(rep.Rate)*cfg.Slice.Seconds()*1.3) + 1000
	say("soak: seeding %d orders for each of %d slices, and for the lead-in ...", perSlice, slices)
	for i := range pools {
		pools[i] = &pool{prefix: fmt.Sprintf("S%s%03d", stamp, i), size: int64(perSlice)}
		if _, err := pgtemp.SeedPending(ctx, st.tg.DBURL, pools[i].prefix+"-%07d", perSlice, 1999); err != nil {
			return rep, err
		}
	}
	leadIn := max(cfg.LeadIn, 0)
	leadPool := &pool{prefix: "L" + stamp, size: int64(float64(rep.Rate)*leadIn.Seconds()*1.3) + 1000}
	if _, err := pgtemp.SeedPending(ctx, st.tg.DBURL, leadPool.prefix+"-%07d", int(leadPool.size), 1999); err != nil {
		return rep, err
	}
	// Rows that cross the claim and outbox retention during the lead-in
	// and the soak at their rate, the first of them lead after the seeding
	// began (about the seeding's own minutes: no backlog waits at the
	// lead-in's start; the soak reports when it was), the last after the
	// soak.
	lead, tail := 3*time.Minute, 5*time.Minute
	if cfg.Quick {
		lead, tail = 0, 2*time.Second
	}
	span := leadIn + cfg.Duration + tail
	n := int64(float64(rep.Rate) * span.Seconds())
	// As many outbox rows as the hour inserts: the peak's payments tell
	// how many events a payment writes.
	var perClaim float64
	if err := st.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox)::float8 / greatest((SELECT count(*) FROM notify_claim), 1)`).Scan(&perClaim); err != nil {
		return rep, fmt.Errorf("soak: outbox rows per claim: %w", err)
	}
	plan := seedPlan{Claims: n, Outbox: int64(float64(n) * max(perClaim, 1)), Orders: 1000, Span: span, EndAgo: durable.DefaultClaimRetention - lead - span, At: time.Now()}
	if err := seedWeek(ctx, st.db, plan, rep.Seeded, rep.SeedSeconds, say); err != nil {
		return rep, err
	}
	quiet, err := quiesce(ctx, st.db, nil)
	rep.SeedSeconds["quiesce"] = quiet.Seconds()
	if err != nil {
		return rep, err
	}
	// edged's retention sleeps a minute once nothing is old enough, as it
	// found at start: restarted, its first cycle begins with the lead-in.
	if err := st.restartEdged(ctx); err != nil {
		return rep, err
	}
	// The log from here: the lead-in's checkpoints and lock waits count
	// too, at negative times.
	pgLog := filepath.Join(st.pg.Dir(), "postgres.log")
	logFrom, err := fileSize(pgLog)
	if err != nil {
		return rep, err
	}
	leadTally := newTally(Channel)
	if leadIn > 0 {
		say("soak: the lead-in, %s at %d a second ...", leadIn, rep.Rate)
		row := openLoop(ctx, st.tg, "soak lead-in", st.tg.URL, rep.Rate, leadIn, &firstSource{leadPool}, leadTally, nil)
		rep.LeadIn, rep.LeadInP99 = leadIn.Seconds(), millis(row.Lat.P99)
		rep.LeadInNon200, _ = answers(row)
		say("soak: lead-in %6.0f req/s  p50 %6.2f ms  p99 %7.2f ms  max %7.2f ms  not 200: %d",
			row.ReqPerSec, millis(row.Lat.P50), millis(row.Lat.P99), millis(row.Lat.Max), rep.LeadInNon200)
	}
	start := time.Now()
	probe := st.cpuProbe(ctx)
	cpuFrom := probe.sample()
	// The seeding's oldest claim crosses the retention lead after its At.
	rep.RetentionFrom = plan.At.Add(lead).Sub(start).Seconds()
	say("soak: the oldest seeded claim crossed the retention %.0f s into the soak", rep.RetentionFrom)
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		st.sample(sctx, start, cfg.Sample, rep)
	}()
	tallies := make([]*tally, slices)
	window := p99Window(slices, cfg.Slice)
	rep.P99Minutes = float64(window) * cfg.Slice.Minutes()
	var allLat [][]time.Duration // every slice's latencies
	for i := range slices {
		if ctx.Err() != nil {
			break
		}
		// Each slice ends on its own mark, so that the time between slices
		// does not add up and push the soak past its length.
		at := time.Since(start)
		d := min(time.Duration(i+1)*cfg.Slice, cfg.Duration) - at
		if d < cfg.Slice/10 {
			break // vegeta attacks without end for a length of 0
		}
		tallies[i] = newTally(Channel)
		row := openLoop(ctx, st.tg, "soak", st.tg.URL, rep.Rate, d, &firstSource{pools[i]}, tallies[i], nil)
		non200, codes := answers(row)
		rep.Slices = append(rep.Slices, SoakSlice{At: at.Seconds(), Requests: row.Requests, ReqPerSec: row.ReqPerSec,
			P50: millis(row.Lat.P50), P99: millis(row.Lat.P99), Max: millis(row.Lat.Max), Non200: non200, Codes: codes})
		lat := make([]time.Duration, len(row.Points))
		for j, p := range row.Points {
			lat[j] = p.Latency
		}
		allLat = append(allLat, lat)
		say("soak: %5.0f s  %6.0f req/s  p50 %6.2f ms  p99 %7.2f ms  max %7.2f ms  not 200: %d  edged %.0f MiB  redis %.0f MiB",
			at.Seconds(), row.ReqPerSec, millis(row.Lat.P50), millis(row.Lat.P99), millis(row.Lat.Max), non200, rep.last().EdgedMiB, rep.last().RedisMiB)
	}
	soakEnd := time.Since(start).Seconds()
	rep.cpu(cpuFrom, probe.sample(), soakEnd)
	stopSampling()
	<-sampled
	rep.LoadAvgAfter = loadAvg()
	err = st.finish(ctx, rep, pools, tallies)
	if leadIn > 0 {
		if ierr := invariants(ctx, st.db, leadPool.prefix, leadTally); ierr != nil {
			err = errors.Join(err, fmt.Errorf("lead-in: %w", ierr))
		}
		rep.Checks = append(rep.Checks, fmt.Sprintf("invariants checked for the lead-in's orders too (%d keys answered SUCCESS)", len(leadTally.success)))
	}
	var lerr, eerr error
	rep.CallbackLockWaits, rep.OtherLockWaits, lerr = lockWaits(pgLog, logFrom)
	rep.CallbackExtensionWaits, rep.CallbackLockWaits = byExtension(rep.CallbackLockWaits)
	rep.Events, eerr = postgresEvents(pgLog, logFrom, start)
	starts := make([]float64, len(rep.Slices))
	for i, sl := range rep.Slices {
		starts[i] = sl.At
	}
	rep.CheckpointWindows = checkpointWindows(checkpointSpans(rep.Events, soakEnd), starts, cfg.Slice, allLat)
	if len(rep.CallbackLockWaits) > 0 {
		lerr = errors.Join(lerr, fmt.Errorf("soak: %d callback lock waits over 50 ms", len(rep.CallbackLockWaits)))
	}
	err = errors.Join(err, lerr, eerr)
	pooled := func(ls [][]time.Duration) []time.Duration {
		var out []time.Duration
		for _, l := range ls {
			out = append(out, l...)
		}
		return out
	}
	rep.P99First = millis(percentilesOf(pooled(allLat[:min(window, len(allLat))])).P99)
	rep.P99Last = millis(percentilesOf(pooled(allLat[max(len(allLat)-window, 0):])).P99)
	rep.summarize(cfg)
	if cfg.Out != "" {
		if werr := writeSoak(cfg.Out, rep); werr != nil && err == nil {
			err = werr
		}
	}
	return rep, err
}

// soakSettings are the soak server's settings: the grown runs' but for the
// checkpoint_timeout (none for a quick soak), and the lock waits, the
// checkpoints and the autovacuum runs logged.
func soakSettings(quick bool) []string {
	var settings []string
	if !quick {
		for _, kv := range grownSettings {
			if !strings.HasPrefix(kv, "checkpoint_timeout=") {
				settings = append(settings, kv)
			}
		}
		settings = append(settings, fmt.Sprintf("checkpoint_timeout=%ds", int(soakCheckpointTimeout.Seconds())))
	}
	for _, kv := range lockWaitSettings {
		settings = append(settings, kv[0]+"="+kv[1])
	}
	return settings
}

// start starts the stack.
func (st *soakStack) start(ctx context.Context, cfg SoakConfig) error {
	var err error
	if st.procs.dir, err = os.MkdirTemp("", "nesoak-"); err != nil {
		return err
	}
	if st.pg, err = pgtemp.Start(ctx, pgtemp.Options{Durable: true, Settings: soakSettings(cfg.Quick)}); err != nil {
		return err
	}
	dbURL := st.pg.URL("postgres")
	if err := durable.Migrate(ctx, dbURL); err != nil {
		return err
	}
	if st.db, err = pgxpool.New(ctx, dbURL); err != nil {
		return fmt.Errorf("soak: database: %w", err)
	}
	if err := setTableOptions(ctx, st.db, cfg.TableOptions); err != nil {
		return err
	}
	if st.cache, err = claimcachetest.Start(); err != nil {
		return err
	}
	if st.stream, err = claimcachetest.Start("--appendonly", "yes"); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	st.receiver = ln
	go (&fasthttp.Server{Handler: func(c *fasthttp.RequestCtx) {
		st.received.Add(1)
		c.SetStatusCode(http.StatusNoContent)
	}}).Serve(ln)
	pub, adm, fadm := freeAddr(), freeAddr(), freeAddr()
	st.edgedAdmin, st.forwarderAdmin = "http://"+adm, "http://"+fadm
	streamURL := "redis://" + st.stream.Addr()
	// Every callback comes from the one loopback address, as from behind a
	// proxy: no per-address connection cap.
	st.edgedBin, st.edgedArgs = cfg.Edged, []string{"-listen", pub, "-admin-listen", adm, "-drain-delay", "0s", "-max-conns-per-ip", "0"}
	st.edgedEnv = []string{"DATABASE_URL=" + dbURL, "REDIS_URL=redis://" + st.cache.Addr(), "EDGE_STREAM_URL=" + streamURL,
		"EDGE_SECRET_" + strings.ToUpper(Channel) + "=" + Secret}
	if err := st.startEdged(ctx); err != nil {
		return err
	}
	if st.shipper, err = st.procs.startProc("shipper", cfg.Shipper, nil, []string{"DATABASE_URL=" + dbURL, "EDGE_STREAM_URL=" + streamURL}); err != nil {
		return err
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	if st.forwarder, err = st.procs.startProc("forwarder", cfg.Forwarder, []string{"-admin-listen", fadm}, []string{
		"EDGE_STREAM_URL=" + streamURL, "FORWARD_URL=http://" + ln.Addr().String() + "/events",
		"FORWARD_SECRET=whsec_" + base64.StdEncoding.EncodeToString(secret)}); err != nil {
		return err
	}
	if err := waitStatus(ctx, st.forwarderAdmin+"/healthz", 30*time.Second); err != nil {
		return fmt.Errorf("forwarder: %w", err)
	}
	st.tg = &Target{URL: "http://" + pub, AdminURL: st.edgedAdmin, DBURL: dbURL, Secret: Secret, Channel: Channel}
	return nil
}

// cpuProbe reads the soak's processes: the shipper in the relay's column
// (edged runs the relay here), the forwarder in its own.
func (st *soakStack) cpuProbe(ctx context.Context) *cpuProbe {
	return &cpuProbe{edge: pidOf(st.edged), relay: pidOf(st.shipper), forwarder: pidOf(st.forwarder),
		postgres: postmasterPID(ctx, st.db), redis: st.cache.Addr(), streamRedis: st.stream.Addr()}
}

// soakCPUNames names CPUCost's columns as the soak reports them, in the
// order it prints them.
var soakCPUNames = []string{"edged", "shipper", "forwarder", "postgres", "cache redis", "stream redis", "bench", "machine"}

// cpu fills CPUPerRequest and Cores from two samples secs apart, around
// the slices.
func (r *SoakReport) cpu(before, after cpuSample, secs float64) {
	requests := 0
	for _, s := range r.Slices {
		requests += s.Requests
	}
	r.CPUPerRequest, r.Cores = map[string]float64{}, map[string]float64{}
	c := cost(before, after, requests)
	for i, v := range []*float64{c.Edge, c.Relay, c.Forwarder, c.Postgres, c.Redis, c.StreamRedis, c.Driver, c.Machine} {
		if v == nil || secs <= 0 {
			continue
		}
		r.CPUPerRequest[soakCPUNames[i]], r.Cores[soakCPUNames[i]] = *v, *v*float64(requests)/1e6/secs
	}
}

// pidOf is a child's pid (0 if it never started).
func pidOf(p *scaleProc) int {
	if p == nil || p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// answers counts an attack's answers other than 200, and its answers by
// HTTP status (0: no answer).
func answers(row Row) (non200 int, codes map[int]int) {
	non200, codes = row.Errors, map[int]int{}
	for code, c := range row.Codes {
		codes[code] = c
		if code != http.StatusOK {
			non200 += c
		}
	}
	if row.Errors > 0 {
		codes[0] += row.Errors
	}
	return non200, codes
}

// startEdged starts edged and waits until it is ready.
func (st *soakStack) startEdged(ctx context.Context) error {
	var err error
	if st.edged, err = st.procs.startProc("edged", st.edgedBin, st.edgedArgs, st.edgedEnv); err != nil {
		return err
	}
	if err := waitStatus(ctx, st.edgedAdmin+"/readyz", 60*time.Second); err != nil {
		return fmt.Errorf("edged: %w", err)
	}
	return nil
}

// restartEdged kills edged (nothing is in flight) and starts it again.
func (st *soakStack) restartEdged(ctx context.Context) error {
	st.edged.kill()
	return st.startEdged(ctx)
}

// sample reads memory and backlogs every d until ctx ends.
func (st *soakStack) sample(ctx context.Context, start time.Time, d time.Duration, rep *SoakReport) {
	rdb := redis.NewClient(&redis.Options{Addr: st.cache.Addr()})
	defer rdb.Close()
	stream := redis.NewClient(&redis.Options{Addr: st.stream.Addr()})
	defer stream.Close()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		s := SoakSample{At: time.Since(start).Seconds(), EdgedMiB: pidRSS(st.edged), ShipperMiB: pidRSS(st.shipper), ForwarderMiB: pidRSS(st.forwarder)}
		if used, err := usedMemory(ctx, rdb); err == nil {
			s.RedisMiB = float64(used) / (1 << 20)
		}
		s.RedisKeys, _ = rdb.DBSize(ctx).Result()
		s.Unpublished, _ = count(ctx, st.db, `SELECT count(*) FROM outbox WHERE published_at IS NULL`)
		s.Deleted = sumMetric(st.edgedAdmin, "notifyedge_retention_deleted_total", nil)
		s.Tables, _ = tableSizes(ctx, st.db, "notify_claim", "outbox")
		s.StreamForks = redisForks(ctx, stream)
		ages := map[string]float64{}
		if sumMetric(st.edgedAdmin, "notifyedge_oldest_row_age_seconds", ages) >= 0 {
			s.PastRetention = map[string]float64{
				"notify_claim": ages["notify_claim"] - durable.DefaultClaimRetention.Seconds(),
				"outbox":       ages["outbox"] - durable.DefaultOutboxRetention.Seconds(),
			}
		}
		if ctx.Err() != nil {
			return
		}
		rep.addSample(s)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// redisForks is a Redis server's total_forks (0 if it cannot be read).
func redisForks(ctx context.Context, rdb *redis.Client) int64 {
	info, err := rdb.InfoMap(ctx, "stats").Result()
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(info["Stats"]["total_forks"], 10, 64)
	return n
}

var samplesMu sync.Mutex

func (r *SoakReport) addSample(s SoakSample) {
	samplesMu.Lock()
	defer samplesMu.Unlock()
	r.Samples = append(r.Samples, s)
}

// last is the newest sample (zero before the first).
func (r *SoakReport) last() SoakSample {
	samplesMu.Lock()
	defer samplesMu.Unlock()
	if len(r.Samples) == 0 {
		return SoakSample{}
	}
	return r.Samples[len(r.Samples)-1]
}

// pidRSS is a child's resident memory in MiB (0 once it is gone).
func pidRSS(p *scaleProc) float64 {
	pid := pidOf(p)
	if pid == 0 {
		return 0
	}
	return statusMiB(fmt.Sprintf("/proc/%d/status", pid), "VmRSS:")
}

// sumMetric sums a counter's series on a /metrics page, into byLabel by
// its "table" label when byLabel is not nil; -1 if the page is not read.
func sumMetric(admin, name string, byLabel map[string]float64) float64 {
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		total += v
		if byLabel != nil {
			byLabel[labelValue(line[:sp], "table")] += v
		}
	}
	return total
}

// finish waits for the outbox to drain and the forwarder to deliver, then
// checks every slice's orders by SQL.
func (st *soakStack) finish(ctx context.Context, rep *SoakReport, pools []*pool, tallies []*tally) error {
	sumMetric(st.edgedAdmin, "notifyedge_retention_deleted_total", rep.Deleted)
	var errs []error
	// Every outbox row but the seeded ones (published before the soak,
	// never on the stream): the peak's, the lead-in's and the slices'
	// payments.
	published, perr := count(ctx, st.db, `SELECT count(*) FROM outbox WHERE order_no NOT LIKE 'GW%'`)
	if perr != nil {
		return perr
	}
	rep.Published = int64(published)
	deadline := time.Now().Add(2 * time.Minute)
	for st.received.Load() < rep.Published && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(200 * time.Millisecond)
	}
	rep.Forwarded = st.received.Load()
	if rep.Forwarded < rep.Published {
		errs = append(errs, fmt.Errorf("%w: the receiver took %d events of the soak's %d outbox rows within 2 minutes", ErrInvariant, rep.Forwarded, rep.Published))
	}
	checked := 0
	for i, t := range tallies {
		if t == nil {
			continue
		}
		if err := invariants(ctx, st.db, pools[i].prefix, t); err != nil {
			errs = append(errs, fmt.Errorf("slice %d: %w", i, err))
		}
		checked += len(t.success)
	}
	sampled, serr := rep.checkSamples()
	errs = append(errs, serr)
	rep.Checks = append(rep.Checks, fmt.Sprintf("invariants held for the orders of %d slices (%d keys answered SUCCESS)", len(tallies), checked),
		fmt.Sprintf("the receiver took %d events for %d outbox rows", rep.Forwarded, rep.Published),
		fmt.Sprintf("the oldest row at most past the retention (s, over %d samples): claims %.0f, outbox %.0f (at most %.0f)",
			sampled, rep.MaxPastRetention["notify_claim"], rep.MaxPastRetention["outbox"], maxPastRetention.Seconds()))
	return errors.Join(errs...)
}

// checkSamples checks the samples: every process was there at each, and
// retention kept up. Retention sleeps a minute once it caught up: a row
// past its retention by more than that minute and a margin, at any
// sample while the callbacks ran, means it fell behind them. sampled is
// how many samples read the oldest rows' ages.
func (r *SoakReport) checkSamples() (sampled int, err error) {
	var errs []error
	gone := map[string]bool{}
	for _, s := range r.Samples {
		if s.PastRetention != nil {
			sampled++
		}
		for t, past := range s.PastRetention {
			if v, ok := r.MaxPastRetention[t]; !ok || past > v {
				r.MaxPastRetention[t] = past
			}
		}
		for name, rss := range map[string]float64{"edged": s.EdgedMiB, "shipper": s.ShipperMiB, "forwarder": s.ForwarderMiB} {
			if rss == 0 && !gone[name] {
				gone[name] = true
				errs = append(errs, fmt.Errorf("soak: %s was gone at %.0f s", name, s.At))
			}
		}
	}
	if sampled < (len(r.Samples)+1)/2 {
		errs = append(errs, fmt.Errorf("soak: notifyedge_oldest_row_age_seconds read at %d of %d samples", sampled, len(r.Samples)))
	}
	for _, t := range []string{"notify_claim", "outbox"} {
		if r.MaxPastRetention[t] > maxPastRetention.Seconds() {
			errs = append(errs, fmt.Errorf("soak: a %s row was %.0f s past the retention: retention fell behind", t, r.MaxPastRetention[t]))
		}
	}
	return sampled, errors.Join(errs...)
}

// maxPastRetention is how far past its retention a row may get: the
// minute retention sleeps once it caught up, and a minute's margin.
const maxPastRetention = 2 * time.Minute

// p99Window is how many slices the first and the last p99 pool: ten
// minutes' worth, or a tenth of a soak too short for three such windows.
func p99Window(slices int, slice time.Duration) int {
	w := int((10*time.Minute + slice - 1) / slice)
	if slices < 3*w {
		w = max(slices/10, 1)
	}
	return w
}

// summarize computes the report's ratios from its series.
func (r *SoakReport) summarize(cfg SoakConfig) {
	if r.P99First > 0 {
		r.P99Ratio = r.P99Last / r.P99First
	}
	// A minute's median at each end, so that one sample at a collection's
	// top or bottom does not make the ratio.
	end := 0.0
	if n := len(r.Samples); n > 0 {
		end = r.Samples[n-1].At
	}
	warmFrom := cfg.Warmup.Seconds()
	for name, rss := range map[string]func(SoakSample) float64{
		"edged":     func(s SoakSample) float64 { return s.EdgedMiB },
		"shipper":   func(s SoakSample) float64 { return s.ShipperMiB },
		"forwarder": func(s SoakSample) float64 { return s.ForwarderMiB },
	} {
		var warm, last []float64
		for _, s := range r.Samples {
			if s.At >= warmFrom && s.At < warmFrom+60 {
				warm = append(warm, rss(s))
			}
			if s.At > end-60 && s.At >= warmFrom {
				last = append(last, rss(s))
			}
		}
		if len(warm) > 0 && len(last) > 0 && median(warm) > 0 {
			r.RSSGrowth[name] = median(last) / median(warm)
		}
	}
	if n := len(r.Samples); n >= 2 && r.Samples[n-1].RedisKeys > r.Samples[0].RedisKeys {
		f, l := r.Samples[0], r.Samples[n-1]
		r.RedisPerKey = (l.RedisMiB - f.RedisMiB) * (1 << 20) / float64(l.RedisKeys-f.RedisKeys)
	}
}

// close stops what start started.
func (st *soakStack) close() {
	for _, p := range []*scaleProc{st.forwarder, st.shipper, st.edged} {
		p.kill()
	}
	if st.receiver != nil {
		st.receiver.Close()
	}
	if st.db != nil {
		st.db.Close()
	}
	for _, r := range []*claimcachetest.Server{st.cache, st.stream} {
		if r != nil {
			r.Stop()
		}
	}
	if st.pg != nil {
		st.pg.Stop()
	}
	if st.procs.dir != "" {
		os.RemoveAll(st.procs.dir)
	}
}

// writeSoak writes the report's JSON and its plots into dir.
func writeSoak(dir string, r *SoakReport) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	stamp := r.When.Format("20060102T150405Z")
	var err error
	if r.Plots, err = soakPlots(r, dir, stamp); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "soak-"+stamp+".json"), b, 0o644)
}

// Table renders the report.
func (r *SoakReport) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "notifyedge soak, %s, %s, load average before %s, after %s\n", r.When.Format(time.RFC3339), r.Machine, r.LoadAvgBefore, r.LoadAvgAfter)
	if r.TableOptions != "" {
		fmt.Fprintf(&b, "notify_claim and outbox with (%s)\n", r.TableOptions)
	}
	fmt.Fprintf(&b, "checkpoint_timeout %s, max_wal_size %s, checkpoint_completion_target %s\n",
		r.Checkpoints["checkpoint_timeout"], r.Checkpoints["max_wal_size"], r.Checkpoints["checkpoint_completion_target"])
	fmt.Fprintf(&b, "peak %.0f first deliveries a second (closed loop); soak at %d a second, after a lead-in of %.0f s at that rate (p99 %.2f ms, %d not 200)\n",
		r.Peak, r.Rate, r.LeadIn, r.LeadInP99, r.LeadInNon200)
	fmt.Fprintf(&b, "seeded to cross the retention meanwhile: %d claims, %d outbox rows (rows %.0f s, indexes %.0f s)\n",
		r.Seeded["notify_claim"], r.Seeded["outbox"], r.SeedSeconds["rows"], r.SeedSeconds["indexes"])
	fmt.Fprintf(&b, "\n| minute | req/s | p50 ms | p99 ms | max ms | not 200 |\n|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range r.Slices {
		fmt.Fprintf(&b, "| %.1f | %.0f | %.2f | %.2f | %.2f | %s |\n", s.At/60, s.ReqPerSec, s.P50, s.P99, s.Max, notOK(s))
	}
	fmt.Fprintf(&b, "\np99 of every request in the first %.1f minutes %.2f ms, in the last %.1f minutes %.2f ms: ratio %.2f (target <= 1.2: %s)\n",
		r.P99Minutes, r.P99First, r.P99Minutes, r.P99Last, r.P99Ratio, met(r.P99Ratio > 0 && r.P99Ratio <= 1.2))
	for _, w := range r.CheckpointWindows {
		fmt.Fprintf(&b, "p99 inside the checkpoint from %.0f to %.0f s (%d whole slices): %.2f ms\n", w.Start, w.End, w.Slices, w.P99)
	}
	var cpu []string
	for _, name := range soakCPUNames {
		if v, ok := r.CPUPerRequest[name]; ok {
			cpu = append(cpu, fmt.Sprintf("%s %.0f µs (%.2f cores)", name, v, r.Cores[name]))
		}
	}
	fmt.Fprintf(&b, "CPU a first delivery over the slices: %s\n", strings.Join(cpu, ", "))
	grew := true
	for _, p := range []string{"edged", "shipper", "forwarder"} {
		g, ok := r.RSSGrowth[p]
		grew = grew && ok && g <= 1.10
	}
	fmt.Fprintf(&b, "resident memory, the last minute's median over the minute's after warm-up: edged %.2f, shipper %.2f, forwarder %.2f (target <= 1.10: %s)\n",
		r.RSSGrowth["edged"], r.RSSGrowth["shipper"], r.RSSGrowth["forwarder"], met(grew))
	fmt.Fprintf(&b, "the oldest seeded claim crossed the retention %.0f s into the soak (negative: in the lead-in)\n", r.RetentionFrom)
	if n := len(r.Samples); n > 0 {
		f, l := r.Samples[0], r.Samples[n-1]
		fmt.Fprintf(&b, "resident memory MiB, first and last sample: edged %.0f -> %.0f, shipper %.0f -> %.0f, forwarder %.0f -> %.0f\n",
			f.EdgedMiB, l.EdgedMiB, f.ShipperMiB, l.ShipperMiB, f.ForwarderMiB, l.ForwarderMiB)
		fmt.Fprintf(&b, "cache Redis: %.0f -> %.0f MiB for %d -> %d keys: %.0f bytes a key added\n", f.RedisMiB, l.RedisMiB, f.RedisKeys, l.RedisKeys, r.RedisPerKey)
		fmt.Fprintf(&b, "outbox unpublished at the last sample: %d\n", l.Unpublished)
		b.WriteString(sizesTable("at the first sample", f.Tables))
		b.WriteString(sizesTable("at the last sample", l.Tables))
	}
	fmt.Fprintf(&b, "retention deleted:")
	for t, v := range r.Deleted {
		fmt.Fprintf(&b, " %s %.0f", t, v)
	}
	b.WriteString("\n")
	var forks []string
	for i := 1; i < len(r.Samples); i++ {
		if r.Samples[i].StreamForks > r.Samples[i-1].StreamForks {
			forks = append(forks, fmt.Sprintf("%.0f-%.0f s", r.Samples[i-1].At, r.Samples[i].At))
		}
	}
	fmt.Fprintf(&b, "the stream Redis forked (AOF rewrite) between: %s\n", strings.Join(forks, ", "))
	fmt.Fprintf(&b, "lock waits over 50 ms in the Postgres log: %d by callbacks, %d by callbacks extending a table, %d by others\n",
		len(r.CallbackLockWaits), len(r.CallbackExtensionWaits), len(r.OtherLockWaits))
	for _, l := range slices.Concat(r.CallbackLockWaits, r.CallbackExtensionWaits, r.OtherLockWaits) {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	for _, ev := range r.Events {
		fmt.Fprintf(&b, "postgres: %s\n", ev)
	}
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "check: %s\n", c)
	}
	return b.String()
}

// met says whether a target was met.
func met(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// notOK is a slice's answers other than 200, by status ("0" for none).
func notOK(s SoakSlice) string {
	if s.Non200 == 0 {
		return "0"
	}
	var by []string
	for code, n := range s.Codes {
		if code != http.StatusOK {
			by = append(by, fmt.Sprintf("%d: %d", code, n))
		}
	}
	sort.Strings(by)
	return fmt.Sprintf("%d (%s)", s.Non200, strings.Join(by, ", "))
}
