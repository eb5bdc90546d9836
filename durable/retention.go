package durable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/notifyedge/notifyedge/durable/wait"
)

// The retention defaults (the README's configuration table).
const (
	// DefaultClaimRetention keeps claims, and with them byte-for-byte
	// replays, for a week.
	DefaultClaimRetention = 168 * time.Hour
	// DefaultOutboxRetention keeps published outbox rows and consumer-inbox
	// rows for a week.
	DefaultOutboxRetention = 168 * time.Hour
	// DefaultReviewRetention keeps resolved review rows, which hold raw
	// bodies, for 90 days.
	DefaultReviewRetention = 2160 * time.Hour
	// MinClaimRetention is the channels' retry window with a margin: a
	// claim must outlive every retry of its delivery, so that a retry is
	// replayed (byte for byte) rather than decided again.
	MinClaimRetention = 25 * time.Hour
)

// The tables retention deletes from, in the order of a cycle; they are the
// table label values of the retention metrics.
const (
	TableClaim         = "notify_claim"
	TableOutbox        = "outbox"
	TableConsumerInbox = "consumer_inbox"
	TableReview        = "notify_review"
	TableTrace         = "notify_trace"
)

// RetentionTables lists the tables retention deletes from.
var RetentionTables = []string{TableClaim, TableOutbox, TableConsumerInbox, TableReview, TableTrace}

// RetentionConfig configures RunRetention. Zero fields take the defaults
// noted.
type RetentionConfig struct {
	// ClaimRetention: claims older than this by created_at are deleted
	// (default DefaultClaimRetention; below MinClaimRetention is refused).
	ClaimRetention time.Duration
	// OutboxRetention: published outbox rows older than this by
	// published_at, consumer-inbox rows older than this by processed_at,
	// and trace contexts (notify_trace) older than this by created_at, are
	// deleted (default DefaultOutboxRetention).
	// Unpublished rows are never deleted.
	OutboxRetention time.Duration
	// ReviewRetention: resolved review rows older than this by resolved_at
	// are deleted (default DefaultReviewRetention). Open rows are never
	// deleted, nor is a claim an open row names (by biz_key), however old.
	ReviewRetention time.Duration
	// Batch is how many rows one DELETE removes, each its own short
	// transaction (default 1000).
	Batch int
	// CatchUpRate is how many rows a second, per table, retention deletes
	// beyond what ages out (default 1,000). Each table's batches are paced
	// to the rate its rows were inserted at, a retention ago (read from
	// the time column of the rows each batch deleted), plus this: a table
	// keeps up with its own inserts whatever their rate, and a backlog is
	// worked off beside the callbacks, not instead of them (a day of claims
	// at 50 a second, 4.3 million, takes 72 minutes). The tables are
	// walked side by side, each on its own schedule.
	CatchUpRate float64
	// CheckpointShare is the share of the checkpoints' WAL rate that the
	// catch-up's deletes may write (default 0.25). That rate is what the
	// server may write a second before a checkpoint comes by WAL rather
	// than by checkpoint_timeout, read at each cycle's start:
	// max_wal_size / (1 + checkpoint_completion_target) over
	// checkpoint_timeout (1 GB, 0.9 and 5 min, the server's defaults:
	// 1.8 MiB a second). Each checkpoint brings a burst of full-page
	// writes and a flush of everything dirtied, which the callbacks pay
	// for; a backlog, however large, then adds at most this share of the
	// WAL that brings one sooner (vacuuming the rows it deleted writes
	// more, later). Each table's catch-up is lowered below CatchUpRate where its deletes'
	// WAL, measured around each batch, would pass its even part of the
	// share. The WAL other sessions write meanwhile is not charged: their
	// rate is read between batches, when retention writes none, and
	// subtracted (an estimate, which errs low on a busy machine; where it
	// hides a table's own WAL, that table's catch-up is CatchUpRate). The
	// rows that keep up with the inserts are never held back.
	CheckpointShare float64
	// MinPause separates any two batches (default 10ms); so does the
	// previous batch's own duration, if longer: retention's session is
	// never busy more than half the time, so a database too busy to give
	// it what ages out leaves the tables growing (the oldest row's age
	// says so), not the callbacks waiting.
	MinPause time.Duration
	// Interval is the sleep once nothing is old enough, and how often a
	// standby node tries to become the leader (default 1m). Once caught
	// up, a row is deleted about Interval after it passes its retention:
	// while a cycle runs, each table's cutoff moves on with the clock, so
	// the rows that age out meanwhile go in the same cycle.
	Interval time.Duration
	// LockTimeout is the batches' lock_timeout (default 100ms): a batch
	// never queues for long behind a lock (a migration's, say) that
	// callbacks would then queue behind it for.
	LockTimeout time.Duration
	// StatementTimeout is the batches' statement_timeout (default 5s): the
	// longest a batch holds the row locks of what it deletes.
	StatementTimeout time.Duration
	// LockID is the advisory lock that elects the leader (default a fixed
	// id of retention's own, not the relay's).
	LockID int64
	// OnDeleted hears every batch that deleted rows: its table and count
	// (for notifyedge_retention_deleted_total).
	OnDeleted func(table string, n int64)
	// OnCycle hears the end of every cycle of the leader: every table
	// worked off to nothing old enough, or as far as locks (or, for the
	// rows that aged out while it ran, ten minutes) let it.
	OnCycle func(RetentionCycle)
	// OnState hears "leader" (this node deletes) and "standby".
	OnState func(state string)
	// OnError hears every failure RunRetention recovers from by retrying.
	OnError func(error)

	// sleep waits between batches (wait.Sleep; tests record the waits
	// instead), and now is the leader's clock the batches are scheduled by
	// (time.Now; tests move one of their own).
	sleep func(context.Context, time.Duration) bool
	now   func() time.Time
}

// RetentionCycle is one cycle of the retention leader.
type RetentionCycle struct {
	// Deleted counts the rows deleted, by table.
	Deleted map[string]int64
	// Took is the cycle's duration, pauses included.
	Took time.Duration
	// WAL is the WAL the cycle's batches wrote, in bytes: the server's
	// WAL position's moves while they ran, less OthersWAL (each batch's at
	// least 0).
	WAL int64
	// OthersWAL is what other sessions wrote while the batches ran, in
	// bytes, at the rate they wrote between batches.
	OthersWAL int64
}

// RetentionLockID is retention's own advisory lock (RetentionConfig's
// default LockID), apart from the relay's (relayLockID): the two lead
// independently, possibly on different nodes.
const RetentionLockID = int64(0x726574656e74) // "retent"

func (c RetentionConfig) withDefaults() (RetentionConfig, error) {
	c.ClaimRetention = cmp.Or(c.ClaimRetention, DefaultClaimRetention)
	c.OutboxRetention = cmp.Or(c.OutboxRetention, DefaultOutboxRetention)
	c.ReviewRetention = cmp.Or(c.ReviewRetention, DefaultReviewRetention)
	c.Batch = cmp.Or(c.Batch, 1000)
	c.CatchUpRate = cmp.Or(c.CatchUpRate, 1000)
	c.CheckpointShare = cmp.Or(c.CheckpointShare, 0.25)
	c.MinPause = cmp.Or(c.MinPause, 10*time.Millisecond)
	c.Interval = cmp.Or(c.Interval, time.Minute)
	c.LockTimeout = cmp.Or(c.LockTimeout, 100*time.Millisecond)
	c.StatementTimeout = cmp.Or(c.StatementTimeout, 5*time.Second)
	c.LockID = cmp.Or(c.LockID, RetentionLockID)
	if c.sleep == nil {
		c.sleep = wait.Sleep
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c, c.validate()
}

func (c RetentionConfig) validate() error {
	if c.ClaimRetention < MinClaimRetention {
		return fmt.Errorf("durable: claim retention %s is below %s, the channels' retry window: a retry must still find its claim",
			c.ClaimRetention, MinClaimRetention)
	}
	if c.OutboxRetention < 0 || c.ReviewRetention < 0 || c.Batch < 0 || c.CatchUpRate < 0 || c.CheckpointShare < 0 || c.MinPause < 0 || c.Interval < 0 ||
		c.LockTimeout < 0 || c.StatementTimeout < 0 {
		return errors.New("durable: negative retention setting")
	}
	return nil
}

// ValidateRetention reports whether RunRetention would accept cfg (zero
// fields taking their defaults): a node refuses a bad setting at start,
// not a minute later in its first cycle.
func ValidateRetention(cfg RetentionConfig) error {
	_, err := cfg.withDefaults()
	return err
}

// retentionTable is what retention deletes from one table: the rows whose
// column (NULL never qualifies: unpublished outbox rows and open review
// rows) is older than the table's retention.
type retentionTable struct {
	name string
	// col ages the rows.
	col  string
	keep func(RetentionConfig) time.Duration
	// byID walks the table in id order (the outbox: see
	// sqlOutboxRetentionBatch), not in col's.
	byID bool
	// spare, when set, is an SQL condition every deleted row meets: a row
	// that fails it stays, however old.
	spare string
	// batch deletes the next Batch rows: $1 the cutoff, $2 where the
	// previous batch stopped, $3 Batch.
	batch string
}

var retentionPlan = []retentionTable{
	{name: TableClaim, col: "created_at", keep: func(c RetentionConfig) time.Duration { return c.ClaimRetention },
		spare: sqlClaimNotUnderReview},
	{name: TableOutbox, col: "published_at", keep: func(c RetentionConfig) time.Duration { return c.OutboxRetention },
		byID: true, batch: sqlOutboxRetentionBatch},
	{name: TableConsumerInbox, col: "processed_at", keep: func(c RetentionConfig) time.Duration { return c.OutboxRetention }},
	{name: TableReview, col: "resolved_at", keep: func(c RetentionConfig) time.Duration { return c.ReviewRetention }},
	// A sampled callback's trace context goes with its outbox row.
	{name: TableTrace, col: "created_at", keep: func(c RetentionConfig) time.Duration { return c.OutboxRetention }},
}

func init() {
	for i := range retentionPlan {
		if t := &retentionPlan[i]; !t.byID {
			t.batch = retentionBatchSQL(t.name, t.col, t.spare)
		}
	}
}

// sqlClaimNotUnderReview spares a claim that an open review row names
// (same biz_key, any reason): the review is about a delivery of that key,
// and the claim holds the first delivery's digest and answer, what a
// conflict is judged against. Once the review is resolved the claim ages
// out like any other. One probe of notify_review_open_uniq, whose first
// column is biz_key, per claim old enough.
const sqlClaimNotUnderReview = `NOT EXISTS (SELECT 1 FROM notify_review r
                     WHERE r.biz_key = notify_claim.biz_key AND r.resolved_at IS NULL)`

// retentionBatchSQL deletes one batch of table: the oldest rows by col
// below the cutoff ($1) from the lower bound ($2) on that meet spare (if
// any), at most $3 of them, and returns how many it deleted and the oldest
// and newest col among them.
//
//   - The sub-SELECT walks col's index (0001, 0006) from the bound (ORDER
//     BY col LIMIT), so a batch reads what it deletes and a little more,
//     whatever the table's size. The bound is the previous batch's newest
//     col, so the next batch starts past the index entries this cycle
//     already made dead instead of stepping over all of them again (vacuum
//     removes them only later).
//   - FOR UPDATE SKIP LOCKED: a row another transaction holds is left for
//     the next cycle; a batch never waits on a row lock.
//   - The DELETE finds its rows by ctid (a TID scan): they are locked by
//     this statement, so they cannot have moved.
//   - NULL is older than nothing: an open review row never qualifies.
//   - A row spared is stepped over, by every cycle, for as long as it is
//     spared: claims under review are few.
func retentionBatchSQL(table, col, spare string) string {
	if spare != "" {
		spare = "\n       AND " + spare
	}
	return fmt.Sprintf(`WITH d AS (
  DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM %[1]s
     WHERE %[2]s < $1 AND %[2]s >= $2%[3]s
     ORDER BY %[2]s
     LIMIT $3
       FOR UPDATE SKIP LOCKED))
  RETURNING %[2]s)
SELECT count(*), min(%[2]s), max(%[2]s) FROM d`, table, col, spare)
}

// sqlOutboxRetentionBatch deletes one batch of published outbox rows. The
// outbox has no index on published_at (0006 says why); the relay
// publishes in id order, so published_at grows with id, and the batch
// walks the primary key instead: the next $3 rows after id $2 ("head"),
// of which it deletes those published before the cutoff $1 (FOR UPDATE
// SKIP LOCKED, by ctid, as retentionBatchSQL). It returns how many it
// deleted, the oldest and newest published_at among them, how many it
// read, whether the last of those was old enough, its id, and the last id
// of the head's leading run of old rows ($2 if the first was not old). A
// head whose last row is not old enough (published later, or not yet)
// ends the table's walk: behind it, rows are younger. An unpublished
// row has published_at NULL, which is older than nothing, so it stays; one
// inside a head is stepped over.
const sqlOutboxRetentionBatch = `WITH head AS MATERIALIZED (
  SELECT id, published_at < $1 AS old FROM outbox WHERE id > $2 ORDER BY id LIMIT $3
), d AS (
  DELETE FROM outbox WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM outbox
     WHERE id = ANY (ARRAY(SELECT id FROM head WHERE old)) AND published_at < $1
       FOR UPDATE SKIP LOCKED))
  RETURNING published_at)
SELECT (SELECT count(*) FROM d), (SELECT min(published_at) FROM d), (SELECT max(published_at) FROM d), (SELECT count(*) FROM head),
       coalesce((SELECT old FROM head ORDER BY id DESC LIMIT 1), false), coalesce((SELECT max(id) FROM head), $2),
       coalesce((SELECT max(id) FROM head WHERE id < coalesce((SELECT min(id) FROM head WHERE old IS NOT TRUE), 9223372036854775807)), $2)`

// RunRetention deletes what is older than its retention (RetentionConfig)
// until ctx ends, then returns nil (once the batch running then, if any,
// has ended: its rows are counted); it returns an error at once only for a
// configuration it refuses. Call it on every node: one at a time leads,
// the holder of a session advisory lock of retention's own on a dedicated
// connection; the others try again every Interval, and one of them takes
// over once the leader's session ends.
//
// The leader works every table off in batches (Batch rows, each DELETE its
// own short transaction under LockTimeout and StatementTimeout, skipping
// rows locked by others), the tables side by side, each paced to its own
// insert rate plus CatchUpRate (whose WAL is held to CheckpointShare of the
// checkpoints' rate), until nothing is old enough (each table's cutoff
// moving on with the clock: retentionWalk.refresh), then sleeps
// Interval. Orders, trade_refund rows, unpublished outbox rows,
// open review rows and the claims they name are never deleted.
//
// One node at a time leads (RunLeader); a standby tries every Interval
// and holds no connection in between. Nothing depends on there being only
// one leader: two would skip each other's rows.
func (s *Store) RunRetention(ctx context.Context, cfg RetentionConfig) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	s.runLeader(ctx, LeaderConfig{Name: "retention", LockID: cfg.LockID, Retry: cfg.Interval,
		OnState: cfg.OnState, OnError: cfg.OnError,
		base: func() *pgx.ConnConfig { return s.retentionConnConfig(cfg) },
	}, true, func(ctx context.Context, conn *pgx.Conn) error { return s.retain(ctx, conn, cfg) })
	return nil
}

// retentionConnConfig is the retention leader's session: the callbacks'
// pool's, named after it, with the batches' timeouts and planner.
func (s *Store) retentionConnConfig(cfg RetentionConfig) *pgx.ConnConfig {
	cc := s.pool.Config().ConnConfig.Copy()
	cc.RuntimeParams["application_name"] = cmp.Or(cc.RuntimeParams["application_name"], "notifyedge") + "-retention"
	cc.RuntimeParams["statement_timeout"] = ms(cfg.StatementTimeout)
	cc.RuntimeParams["lock_timeout"] = ms(cfg.LockTimeout)
	// A delete lost in a crash is done again by the next cycle: its commit
	// need not wait for the WAL flush (nor for a synchronous standby).
	cc.RuntimeParams["synchronous_commit"] = "off"
	for k, v := range retentionPlanner {
		cc.RuntimeParams[k] = v
	}
	return cc
}

// retentionPlanner leaves the retention session's planner nothing but
// index scans joined by nested loops: a batch then walks its index from
// the low end and stops after Batch rows, whatever the backlog. Planned
// generically (the callbacks' pool's plan_cache_mode, or any statement
// cache that switches to a generic plan), a claim batch's range on two
// parameters is estimated at 0.5 % of the table, and with few open reviews
// the planner hashed them, anti-joined every expired claim and sorted the
// lot before taking the first thousand: 2.4 s a batch, 400 rows a second,
// with 4.3 million expired among 35 million claims (a day of backlog), where
// the walk takes 3 ms.
var retentionPlanner = map[string]string{
	"enable_seqscan":    "off",
	"enable_bitmapscan": "off",
	"enable_sort":       "off",
	"enable_hashjoin":   "off",
	"enable_mergejoin":  "off",
	"enable_material":   "off",
}

// retain runs cycles on the lock's connection until an error or ctx ends.
func (s *Store) retain(ctx context.Context, conn *pgx.Conn, cfg RetentionConfig) error {
	// Each table's WAL per deleted row, and the other sessions' WAL rate,
	// carried from cycle to cycle.
	perRow := make(map[string]*walPerRow, len(retentionPlan))
	for _, t := range retentionPlan {
		perRow[t.name] = &walPerRow{}
	}
	var meter walMeter
	for {
		start := cfg.now()
		cycle, err := s.retentionCycle(ctx, conn, cfg, perRow, &meter)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if cfg.OnCycle != nil {
			cycle.Took = cfg.now().Sub(start)
			cfg.OnCycle(cycle)
		}
		wait.Sleep(ctx, cfg.Interval)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// retentionWalk is one table's part of a cycle: its cutoff, where its
// previous batch stopped, and when its next batch is due.
type retentionWalk struct {
	table retentionTable
	// cutoff is the server's clock less the table's retention, as of
	// readAt on the leader's clock.
	cutoff time.Time
	readAt time.Time
	// from is the newest col the previous batch deleted (the next batch's
	// lower bound); after is the last id the outbox's previous batch read,
	// and resume the last of its head's leading run of old rows, where a
	// refreshed walk starts again.
	from          pgtype.Timestamptz
	after, resume int64
	// newest is the newest col any previous batch deleted (zero before
	// the first): the next batch's rows were inserted since.
	newest time.Time
	sched  retentionSchedule
	done   bool
	// walPerRow is the WAL a deleted row of the table writes, over its
	// batches (the leader's, carried from cycle to cycle).
	walPerRow *walPerRow
}

// retentionRefresh is how old a walk's cutoff may be when it finds
// nothing more below it and ends; an older one is moved on to the clock
// and the walk goes on. retentionCycleMax is how long a cycle keeps moving
// its cutoffs: past it, a cycle that cannot catch up (a database too busy
// to give retention what ages out) ends where it stands, so that every
// cycle is reported and the checkpoint settings are read again.
const (
	retentionRefresh  = time.Second
	retentionCycleMax = 10 * time.Minute
)

// refresh moves a walk that has ended (done) on to a cutoff as of now, if
// its own is retentionRefresh old or more and the cycle, begun at start,
// is younger than retentionCycleMax. With a cutoff fixed for the
// whole cycle, the rows that aged out while it ran would wait for the
// next one, a sleep later: a cycle that takes T, Interval apart, would
// leave rows Interval+T past their retention, and T grows with the insert
// rate (about Interval × insert rate / CatchUpRate). Moved on, the walk
// ends only when it has caught up with the clock, and a row is deleted
// about Interval past its retention whatever the rate. The outbox's walk
// starts again after its last head's leading run of old rows (resume):
// behind the first row that was not old then, the rows may be old now.
func (w *retentionWalk) refresh(now, start time.Time) {
	if !w.done || now.Sub(w.readAt) < retentionRefresh || now.Sub(start) >= retentionCycleMax {
		return
	}
	w.cutoff = w.cutoff.Add(now.Sub(w.readAt))
	w.readAt = now
	w.after = w.resume
	w.done = false
}

// retentionCycle works every table off, from one reading of the server's
// clock (the clock that wrote the timestamps; each table's cutoff then
// moves on by the leader's: retentionWalk.refresh) and of its checkpoint
// settings: the tables side by side, each batch run when its table is due
// (retentionBudget, with a catch-up its WAL allows: catchUpRate), and
// never two batches closer than MinPause or than the previous batch took.
// perRow carries each table's WAL per deleted row from cycle to cycle, and
// meter the other sessions' WAL rate.
func (s *Store) retentionCycle(ctx context.Context, conn *pgx.Conn, cfg RetentionConfig, perRow map[string]*walPerRow, meter *walMeter) (RetentionCycle, error) {
	now, walRate, err := readCycleStart(ctx, conn)
	if err != nil {
		return RetentionCycle{}, wrap(ctx, "retention: read the clock and the checkpoint settings", err)
	}
	walCap := cfg.CheckpointShare * walRate
	start := cfg.now()
	walks := make([]*retentionWalk, len(retentionPlan))
	for i, t := range retentionPlan {
		walks[i] = &retentionWalk{table: t, cutoff: now.Add(-t.keep(cfg)), readAt: start,
			from: pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, sched: retentionSchedule{due: start},
			walPerRow: perRow[t.name]}
	}
	cycle := RetentionCycle{Deleted: make(map[string]int64, len(retentionPlan))}
	var ready time.Time // MinPause after the previous batch
	for {
		var w *retentionWalk
		walking := 0
		at := cfg.now()
		for _, c := range walks {
			// Every table's, not only the one that just ran: a table
			// that ended early (few rows) keeps up while another's
			// backlog holds the cycle open.
			c.refresh(at, start)
			if !c.done {
				walking++
				if w == nil || c.sched.due.Before(w.sched.due) {
					w = c
				}
			}
		}
		if w == nil {
			return cycle, nil
		}
		if !cfg.sleep(ctx, maxTime(w.sched.due, ready).Sub(cfg.now())) && ctx.Err() != nil {
			return cycle, ctx.Err()
		}
		began := cfg.now()
		// A batch once begun runs to its end, whatever ctx does: a DELETE
		// cancelled midway may still have committed, and its rows would
		// go uncounted. Its statement_timeout bounds it on the server;
		// twice that bounds it here, should the connection hang.
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*cfg.StatementTimeout)
		b, err := s.retentionBatch(bctx, conn, cfg, w, began, catchUpRate(cfg.CatchUpRate, walCap, w.walPerRow.bytes(), walking), meter)
		if err != nil {
			err = wrap(bctx, "retention: delete from "+w.table.name, err)
		}
		cancel()
		if b.n > 0 {
			cycle.Deleted[w.table.name] += b.n
			if cfg.OnDeleted != nil {
				cfg.OnDeleted(w.table.name, b.n)
			}
		}
		if err != nil {
			return cycle, err
		}
		// Never busy more than half the time, whatever the schedule
		// asks: a batch that took long met a busy database, and the
		// callbacks come first. Where the database cannot give retention
		// what ages out, the tables grow and the oldest row's age says so.
		ended := cfg.now()
		ready = ended.Add(max(cfg.MinPause, ended.Sub(began)))
		cycle.WAL += max(b.wal, 0)
		cycle.OthersWAL += b.others
		if b.n > 0 {
			w.walPerRow.add(b.wal, b.n)
		}
	}
}

// sqlCycleStart reads the server's clock and the settings its checkpoints
// come by (max_wal_size in MB, checkpoint_timeout in seconds); a setting
// it cannot read is 0, which leaves the catch-up uncapped.
const sqlCycleStart = `SELECT now(),
  coalesce((SELECT setting::float8 FROM pg_settings WHERE name = 'max_wal_size'), 0),
  coalesce((SELECT setting::float8 FROM pg_settings WHERE name = 'checkpoint_timeout'), 0),
  coalesce((SELECT setting::float8 FROM pg_settings WHERE name = 'checkpoint_completion_target'), 0)`

// readCycleStart reads the server's clock and the checkpoints' WAL rate
// (checkpointWALRate of its settings).
func readCycleStart(ctx context.Context, q rowQuerier) (time.Time, float64, error) {
	var now time.Time
	var maxWALMB, timeoutSec, completion float64
	if err := q.QueryRow(ctx, sqlCycleStart).Scan(&now, &maxWALMB, &timeoutSec, &completion); err != nil {
		return time.Time{}, 0, err
	}
	return now, checkpointWALRate(maxWALMB, timeoutSec, completion), nil
}

// sqlWALPosition is the server's WAL insert position, in bytes.
const sqlWALPosition = `SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::int8`

// retentionBatchResult is what one batch did.
type retentionBatchResult struct {
	// n is how many rows it deleted.
	n int64
	// wal is the WAL it wrote, in bytes, and others what other sessions
	// wrote while it ran (walMeter's estimates: wal may be below zero).
	wal, others int64
}

// retentionBatch runs w's next batch, begun at began, moves w on past it
// (its cursor, its schedule at the insert rate plus catchUp, done once
// nothing old enough is left), and returns what it did, its WAL told from
// others' by meter.
func (s *Store) retentionBatch(ctx context.Context, conn *pgx.Conn, cfg RetentionConfig, w *retentionWalk, began time.Time, catchUp float64, meter *walMeter) (retentionBatchResult, error) {
	var r retentionBatchResult
	var walBefore, walAfter int64
	if err := conn.QueryRow(ctx, sqlWALPosition).Scan(&walBefore); err != nil {
		return r, err
	}
	walFrom := cfg.now()
	var oldest, newest pgtype.Timestamptz
	// n is r.n only once the statement has succeeded: a Scan that fails
	// (a commit refused, the connection lost) may have filled it in for
	// rows that were never deleted.
	var n int64
	if w.table.byID {
		var read int64
		var lastOld bool
		if err := conn.QueryRow(ctx, w.table.batch, w.cutoff, w.after, cfg.Batch).Scan(&n, &oldest, &newest, &read, &lastOld, &w.after, &w.resume); err != nil {
			return r, err
		}
		r.n = n
		w.done = read < int64(cfg.Batch) || !lastOld
	} else {
		if err := conn.QueryRow(ctx, w.table.batch, w.cutoff, w.from, cfg.Batch).Scan(&n, &oldest, &newest); err != nil {
			return r, err
		}
		r.n = n
		// A short batch means nothing old enough is left but rows other
		// transactions hold: the next cycle takes those.
		w.done = r.n < int64(cfg.Batch)
	}
	if err := conn.QueryRow(ctx, sqlWALPosition).Scan(&walAfter); err != nil {
		return r, err
	}
	r.wal, r.others = meter.batch(walBefore, walFrom, walAfter, cfg.now())
	if r.n == 0 {
		return r, nil
	}
	// The time the batch's rows were inserted over: since the previous
	// batch's newest row, or across its own rows for a table's first.
	since := w.newest
	if since.IsZero() {
		since = oldest.Time
	}
	w.sched.next(began, retentionBudget(r.n, newest.Time.Sub(since), catchUp))
	w.newest = maxTime(w.newest, newest.Time)
	w.from = newest
	return r, nil
}

// sqlOldestRowAges reads, per table, the age of the oldest row retention
// would delete once it is old enough (0 when there is none): each is one
// probe at the low end of an index (0001, 0006; the outbox's primary key:
// its first row, by id, if it is published), past the claims under review.
const sqlOldestRowAges = `SELECT
  coalesce(extract(epoch FROM now() - (SELECT created_at FROM notify_claim
     WHERE ` + sqlClaimNotUnderReview + ` ORDER BY created_at LIMIT 1)), 0)::float8,
  coalesce(extract(epoch FROM now() - (SELECT published_at FROM outbox ORDER BY id LIMIT 1)), 0)::float8,
  coalesce(extract(epoch FROM now() - (SELECT min(processed_at) FROM consumer_inbox)), 0)::float8,
  coalesce(extract(epoch FROM now() - (SELECT min(resolved_at) FROM notify_review WHERE resolved_at IS NOT NULL)), 0)::float8,
  coalesce(extract(epoch FROM now() - (SELECT min(created_at) FROM notify_trace)), 0)::float8`

// OldestRowAges returns, by table (RetentionTables), the age of its oldest
// row of the kind retention deletes: a claim no open review names, by
// created_at, a published outbox row by published_at, a consumer-inbox row
// by processed_at, a resolved review row by resolved_at, a trace context
// by created_at; 0 when the table holds none. For the outbox it is the
// first row's, in id order, the row retention deletes next; 0 when that
// row is not published yet (then the relay is behind, not retention:
// notifyedge_outbox_oldest_pending_seconds). An age well past its
// retention (plus the retention interval) means retention is not keeping
// up, or not running. It reads on the operator pool, one index
// probe per table, under the same planner settings as OutboxBacklog (stale
// statistics must not turn a probe into a scan).
func (s *Store) OldestRowAges(ctx context.Context) (map[string]time.Duration, error) {
	var secs [5]float64
	err := pgx.BeginTxFunc(ctx, s.ops, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlIndexOrderOnly); err != nil {
			return fmt.Errorf("planner settings: %w", err)
		}
		return tx.QueryRow(ctx, sqlOldestRowAges).Scan(&secs[0], &secs[1], &secs[2], &secs[3], &secs[4])
	})
	if err != nil {
		return nil, wrap(ctx, "oldest row ages", err)
	}
	out := make(map[string]time.Duration, len(RetentionTables))
	for i, t := range RetentionTables {
		out[t] = time.Duration(max(secs[i], 0) * float64(time.Second))
	}
	return out, nil
}
