package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/invariant"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// The scale-out scenario: real engines where users run them. Postgres with
// a synchronous standby, a Redis Cluster (3 masters, a replica each) for
// the cache and the stream, three edged processes, the shipper, and
// Debian's haproxy in front (health-checking /readyz, retrying a request
// only when the connection to a node failed). The driver acts as a channel:
// it retries an answer other than 200 (and a failed connection) with the
// same body until it gets 200.

// ScaleConfig configures RunScale.
type ScaleConfig struct {
	// Edged and Shipper are the built binaries (make bench-scale builds
	// them into bin/).
	Edged, Shipper string
	// Workers is the driver's concurrency (default 64); Phase the length
	// of each throughput phase (default 10s); Faults the length of the
	// fault run (default 60s).
	Workers int
	Phase   time.Duration
	Faults  time.Duration
	// Progress receives progress lines (nil: none).
	Progress io.Writer
}

// ScaleReport is the scenario's figures.
type ScaleReport struct {
	When    time.Time `json:"when"`
	Machine string    `json:"machine"`
	LoadAvg string    `json:"loadavg_before"`
	// OneNode and ThreeNodes are answers per second through haproxy, with
	// one node behind it and with three.
	OneNode, ThreeNodes float64
	// Faults are the fault run's events, in order.
	Faults []ScaleFault
	// Seconds are the fault run's per-second answers: 200s and others.
	Seconds []ScaleSecond
	// Answered is how many callbacks the fault run had answered 200 (after
	// the driver's retries), Gaveup how many it gave up on.
	Answered, Gaveup int
	// Checks are the SQL checks on the new primary afterwards.
	Checks []string
	// Durability notes what the run leaves weaker than it found.
	Durability string
}

// ScaleFault is one failure of the fault run.
type ScaleFault struct {
	What string        `json:"what"`
	At   time.Duration `json:"at"`
	// Heal is from the kill to the first second with at least 95 % of its
	// answers 200 (0: never within the run).
	Heal time.Duration `json:"heal"`
}

// ScaleSecond is one second of the fault run.
type ScaleSecond struct {
	OK, Other int
}

// scaleStack is everything RunScale started, stopped by PID in reverse.
type scaleStack struct {
	dir                string
	primary, standby   *pgtemp.Cluster
	redis              *claimcachetest.Cluster
	edges              []*scaleProc
	shipper            *scaleProc
	haproxy            *scaleProc
	one, three         string // haproxy's frontends: one node behind it, three
	dbURL, primaryURL  string
	progress           io.Writer
	edgeAddrs, admAddr []string
}

// RunScale runs the scale-out scenario on this machine's loopback.
func RunScale(ctx context.Context, cfg ScaleConfig) (*ScaleReport, error) {
	cfg.Workers = max(cfg.Workers, 64)
	if cfg.Phase <= 0 {
		cfg.Phase = 10 * time.Second
	}
	if cfg.Faults <= 0 {
		cfg.Faults = 60 * time.Second
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if _, err := exec.LookPath("haproxy"); err != nil {
		return nil, errors.New("bench: haproxy not found: install it with 'apt-get install haproxy' (make deps-haproxy)")
	}
	rep := &ScaleReport{When: time.Now().UTC(), Machine: machine(), LoadAvg: loadAvg()}
	st := &scaleStack{progress: cfg.Progress}
	defer st.close()
	if err := st.start(ctx, cfg); err != nil {
		return rep, err
	}
	tg := &Target{Secret: Secret, Channel: Channel}
	const orders = 300_000
	say(cfg.Progress, "seeding %d orders ...", orders)
	if _, err := pgtemp.SeedPending(ctx, st.primaryURL, "S-%07d", orders, 1999); err != nil {
		return rep, err
	}
	p := &pool{prefix: "S", size: orders}
	src := &dupSource{p: p, dupPct: 50}

	say(cfg.Progress, "throughput: one node behind haproxy, then three ...")
	one := driveRetrying(ctx, tg, st.one, cfg.Workers, cfg.Phase, src)
	rep.OneNode = float64(one.ok) / cfg.Phase.Seconds()
	three := driveRetrying(ctx, tg, st.three, cfg.Workers, cfg.Phase, src)
	rep.ThreeNodes = float64(three.ok) / cfg.Phase.Seconds()
	say(cfg.Progress, "  one node %.0f/s, three nodes %.0f/s", rep.OneNode, rep.ThreeNodes)

	say(cfg.Progress, "faults: %s of load through haproxy; kills at 1/6, 2/6 and 3/6 of it ...", cfg.Faults)
	start := time.Now()
	faults := []struct {
		what string
		at   time.Duration
		do   func() error
	}{
		{"edged node 2 SIGKILLed", cfg.Faults / 6, func() error { st.edges[1].kill(); return nil }},
		{"a Redis master SIGKILLed (the stream's; restarted 5 s later, it rejoins as a replica)", 2 * cfg.Faults / 6, func() error {
			m, err := st.redis.MasterOf(ctx, "notifyedge:outbox")
			if err != nil {
				return err
			}
			m.Kill()
			// With -stream-replicas 1 the promoted replica publishes
			// nothing until a replica holds its writes again: the operator
			// brings the dead node back, and it rejoins as one.
			go func() {
				wait.Sleep(ctx, 5*time.Second)
				rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				if err := m.Restart(rctx); err != nil {
					say(cfg.Progress, "  restarting the Redis node: %v", err)
				}
			}()
			return nil
		}},
		{"Postgres primary SIGKILLed, standby promoted", 3 * cfg.Faults / 6, func() error { return st.failover(ctx, rep) }},
	}
	var faultErr error
	var fw sync.WaitGroup
	fw.Add(1)
	go func() {
		defer fw.Done()
		for _, f := range faults {
			wait.Sleep(ctx, time.Until(start.Add(f.at)))
			say(cfg.Progress, "  +%s %s", time.Since(start).Round(time.Second), f.what)
			rep.Faults = append(rep.Faults, ScaleFault{What: f.what, At: time.Since(start)})
			if err := f.do(); err != nil {
				faultErr = fmt.Errorf("%s: %w", f.what, err)
				return
			}
		}
	}()
	run := driveRetrying(ctx, tg, st.three, cfg.Workers, cfg.Faults, src)
	fw.Wait()
	if faultErr != nil {
		return rep, faultErr
	}
	rep.Seconds, rep.Answered, rep.Gaveup = run.seconds, run.ok, run.gaveup
	for i := range rep.Faults {
		rep.Faults[i].Heal = healTime(run.seconds, run.start, start.Add(rep.Faults[i].At))
	}
	say(cfg.Progress, "checking by SQL on the new primary (the shipper drains first) ...")
	rep.Checks, faultErr = st.check(ctx, run.success)
	return rep, faultErr
}

// healTime is from at to the start of the first whole second (of the
// drive's seconds) with at least 95 % of its answers 200.
func healTime(secs []ScaleSecond, driveStart, at time.Time) time.Duration {
	first := int(at.Sub(driveStart) / time.Second)
	for i := max(first, 0); i < len(secs); i++ {
		s := secs[i]
		if n := s.OK + s.Other; n > 0 && float64(s.OK) >= 0.95*float64(n) && i > first {
			return driveStart.Add(time.Duration(i) * time.Second).Sub(at)
		}
	}
	return 0
}

func say(w io.Writer, format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }

// start brings the stack up.
func (st *scaleStack) start(ctx context.Context, cfg ScaleConfig) error {
	var err error
	if st.dir, err = os.MkdirTemp("", "nescale-"); err != nil {
		return err
	}
	say(st.progress, "starting Postgres with a synchronous standby, a Redis Cluster, 3 edged, the shipper, haproxy ...")
	if st.primary, err = pgtemp.Start(ctx, pgtemp.Options{TCP: true, Durable: true,
		Settings: []string{"synchronous_standby_names=*", "wal_level=replica", "max_wal_senders=4"}}); err != nil {
		return err
	}
	if st.standby, err = pgtemp.StartStandby(ctx, st.primary, pgtemp.Options{TCP: true, Durable: true}); err != nil {
		return err
	}
	st.primaryURL = pgtemp.TCPURL(st.primary.TCPAddr(), "postgres")
	// edged finds the primary among both: the one that takes writes.
	st.dbURL = "postgres://postgres@" + st.primary.TCPAddr() + "," + st.standby.TCPAddr() +
		"/postgres?sslmode=disable&target_session_attrs=read-write"
	if err := waitSync(ctx, st.primaryURL); err != nil {
		return err
	}
	if err := durable.Migrate(ctx, st.primaryURL); err != nil {
		return err
	}
	if st.redis, err = claimcachetest.StartCluster(ctx, 3, 1, time.Second); err != nil {
		return err
	}
	for i := range 3 {
		pub, adm := freeAddr(), freeAddr()
		st.edgeAddrs, st.admAddr = append(st.edgeAddrs, pub), append(st.admAddr, adm)
		p, err := st.startProc(fmt.Sprintf("edged-%d", i+1), cfg.Edged, []string{"-listen", pub, "-admin-listen", adm,
			"-drain-delay", "0s", "-stream-replicas", "1"}, []string{
			"DATABASE_URL=" + st.dbURL, "REDIS_URL=" + st.redis.URL(), "EDGE_STREAM_URL=" + st.redis.URL(),
			"EDGE_SECRET_" + strings.ToUpper(Channel) + "=" + Secret})
		if err != nil {
			return err
		}
		st.edges = append(st.edges, p)
	}
	for _, adm := range st.admAddr {
		if err := waitStatus(ctx, "http://"+adm+"/readyz", 60*time.Second); err != nil {
			return fmt.Errorf("edged at %s: %w", adm, err)
		}
	}
	if st.shipper, err = st.startProc("shipper", cfg.Shipper, nil, []string{"DATABASE_URL=" + st.dbURL, "EDGE_STREAM_URL=" + st.redis.URL()}); err != nil {
		return err
	}
	return st.startHAProxy(ctx)
}

// failover kills the primary, promotes the standby, and lets it commit
// alone: synchronous_standby_names is cleared on it (no standby is left to
// wait for), which the report names as reduced durability.
func (st *scaleStack) failover(ctx context.Context, rep *ScaleReport) error {
	st.primary.Kill()
	pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := st.standby.Promote(pctx); err != nil {
		return err
	}
	db, err := pgxpool.New(pctx, pgtemp.TCPURL(st.standby.TCPAddr(), "postgres"))
	if err != nil {
		return err
	}
	defer db.Close()
	for _, q := range []string{`ALTER SYSTEM SET synchronous_standby_names = ''`, `SELECT pg_reload_conf()`} {
		if _, err := db.Exec(pctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	rep.Durability = "after the failover the new primary runs without a standby (synchronous_standby_names cleared): " +
		"a commit is on one server's disk only until a new standby attaches"
	return nil
}

// check waits for the shipper to drain the outbox, then checks by SQL on
// the new primary.
func (st *scaleStack) check(ctx context.Context, success []string) ([]string, error) {
	url := pgtemp.TCPURL(st.standby.TCPAddr(), "postgres")
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var out []string
	deadline := time.Now().Add(5 * time.Minute)
	var paid, shipped, pending int
	for {
		if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox WHERE topic = 'ORDER_PAID'),
			(SELECT count(*) FROM shipment), (SELECT count(*) FROM outbox WHERE published_at IS NULL)`).Scan(&paid, &shipped, &pending); err != nil {
			return out, err
		}
		if shipped >= paid && pending == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	out = append(out, fmt.Sprintf("outbox ORDER_PAID rows %d, shipments %d, unpublished outbox rows %d", paid, shipped, pending))
	var errs []error
	if shipped != paid {
		errs = append(errs, fmt.Errorf("shipments %d != applied payments %d", shipped, paid))
	}
	if err := invariant.Check(ctx, db, "S-", success); err != nil {
		errs = append(errs, err)
	} else {
		out = append(out, fmt.Sprintf("invariants hold: no order moved twice, one outbox row per applied transition, all %d keys answered SUCCESS committed", len(success)))
	}
	return out, errors.Join(errs...)
}

func (st *scaleStack) close() {
	st.haproxy.kill()
	st.shipper.kill()
	for _, e := range st.edges {
		e.kill()
	}
	if st.redis != nil {
		st.redis.Stop()
	}
	if st.standby != nil {
		st.standby.Stop()
	}
	if st.primary != nil {
		st.primary.Stop()
	}
	if st.dir != "" {
		os.RemoveAll(st.dir)
	}
}

// waitSync waits until a standby streams to the primary synchronously.
func waitSync(ctx context.Context, url string) error {
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'`).Scan(&n); err == nil && n > 0 {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("no synchronous standby within 30 s")
}

// Table renders the report for a terminal and the README.
func (r *ScaleReport) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "notifyedge scale-out, %s, %s, load average before %s\n\n", r.When.Format(time.RFC3339), r.Machine, r.LoadAvg)
	fmt.Fprintf(&b, "| through haproxy | answers 200 per second |\n|---|---:|\n| one edged | %.0f |\n| three edged | %.0f |\n\n", r.OneNode, r.ThreeNodes)
	fmt.Fprintf(&b, "| failure | at | heal (to the first second with >= 95 %% of answers 200) |\n|---|---:|---:|\n")
	for _, f := range r.Faults {
		heal := "not within the run"
		if f.Heal > 0 {
			heal = f.Heal.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(&b, "| %s | +%s | %s |\n", f.What, f.At.Round(time.Second), heal)
	}
	fmt.Fprintf(&b, "\ncallbacks answered 200 (after the driver's retries): %d; given up: %d\n", r.Answered, r.Gaveup)
	var secs []string
	for i, s := range r.Seconds {
		secs = append(secs, fmt.Sprintf("%d:%d/%d", i, s.OK, s.OK+s.Other))
	}
	fmt.Fprintf(&b, "per second (200s/answers): %s\n", strings.Join(secs, " "))
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "check: %s\n", c)
	}
	if r.Durability != "" {
		fmt.Fprintf(&b, "durability: %s\n", r.Durability)
	}
	return b.String()
}
