package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/durable/invariant"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// The HA scenario: a steady load of callbacks (half first deliveries, half
// re-deliveries of payments already acknowledged) through haproxy while
// four faults hit the Patroni cluster one after another, each once the
// cluster is whole again: a switchover, the leader's Patroni and Postgres
// SIGKILLed together, the etcd leader SIGKILLed, the synchronous standby's
// Postgres restarted. The driver acts as a channel: it retries anything
// but 200 with the same body a second later. Afterwards every acknowledged
// payment is delivered once more, and the database is checked by SQL.

// HAConfig configures RunHA.
type HAConfig struct {
	// Edged is the built binary (make bench-ha builds it into bin/).
	Edged string
	// Rate is callbacks a second, half of them first deliveries (default 100).
	Rate int
	// Settle is the steady load before the first fault and after each
	// fault once the cluster is whole again (default 10s).
	Settle time.Duration
	// Synchronous runs Patroni with synchronous_mode on.
	Synchronous bool
	// LeaveOnAnyOutage checks edged in haproxy as readiness worked before
	// the nodes told a shared outage from their own.
	LeaveOnAnyOutage bool
	// Keep leaves the run's directory (every process's log and
	// configuration) in place, and names it in a progress line.
	Keep bool
	// Progress receives progress lines (nil: none).
	Progress io.Writer
}

// HAReport is one run's figures.
type HAReport struct {
	When             time.Time `json:"when"`
	Machine          string    `json:"machine"`
	LoadAvg          string    `json:"loadavg_before"`
	Synchronous      bool      `json:"synchronous"`
	LeaveOnAnyOutage bool      `json:"leave_on_any_outage"`
	Rate             int       `json:"rate"`
	Faults           []HAFault `json:"faults"`
	// Redelivered is the sweep at the end: every acknowledged payment
	// delivered once more; Replayed of them answered with the stored
	// answer, AppliedAgain applied anew (their first commit was lost).
	Redelivered, Replayed, AppliedAgain int
	// LostForGood is acknowledged payments with no DONE claim after the
	// sweep (must be 0).
	LostForGood int
	// Doubled is orders with more than one ORDER_PAID outbox row.
	Doubled int
	// Checks are the SQL checks afterwards.
	Checks []string
}

// HAFault is one fault's window: from the fault to the next one (or the
// end of the load).
type HAFault struct {
	What string        `json:"what"`
	At   time.Duration `json:"at"` // since the load started
	End  time.Duration `json:"end"`
	// Acked is first deliveries answered SUCCESS in the window.
	Acked int `json:"acked"`
	// Lost is payments acknowledged before the fault (and after the one
	// before it) whose commit was not there afterwards: applied anew by a
	// re-delivery, or never.
	Lost int `json:"lost"`
	// LBRefused is haproxy's own 503s (no edged in rotation);
	// EdgeRefused edged's 503s (with Retry-After); Failed answers of any
	// other kind and failed connections.
	LBRefused, EdgeRefused, Failed int
	// ReplaysInOutage is re-deliveries answered 200 during the outage;
	// RefusedInOutage the re-deliveries refused in it.
	ReplaysInOutage, RefusedInOutage int
	// OutageAt is from the fault to the first answer that was not 200
	// (-1: none, the fault went unnoticed); Outage from that answer to the
	// first first delivery sent after it and answered 200 (-1: none
	// within the window); FullRate from the fault to the start of the
	// first whole second from which every second of the window has at
	// least 95 % of its answers 200 (-1: none).
	OutageAt, Outage, FullRate time.Duration
}

// haFault is one fault to inject: do calls mark at the fault's moment
// (the kill, the request), which starts its window.
type haFault struct {
	what string
	do   func(ctx context.Context, h *haStack, mark func()) error
}

// haFaults are the four faults in order; sync says which member the last
// restarts.
func haFaults(synchronous bool) []haFault {
	standby := "the synchronous standby's Postgres restarted"
	if !synchronous {
		standby = "a replica's Postgres restarted"
	}
	return []haFault{
		{"switchover", switchover},
		{"leader's Patroni and Postgres SIGKILLed, its WAL senders stopped 2 s before", killLeader},
		{"etcd leader SIGKILLed", killEtcdLeader},
		{standby, restartStandby},
	}
}

// RunHA runs the HA scenario on this machine's loopback.
func RunHA(ctx context.Context, cfg HAConfig) (*HAReport, error) {
	if cfg.Rate <= 0 {
		cfg.Rate = 100
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 10 * time.Second
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if err := haMissing(); err != nil {
		return nil, err
	}
	rep := &HAReport{When: time.Now().UTC(), Machine: machine(), LoadAvg: loadAvg(),
		Synchronous: cfg.Synchronous, LeaveOnAnyOutage: cfg.LeaveOnAnyOutage, Rate: cfg.Rate}
	h := &haStack{progress: cfg.Progress, keep: cfg.Keep}
	defer h.close()
	if err := h.start(ctx, cfg); err != nil {
		return rep, err
	}
	const orders = 200_000
	say(cfg.Progress, "seeding %d orders ...", orders)
	if _, err := pgtemp.SeedPending(ctx, h.dbURL, "H-%07d", orders, 1999); err != nil {
		return rep, err
	}
	tg := &Target{Secret: Secret, Channel: Channel}
	d := newHADriver(tg, "http://"+h.proxy.EdgeFront, cfg.Rate, &pool{prefix: "H", size: orders})
	load, stopLoad := context.WithCancel(ctx)
	// Retries go on after the load stops, until each is answered; a run
	// that fails stops them too, rather than wait on a broken cluster.
	retries, stopRetries := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.run(retries, load)
	}()
	defer func() { stopLoad(); stopRetries(); <-done }()

	say(cfg.Progress, "load: %d callbacks a second through haproxy, half of them re-deliveries ...", cfg.Rate)
	wait.Sleep(ctx, cfg.Settle)
	var marks []haMark
	for _, f := range haFaults(cfg.Synchronous) {
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		m := haMark{what: f.what, begin: d.since()}
		say(cfg.Progress, "  +%s %s ...", m.begin.Round(time.Second), f.what)
		m.at = m.begin
		err := f.do(ctx, h, func() { m.at = d.since() })
		marks = append(marks, m)
		if err != nil {
			return rep, fmt.Errorf("%s: %w", f.what, err)
		}
		if err := h.waitHealthy(ctx, cfg.Synchronous, 3*time.Minute); err != nil {
			return rep, fmt.Errorf("after %s: %w", f.what, err)
		}
		say(cfg.Progress, "    cluster whole again at +%s", d.since().Round(time.Second))
		wait.Sleep(ctx, cfg.Settle)
	}
	stopLoad()
	<-done
	end := d.since()

	say(cfg.Progress, "delivering every acknowledged payment once more ...")
	sweep := d.sweep(ctx, 32)
	rep.Redelivered, rep.Replayed, rep.AppliedAgain = sweep.sent, sweep.replayed, sweep.applied
	db, err := pgxpool.New(ctx, h.dbURL)
	if err != nil {
		return rep, err
	}
	defer db.Close()
	acked := d.ackedKeys()
	missing, err := missingClaims(ctx, db, acked)
	if err != nil {
		return rep, err
	}
	rep.LostForGood = len(missing)
	if err := db.QueryRow(ctx, `SELECT count(*) FROM (SELECT order_no FROM outbox
		WHERE topic = 'ORDER_PAID' AND order_no LIKE 'H-%' GROUP BY order_no HAVING count(*) > 1) d`).Scan(&rep.Doubled); err != nil {
		return rep, err
	}
	rep.Faults = d.report(marks, end)
	rep.Checks = append(rep.Checks, fmt.Sprintf("%d payments acknowledged, %d without a DONE claim after the sweep, %d orders with two ORDER_PAID rows",
		len(acked), rep.LostForGood, rep.Doubled))
	if err := invariant.Check(ctx, db, "H-", acked); err != nil {
		rep.Checks = append(rep.Checks, "invariants: "+err.Error())
		return rep, err
	}
	rep.Checks = append(rep.Checks, "invariants hold: no order moved twice, one outbox row per applied transition, every SUCCESS answered committed")
	return rep, nil
}

// haMark is when a fault was injected: begin when its procedure started
// (its window's counts start there), at its decisive moment (the kill, the
// request), which the outage and the recovery are timed from.
type haMark struct {
	what      string
	begin, at time.Duration
}

// switchover asks Patroni to hand the leader role to the synchronous
// standby (or, without one, a replica).
func switchover(ctx context.Context, h *haStack, mark func()) error {
	ms, err := h.members(ctx)
	if err != nil {
		return err
	}
	leader, candidate := leaderOf(ms), ""
	for _, m := range ms {
		if m.Name != leader && (m.Role == "sync_standby" || candidate == "" && m.Role == "replica") {
			candidate = m.Name
		}
	}
	if leader == "" || candidate == "" {
		return fmt.Errorf("no leader or candidate in %+v", ms)
	}
	mark()
	return postJSON(ctx, haActions, "http://"+h.node(leader).RestAddr+"/switchover",
		fmt.Sprintf(`{"leader":%q,"candidate":%q}`, leader, candidate), nil)
}

// haReplicaLag is how far behind the replicas are when the leader dies.
const haReplicaLag = 2 * time.Second

// killLeader SIGKILLs the leader's Patroni and Postgres, waits for another
// node to lead, and starts the old leader's Patroni again: it rejoins as
// a replica (pg_rewind where it must).
func killLeader(ctx context.Context, h *haStack, mark func()) error {
	ms, err := h.members(ctx)
	if err != nil {
		return err
	}
	old := h.node(leaderOf(ms))
	if old == nil {
		return fmt.Errorf("no leader in %+v", ms)
	}
	// The replicas fall behind first, as over a slow link: the leader's
	// WAL senders stop for 2 s. A commit the leader answered meanwhile is
	// on no replica unless one is synchronous (then the commit waits, and
	// is not answered).
	senders := childPIDs(old.postmasterPID(), "walsender")
	for _, pid := range senders {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	wait.Sleep(ctx, haReplicaLag)
	mark()
	old.killNode()
	for _, pid := range senders {
		_ = syscall.Kill(pid, syscall.SIGKILL) // stopped, they would never see their postmaster die
	}
	if err := h.waitMembers(ctx, 2*time.Minute, func(ms []haMember) bool {
		l := leaderOf(ms)
		return l != "" && l != old.Name
	}); err != nil {
		return err
	}
	return h.runPatroni(old)
}

// killEtcdLeader SIGKILLs etcd's leader and starts it again 5 s later, on
// its data.
func killEtcdLeader(ctx context.Context, h *haStack, mark func()) error {
	e, err := h.etcdLeader(ctx)
	if err != nil {
		return err
	}
	mark()
	e.proc.kill()
	wait.Sleep(ctx, 5*time.Second)
	return h.runEtcd(e)
}

// restartStandby restarts the synchronous standby's Postgres through
// Patroni (or, without one, a replica's).
func restartStandby(ctx context.Context, h *haStack, mark func()) error {
	ms, err := h.members(ctx)
	if err != nil {
		return err
	}
	name := ""
	for _, m := range ms {
		if m.Role == "sync_standby" || name == "" && m.Role == "replica" {
			name = m.Name
		}
	}
	if name == "" {
		return fmt.Errorf("no standby in %+v", ms)
	}
	mark()
	return postJSON(ctx, haActions, "http://"+h.node(name).RestAddr+"/restart", `{}`, nil)
}

// missingClaims returns the keys with no DONE claim.
func missingClaims(ctx context.Context, db *pgxpool.Pool, keys []string) ([]string, error) {
	rows, err := db.Query(ctx, `SELECT k FROM unnest($1::text[]) k
		WHERE NOT EXISTS (SELECT 1 FROM notify_claim c WHERE c.biz_key = k AND c.claim_state = 'DONE')`, keys)
	if err != nil {
		return nil, err
	}
	var out []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// Table renders the report for a terminal and the README.
func (r *HAReport) Table() string {
	var b strings.Builder
	mode := "synchronous_mode on"
	if !r.Synchronous {
		mode = "synchronous_mode off"
	}
	check := "edged checked by /readyz status (a node leaves only when it alone lost Postgres)"
	if r.LeaveOnAnyOutage {
		check = "edged checked as before: out whenever it cannot reach Postgres"
	}
	fmt.Fprintf(&b, "notifyedge on Patroni, %s; %s; %d callbacks/s (half re-deliveries); %s, %s, load average before %s\n\n",
		mode, check, r.Rate, r.When.Format(time.RFC3339), r.Machine, r.LoadAvg)
	b.WriteString("| fault | at | acked | lost | 503 haproxy | 503 edged | other failures | outage starts | outage (to the first success) | replays in it | re-deliveries refused in it | full rate |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, f := range r.Faults {
		fmt.Fprintf(&b, "| %s | +%s | %d | %d | %d | %d | %d | %s | %s | %d | %d | %s |\n", f.What, f.At.Round(time.Second),
			f.Acked, f.Lost, f.LBRefused, f.EdgeRefused, f.Failed, haDuration(f.OutageAt), haDuration(f.Outage),
			f.ReplaysInOutage, f.RefusedInOutage, haDuration(f.FullRate))
	}
	fmt.Fprintf(&b, "\nafterwards every acknowledged payment delivered once more: %d, %d replayed, %d applied again (their first commit was lost)\n",
		r.Redelivered, r.Replayed, r.AppliedAgain)
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "check: %s\n", c)
	}
	return b.String()
}

func haDuration(d time.Duration) string {
	if d < 0 {
		return "none"
	}
	return d.Round(100 * time.Millisecond).String()
}
