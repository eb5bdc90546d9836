package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// The retention rows: first deliveries at half the "first" peak, once over
// a backlog of expired claims (the claim retention's first run after an
// upgrade, or after it was off for a while) and once while the retention
// loop deletes that backlog. Retention runs in the bench process, with the
// same Store code and defaults as every edged node; its deletes cost
// Postgres (the pg column), its loop a little of the driver column.
// Postgres logs every lock wait over 50 ms meanwhile; a callback among the
// waiters fails the run.

// The rows' names ("-scenario retention" selects both).
const (
	retentionBefore = "retention: before (expired claims)"
	retentionDuring = "retention: while deleting them"
)

// retentionBacklog is how many expired claims the rows seed (Quick: a
// smoke-test's worth).
func retentionBacklog(quick bool) int {
	if quick {
		return 20_000
	}
	return 1_000_000
}

// expiredAge is the seeded claims' age: past the default claim retention
// (168h), as a backlog is.
const expiredAge = 200 * time.Hour

// callbackApp is the application_name of the callback pools (the edge's):
// durable.New's default. Retention, the relay, operator reads and the
// shipper (its binary's, and the bench's own) have names of their own.
const callbackApp = "notifyedge"

// RetentionFigures are the retention rows' figures.
type RetentionFigures struct {
	// Backlog is how many expired claims were seeded, SeedSeconds how long
	// seeding, vacuuming and a checkpoint took (before both attacks).
	Backlog     int     `json:"backlog_expired_claims"`
	SeedSeconds float64 `json:"seed_seconds"`
	// LoadAvgBefore is /proc/loadavg before the first attack, LoadAvgAfter
	// once the backlog is deleted: on a shared machine, what else ran.
	LoadAvgBefore string `json:"loadavg_before"`
	LoadAvgAfter  string `json:"loadavg_after"`
	// FirstPeak is the "first" closed-loop req/s the rate is half of
	// (measured here when the "first" row did not run).
	FirstPeak float64 `json:"first_peak_req_per_sec"`
	// P99Without and P99With are the rows' p99 in ms; Ratio is With over
	// Without, whose target is Target (1.2 over a backlog on small tables,
	// 1.5 over a grown week's day).
	P99Without float64 `json:"p99_without_ms"`
	P99With    float64 `json:"p99_with_ms"`
	Ratio      float64 `json:"p99_ratio"`
	Target     float64 `json:"p99_ratio_target"`
	// DeleteSeconds is how long the leader's first cycle took to delete the
	// backlog (from the start of the second attack) and what aged out
	// meanwhile (its cutoffs move on with the clock), DeletedInAttack how
	// many rows it deleted while the second attack ran.
	DeleteSeconds float64 `json:"backlog_deleted_seconds"`
	// WALWithout and WALWith are the WAL written per second, MiB, over the
	// first row and over the second.
	WALWithout     float64 `json:"wal_mib_per_second_without"`
	WALWith        float64 `json:"wal_mib_per_second_with"`
	SecondAttackAt float64 `json:"second_attack_at_seconds"`
	// AgesReadMillis is how long OldestRowAges (the gauge's scrape) took
	// right after the backlog was deleted.
	AgesReadMillis  float64 `json:"oldest_row_ages_read_ms"`
	DeletedInAttack int64   `json:"deleted_during_attack"`
	// Deleted is what the leader's first whole cycle deleted, by table,
	// with what the turns before it deleted.
	Deleted map[string]int64 `json:"deleted_by_table"`
	Batches int64            `json:"batches"`
	// CallbackLockWaits are the log's "still waiting for" lines of callback
	// sessions for any lock but a table's extension (any fails the run),
	// CallbackExtensionWaits theirs for a table's extension lock, which
	// callbacks and the relay take in turn and retention never does
	// (reported); OtherLockWaits those of the others (retention's own
	// included).
	CallbackLockWaits      []string `json:"callback_lock_waits"`
	CallbackExtensionWaits []string `json:"callback_extension_waits,omitempty"`
	OtherLockWaits         []string `json:"other_lock_waits"`
	// Errors are what the retention loop recovered from by retrying.
	Errors []string `json:"retention_errors,omitempty"`
	// Events are the autovacuum runs and checkpoints the Postgres log
	// reports over both rows, with their offset from the first attack.
	Events []string `json:"postgres_events,omitempty"`
	// TurnSeconds, when set, is the turn the deletion alternated in with
	// none, Turns turns from the second attack's start (retention first),
	// before it ran to its end: both sides then meet the same
	// checkpoints, vacuums and growth, which a row before the deletion
	// does not. P99On and P99Off are the p99s, ms, of the requests sent in
	// its turns with retention and in those without, TurnRatio On over
	// Off: retention's own share of the second row's p99 (its dead rows
	// and WAL spill over into the turns without, so the share errs low).
	TurnSeconds float64 `json:"turn_seconds,omitempty"`
	// OffSeconds is how much of DeleteSeconds was turns without retention.
	OffSeconds float64 `json:"turns_off_seconds,omitempty"`
	Turns      int     `json:"turns,omitempty"`
	P99On      float64 `json:"p99_turns_on_ms,omitempty"`
	P99Off     float64 `json:"p99_turns_off_ms,omitempty"`
	TurnRatio  float64 `json:"p99_turns_ratio,omitempty"`
	// TurnStarts are when each alternating turn began, in seconds from the
	// second attack's start (the first may be a moment before it).
	TurnStarts []float64 `json:"turn_starts_s,omitempty"`
	// P99BySecond are the two rows' p99 in ms, second by second of their
	// attacks.
	P99BySecondWithout []float64 `json:"p99_by_second_without_ms"`
	P99BySecondWith    []float64 `json:"p99_by_second_with_ms"`
}

// retentionRun is the state a pair of retention rows shares: the row
// without retention (before) and the row while it deletes (during).
type retentionRun struct {
	before, during string
	// of is the scenario whose closed-loop peak the rate is half of.
	of string
	// outboxBacklog is how many outbox rows wait beside the expired
	// claims (figures.Backlog).
	outboxBacklog int
	figures       RetentionFigures
	// turn, when set, alternates the deletion with none, turn each, for
	// turns turns from the second attack's start (retention first); then
	// the deletion runs to its end.
	turn  time.Duration
	turns int
	// marks are when each turn began, from start, and attackAt when the
	// second attack began, a little after start (both under mu).
	marks    []turnMark
	attackAt time.Time
	logFrom  int64     // the Postgres log's size when the rows began
	attacked time.Time // when the first row's attack began (about)
	// wal is the WAL position at the first attack, at the second, and at
	// the second's end.
	wal       [3]int64
	start     time.Time
	attackEnd atomic.Int64 // unix ns when the second attack ended
	deleted   atomic.Int64
	batches   atomic.Int64
	mu        sync.Mutex
	errs      []string
	deletedBy map[string]int64 // in the first cycle (under mu)
	// cycled closes when the leader's first cycle ended, at cycleEnd.
	cycled   chan struct{}
	cycleEnd time.Time
	stop     context.CancelFunc
	done     chan struct{}
}

// turnMark is when a turn of the second row began, from the retention
// loop's start, and whether retention ran in it.
type turnMark struct {
	at time.Duration
	on bool
}

// seedExpiredClaims (the first row's setup) measures the "first" peak if
// this run has none, turns on lock-wait logging, and seeds the backlog of
// expired claims, vacuumed and checkpointed so that neither attack pays
// for the seeding.
func seedExpiredClaims(ctx context.Context, e *env) error {
	r := &retentionRun{before: retentionBefore, during: retentionDuring, of: "first", figures: RetentionFigures{Target: 1.2}}
	if err := r.measurePeak(ctx, e); err != nil {
		return err
	}
	n := retentionBacklog(e.cfg.Quick)
	e.say("retention: seeding %d claims %s old ...", n, expiredAge)
	start := time.Now()
	// Keys and orders of no channel and no seeded order: the invariants
	// (this run's prefix) never see them. created_at spreads over the
	// backlog, one millisecond apart, oldest first.
	if _, err := e.db.Exec(ctx, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json, created_at)
SELECT 'expired:' || $1::text || ':' || g, 'X' || $1::text || '-' || g, repeat('0', 64), 'DONE',
       '{"http":200,"code":"SUCCESS","outcome":"skipped","status":"PAID"}',
       now() - $2::bigint * interval '1 microsecond' + g * interval '1 millisecond'
  FROM generate_series(1, $3::int) g`, e.prefix, expiredAge.Microseconds(), n); err != nil {
		return fmt.Errorf("seed expired claims: %w", err)
	}
	for _, q := range []string{`VACUUM (ANALYZE) notify_claim`, `CHECKPOINT`} {
		if _, err := e.db.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	r.figures.Backlog, r.figures.SeedSeconds = n, time.Since(start).Seconds()
	r.register(e)
	return nil
}

// measurePeak measures the closed-loop peak of r.of if this run has none
// (the rate of both rows is half of it).
func (r *retentionRun) measurePeak(ctx context.Context, e *env) error {
	if _, ok := e.peaks[r.of]; !ok && e.cfg.Rate <= 0 {
		e.say("retention: measuring the %q closed-loop peak for the rate ...", r.of)
		row, err := closedLoopWorkers(ctx, e, scenario{name: r.of, source: fresh}, e.tg.URL, newTally(e.tg.Channel))
		if err != nil {
			return err
		}
		e.say("retention: %q peak %.0f req/s", r.of, row.ReqPerSec)
	}
	r.figures.FirstPeak = e.peaks[r.of]
	return nil
}

// register makes r the run's current retention pair, its backlog in
// place.
func (r *retentionRun) register(e *env) {
	e.retention = r
	e.retentions = append(e.retentions, r)
}

// beginRetention (the first row's ready) turns lock-wait logging on and
// notes the Postgres log's size, the load average and the WAL position as
// the first row's attack begins.
func beginRetention(ctx context.Context, e *env) error {
	r := e.retention
	if r == nil {
		return errors.New("retention: the pair's first row made no pair")
	}
	var err error
	if r.logFrom, err = fileSize(e.st.PostgresLog()); err != nil {
		return err
	}
	if err := e.serverSettings(ctx, lockWaitSettings, false); err != nil {
		return err
	}
	r.figures.LoadAvgBefore = loadAvg()
	r.attacked = time.Now()
	return e.walPosition(ctx, &r.wal[0])
}

// startRetention (the second row's ready: its orders are in place, so the
// deletion's time is the attack's) starts the retention loop on the
// stack's Store, as a node starts it.
func startRetention(ctx context.Context, e *env) error {
	r := e.retention
	if r == nil {
		return errors.New("retention: the row without retention did not run (select both rows of the pair)")
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.stop, r.done, r.cycled = cancel, make(chan struct{}), make(chan struct{})
	var once sync.Once
	if err := e.walPosition(ctx, &r.wal[1]); err != nil {
		return err
	}
	r.start = time.Now()
	r.figures.SecondAttackAt = r.start.Sub(r.attacked).Seconds()
	cfg := durable.RetentionConfig{
		OnDeleted: func(table string, n int64) {
			r.mu.Lock()
			if r.deletedBy == nil {
				r.deletedBy = map[string]int64{}
			}
			if r.cycleEnd.IsZero() {
				r.deletedBy[table] += n
			}
			r.mu.Unlock()
			if table == durable.TableClaim {
				r.batches.Add(1)
				if r.attackEnd.Load() == 0 {
					r.deleted.Add(n)
				}
			}
		},
		OnCycle: func(durable.RetentionCycle) {
			once.Do(func() {
				r.mu.Lock()
				r.cycleEnd = time.Now()
				r.mu.Unlock()
				close(r.cycled)
			})
		},
		OnError: func(err error) {
			r.mu.Lock()
			r.errs = append(r.errs, err.Error())
			r.mu.Unlock()
		},
	}
	go func() {
		defer close(r.done)
		r.alternate(rctx, e, cfg)
	}()
	return nil
}

// turnLockID is the first of the lock ids the turns with retention run
// under: retention's own default plus one.
const turnLockID = durable.RetentionLockID + 1

// alternate runs the retention loop as a node does until ctx ends: in
// turns of r.turn, on and off, for r.turns turns, then on. Each turn on is
// a RunRetention of its own under a lock id of its own, so that the
// previous turn's session, which may outlive its cancelled statement for
// a moment, cannot keep the next one a standby for an Interval.
func (r *retentionRun) alternate(ctx context.Context, e *env, cfg durable.RetentionConfig) {
	for i := 0; ctx.Err() == nil; i++ {
		last := r.turn <= 0 || i >= r.turns
		on := last || i%2 == 0
		r.mu.Lock()
		r.marks = append(r.marks, turnMark{at: time.Since(r.start), on: on})
		r.mu.Unlock()
		if last {
			e.st.Store.RunRetention(ctx, cfg)
			return
		}
		tctx, cancel := context.WithTimeout(ctx, r.turn)
		if on {
			turn := cfg
			turn.LockID = turnLockID + int64(i)
			e.st.Store.RunRetention(tctx, turn)
		} else {
			<-tctx.Done()
		}
		cancel()
	}
}

// offBefore is how long retention was off, in its turns, in the first t
// of the loop.
func (r *retentionRun) offBefore(t time.Duration) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var off time.Duration
	for i, m := range r.marks {
		if m.on || m.at >= t {
			continue
		}
		end := t
		if i+1 < len(r.marks) {
			end = min(end, r.marks[i+1].at)
		}
		off += end - m.at
	}
	return off
}

// turnLatencies splits the second attack's points by the alternating turn
// they were sent in, with retention (on) or without (off); the points
// after the alternating turns are left out.
func (r *retentionRun) turnLatencies(points []Point) (on, off []time.Duration) {
	marks := r.attackMarks()
	for _, p := range points {
		k := -1
		for k+1 < len(marks) && marks[k+1].at <= p.At {
			k++
		}
		switch {
		case k < 0 || k >= r.turns:
		case marks[k].on:
			on = append(on, p.Latency)
		default:
			off = append(off, p.Latency)
		}
	}
	return on, off
}

// attackMarks are the turns' marks counted from the second attack's start,
// as its points are, instead of from the loop's, a moment before it.
func (r *retentionRun) attackMarks() []turnMark {
	r.mu.Lock()
	defer r.mu.Unlock()
	lead := r.attackAt.Sub(r.start)
	out := make([]turnMark, len(r.marks))
	for i, m := range r.marks {
		out[i] = turnMark{at: m.at - lead, on: m.on}
	}
	return out
}

// turnStarts are when the alternating turns began, in seconds from the
// second attack's start.
func (r *retentionRun) turnStarts() []float64 {
	var out []float64
	for k, m := range r.attackMarks() {
		if k < r.turns {
			out = append(out, m.at.Seconds())
		}
	}
	return out
}

// retentionBaseline is how long the row without retention runs (Quick:
// Config.Duration): about as long as the deletion takes here, so that both
// p99s cover the same kinds of seconds (checkpoints and the autovacuum of
// the outbox come without retention too; a short baseline has none).
const retentionBaseline = 200 * time.Second

// withoutRetention is vegeta at share of the named scenario's closed-loop
// req/s (as atPeakShare) for retentionBaseline.
func withoutRetention(of string, share float64) driver {
	return func(ctx context.Context, e *env, s scenario, url string, t *tally) (Row, error) {
		d := e.cfg.Duration
		if !e.cfg.Quick {
			d = max(d, retentionBaseline)
		}
		return openLoop(ctx, e.tg, s.name, url, e.rateAt(of, share), d, s.source(e.pool), t, e.cfg.Progress), nil
	}
}

// ordersWithout is how many fresh orders withoutRetention takes.
func ordersWithout(of string, share float64) func(*env) int {
	return func(e *env) int {
		d := e.cfg.Duration
		if !e.cfg.Quick {
			d = max(d, retentionBaseline)
		}
		return int(float64(e.rateAt(of, share))*d.Seconds()*1.1) + 1000
	}
}

// ordersUntilDeleted is how many fresh orders untilDeleted may take: its
// rate for half as long again as the backlog takes at the catch-up rate
// (the checkpoints' WAL may lower that rate), and the turns without
// retention, but no longer than the attack may last (maxDeletion).
// Retention walks the tables side by side, each at what ages out (a few
// rows a second here) plus its catch-up rate, so the larger table's
// backlog sets the time.
func ordersUntilDeleted(of string, share float64) func(*env) int {
	return func(e *env) int {
		r := e.retention
		backlog := float64(max(r.figures.Backlog, r.outboxBacklog))
		off := time.Duration(r.turns/2) * r.turn
		secs := min(1.5*backlog/deletionRate+off.Seconds(), maxDeletion.Seconds()) + e.cfg.Duration.Seconds()
		return int(float64(e.rateAt(of, share))*secs) + 1000
	}
}

// deletionRate is the rows a second retention deletes from one table
// with a backlog: its default catch-up rate, the small rate of the rows
// aging out left out so that the estimate errs long.
const deletionRate = 1000

// maxDeletion bounds the wait for the backlog to be deleted: a grown
// week's day (4.3 million claims) takes about 70 minutes at the catch-up
// rate, and its turns without retention 20 more.
const maxDeletion = 2 * time.Hour

// untilDeleted is vegeta at share of the named scenario's closed-loop
// req/s (as atPeakShare) from the start of the retention loop until its
// first cycle deleted the backlog (at least Config.Duration, at most
// maxDeletion): the attack covers the whole deletion.
func untilDeleted(of string, share float64) driver {
	return func(ctx context.Context, e *env, s scenario, url string, t *tally) (Row, error) {
		r := e.retention
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-r.cycled:
				// The rest of Config.Duration, if the backlog went sooner.
				wait.Sleep(actx, time.Until(r.start.Add(e.cfg.Duration)))
				cancel()
			case <-actx.Done():
			}
		}()
		r.mu.Lock()
		r.attackAt = time.Now()
		r.mu.Unlock()
		return openLoop(actx, e.tg, s.name, url, e.rateAt(of, share), maxDeletion, s.source(e.pool), t, e.cfg.Progress), nil
	}
}

// finishRetention (the second row's after) waits for the backlog to be
// gone, stops the loop, restores the server settings, and reads the lock
// waits from the Postgres log: a callback among the waiters is an error.
func finishRetention(ctx context.Context, e *env) error {
	r := e.retention
	r.attackEnd.Store(time.Now().UnixNano())
	walErr := e.walPosition(ctx, &r.wal[2])
	var ended time.Time
	select {
	case <-r.cycled:
		ended = r.cycleEnd
	case <-ctx.Done():
	case <-time.After(time.Until(r.start.Add(maxDeletion)) + time.Minute):
	}
	r.stop()
	<-r.done
	f := &r.figures
	f.LoadAvgAfter = loadAvg()
	mbps := func(from, to int64, d time.Duration) float64 { return float64(to-from) / (1 << 20) / d.Seconds() }
	f.WALWithout = mbps(r.wal[0], r.wal[1], r.start.Sub(r.attacked))
	f.WALWith = mbps(r.wal[1], r.wal[2], time.Unix(0, r.attackEnd.Load()).Sub(r.start))
	// The gauge's read, with the backlog's dead index entries (some, at
	// least) not yet vacuumed.
	t0 := time.Now()
	if _, err := e.st.Store.OldestRowAges(ctx); err == nil {
		f.AgesReadMillis = millis(time.Since(t0))
	}
	f.DeleteSeconds = ended.Sub(r.start).Seconds()
	if !ended.IsZero() {
		f.OffSeconds = r.offBefore(ended.Sub(r.start)).Seconds()
	}
	f.DeletedInAttack, f.Batches = r.deleted.Load(), r.batches.Load()
	r.mu.Lock()
	f.Errors, f.Deleted = r.errs, r.deletedBy
	r.mu.Unlock()
	errs := []error{walErr}
	if ended.IsZero() {
		errs = append(errs, fmt.Errorf("retention: the backlog was not deleted within %s", time.Since(r.start).Round(time.Second)))
	}
	// Expired when the deletion began: a seeded week keeps ageing past the
	// retention while the first cycle runs, and the last second's worth
	// of those may be left for the next cycle.
	left, err := count(ctx, e.db, `SELECT count(*) FROM notify_claim WHERE created_at < $1::timestamptz - $2::bigint * interval '1 microsecond'`,
		r.start, durable.DefaultClaimRetention.Microseconds())
	if err == nil && left > 0 {
		err = fmt.Errorf("retention: %d expired claims left", left)
	}
	errs = append(errs, err, e.serverSettings(ctx, lockWaitSettings, true))
	f.CallbackLockWaits, f.OtherLockWaits, err = lockWaits(e.st.PostgresLog(), r.logFrom)
	errs = append(errs, err)
	f.CallbackLockWaits, f.OtherLockWaits = e.nameRelations(ctx, r.phased(f.CallbackLockWaits)), e.nameRelations(ctx, r.phased(f.OtherLockWaits))
	f.CallbackExtensionWaits, f.CallbackLockWaits = byExtension(f.CallbackLockWaits)
	f.Events, err = postgresEvents(e.st.PostgresLog(), r.logFrom, r.attacked)
	errs = append(errs, err)
	// The quick smoke run shares a loaded machine with other test
	// binaries, where callbacks wait on each other whatever retention
	// does: it reports the waits; the full run fails on them (a wait to
	// extend a table, which retention never takes, is reported apart).
	if len(f.CallbackLockWaits) > 0 && !e.cfg.Quick {
		errs = append(errs, fmt.Errorf("%w: %d callback lock waits over 50 ms in the Postgres log, e.g. %s",
			ErrInvariant, len(f.CallbackLockWaits), f.CallbackLockWaits[0]))
	}
	return errors.Join(errs...)
}

// retentionFigures completes the figures of the pair whose first row is
// named before with the two rows' p99s (nil if it did not run).
func (e *env) retentionFigures(rep *Report, before string) *RetentionFigures {
	var r *retentionRun
	for _, x := range e.retentions {
		if x.before == before {
			r = x
		}
	}
	if r == nil {
		return nil
	}
	f := r.figures
	if b, d := rep.find(r.before), rep.find(r.during); b != nil && d != nil {
		f.P99Without, f.P99With = millis(b.Lat.P99), millis(d.Lat.P99)
		f.P99BySecondWithout, f.P99BySecondWith = p99BySecond(b.Points), p99BySecond(d.Points)
		if f.P99Without > 0 {
			f.Ratio = f.P99With / f.P99Without
		}
		if on, off := r.turnLatencies(d.Points); len(on) > 0 && len(off) > 0 {
			f.P99On, f.P99Off = millis(percentilesOf(on).P99), millis(percentilesOf(off).P99)
			f.TurnRatio = f.P99On / f.P99Off
		}
		f.TurnStarts = r.turnStarts()
	}
	return &f
}

// phased prefixes each log line with the row it fell in: "before" (no
// retention) or "deleting".
func (r *retentionRun) phased(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		phase := "[?] "
		if ts, ok := logTime(l); ok && ts.Before(r.start) {
			phase = "[before] "
		} else if ok {
			phase = "[deleting] "
		}
		out[i] = phase + l
	}
	return out
}

// walPosition reads the server's current WAL position, in bytes.
func (e *env) walPosition(ctx context.Context, into *int64) error {
	if err := e.db.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`).Scan(into); err != nil {
		return fmt.Errorf("wal position: %w", err)
	}
	return nil
}

// p99BySecond is the p99 latency in ms of each second of an open-loop
// attack's points.
func p99BySecond(points []Point) []float64 {
	var buckets [][]time.Duration
	for _, p := range points {
		i := int(p.At / time.Second)
		for len(buckets) <= i {
			buckets = append(buckets, nil)
		}
		buckets[i] = append(buckets[i], p.Latency)
	}
	out := make([]float64, len(buckets))
	for i, b := range buckets {
		out[i] = millis(percentilesOf(b).P99)
	}
	return out
}

// table renders the figures for Report.Table.
func (f *RetentionFigures) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nRetention: %d expired claims (seeded, vacuumed, checkpointed in %.1f s); load average before the attacks %s, after %s\n",
		f.Backlog, f.SeedSeconds, f.LoadAvgBefore, f.LoadAvgAfter)
	fmt.Fprintf(&b, "  first deliveries at half the \"first\" peak (%.0f req/s): p99 %.2f ms without retention, %.2f ms while it deletes: ratio %.2f (target <= %.1f)\n",
		f.FirstPeak, f.P99Without, f.P99With, f.Ratio, f.Target)
	if f.TurnSeconds > 0 {
		fmt.Fprintf(&b, "  in %d turns of %s, retention first, then none: p99 %.2f ms with, %.2f ms without: ratio %.2f (target <= %.1f)\n",
			f.Turns, seconds(f.TurnSeconds), f.P99On, f.P99Off, f.TurnRatio, f.Target)
	}
	off, cycle := "", "the first cycle"
	if f.TurnSeconds > 0 {
		off = fmt.Sprintf(", %s of turns without retention included", seconds(f.OffSeconds))
		cycle = "the first whole cycle and the turns before it"
	}
	fmt.Fprintf(&b, "  backlog deleted in %.1f s%s (%d batches; %d rows during the attack, which began %+.1f s after the first); %s deleted %v\n",
		f.DeleteSeconds, off, f.Batches, f.DeletedInAttack, f.SecondAttackAt, cycle, f.Deleted)
	fmt.Fprintf(&b, "  WAL written: %.1f MiB/s without retention, %.1f MiB/s while it deletes (vacuum included)\n", f.WALWithout, f.WALWith)
	fmt.Fprintf(&b, "  notifyedge_oldest_row_age_seconds read in %.1f ms right after\n", f.AgesReadMillis)
	fmt.Fprintf(&b, "  lock waits over 50 ms in the Postgres log: %d by callbacks, %d by callbacks extending a table, %d by others\n",
		len(f.CallbackLockWaits), len(f.CallbackExtensionWaits), len(f.OtherLockWaits))
	for _, l := range slices.Concat(f.CallbackLockWaits, f.CallbackExtensionWaits, f.OtherLockWaits) {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	for _, e := range f.Errors {
		fmt.Fprintf(&b, "  retention recovered from: %s\n", e)
	}
	fmt.Fprintf(&b, "  p99 by second, without: %s\n", bySecond(f.P99BySecondWithout, f.P99Without))
	fmt.Fprintf(&b, "  p99 by second, with:    %s\n", bySecond(f.P99BySecondWith, f.P99Without))
	for _, ev := range f.Events {
		fmt.Fprintf(&b, "  postgres: %s\n", ev)
	}
	return b.String()
}

// seconds renders s seconds as a duration ("250ms", "20m0s").
func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}

// bySecond summarises per-second p99s against the row without retention:
// the worst second, and how many seconds exceed 1.2 times its p99.
func bySecond(v []float64, baseline float64) string {
	if len(v) > 1 {
		v = v[:len(v)-1] // the last second is a fraction of one
	}
	worst, at, over := 0.0, 0, 0
	for i, x := range v {
		if x > worst {
			worst, at = x, i
		}
		if x > 1.2*baseline {
			over++
		}
	}
	return fmt.Sprintf("worst %.0f ms (second %d); %d of %d seconds above 1.2 x %.1f ms", worst, at, over, len(v), baseline)
}
