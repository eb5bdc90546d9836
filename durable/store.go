package durable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Errors returned by durable. Infrastructure failures are wrapped with the
// operation; a deadline that expired keeps errors.Is(err,
// context.DeadlineExceeded) true.
var (
	// ErrTimeout marks a statement the server cancelled because it ran past
	// statement_timeout or lock_timeout; the transaction was rolled back.
	ErrTimeout = errors.New("durable: server-side timeout")
	// ErrInvalid marks a Notification that breaks the README's field rules:
	// a caller bug, since the edge validates first.
	ErrInvalid = errors.New("durable: invalid notification")
	// ErrUnknownOrder is returned by Transition for an order that does not
	// exist.
	ErrUnknownOrder = errors.New("durable: unknown order")
	// ErrOrderChanged marks a call that gave up because another writer kept
	// changing the order under it: rewrote its amount or currency, deleted
	// it, or moved it on again and again. durable's functions raise SQLSTATE
	// 40001 (serialization_failure) then, so the transaction rolled back and
	// stored nothing: retrying the call decides afresh.
	ErrOrderChanged = errors.New("durable: order changed during the call, nothing stored")
)

// Config configures a Store. Zero fields take the defaults noted.
type Config struct {
	// URL is the Postgres connection string (DATABASE_URL).
	URL string
	// Application is the pools' application_name where URL sets none
	// (default "notifyedge", the callbacks'): a process other than edged
	// names its sessions, so that the server's activity and lock-wait logs
	// tell them from the callbacks'.
	Application string
	// MaxConns caps the pool (default 32). pgxpool's own default is
	// max(4, NumCPU): far too few for a callback storm.
	MaxConns int32
	// MinConns is how many connections are opened and prepared before New
	// returns (default MaxConns/2): a cold connection costs 100-150 ms under
	// load, most of the latency budget.
	MinConns int32
	// StatementTimeout is the server-side statement_timeout of every pooled
	// connection (default 5s). The edge sets it a little under its budget,
	// so the server gives up even when the client cannot tell it to.
	StatementTimeout time.Duration
	// LockTimeout is the server-side lock_timeout (default StatementTimeout).
	LockTimeout time.Duration
	// IdleInTxTimeout ends a transaction its client abandoned (default 10s).
	IdleInTxTimeout time.Duration
	// OpsMaxConns caps the operator pool (default 4): the few connections
	// that serve metric scrapes, the review queue (OpenReviews,
	// OutboxBacklog, Reviews, ResolveReview) and the orders API (PutOrder,
	// PatchOrder, OrderHistory, OrderEvent), so that no number of scrapers,
	// listings or order systems can take a connection from a callback.
	// Operator calls beyond it queue on this pool, bounded by their own
	// context.
	OpsMaxConns int32
	// OpsStatementTimeout is the operator pool's statement_timeout (default
	// 5s): an operator read may take longer than a callback's budget allows,
	// and must not inherit it.
	OpsStatementTimeout time.Duration
	// OpsLockTimeout is the operator pool's lock_timeout (default
	// OpsStatementTimeout).
	OpsLockTimeout time.Duration
	// Tracer, if set, traces every query of both pools (e.g. to count
	// statements in tests).
	Tracer pgx.QueryTracer
	// NoMigrate skips migrations in New (for nodes that must not change the
	// schema; the schema must then be current).
	NoMigrate bool
	// GroupCommit decides concurrent deliveries together, one transaction
	// per batch (see "Why batches" in the package doc). Off, every delivery
	// is a transaction of its own. Answers are the same either way.
	GroupCommit bool
	// GroupBatches is how many transactions group commit may have in
	// flight at once (default 2): one batch at a time (a second would
	// split the same deliveries into smaller batches), and beside it lone
	// deliveries, which may wait for a lock: while a slot is free, a
	// waiting delivery holds back none of the rest.
	GroupBatches int
	// GroupSize caps a batch's deliveries (default 64).
	GroupSize int
	// GroupLockTimeout is a batch's lock_timeout (default 50ms): a batch
	// tries every lock and waits for none it can foresee; this bounds what
	// it cannot (a claim retention is deleting), after which its deliveries
	// are decided one by one.
	GroupLockTimeout time.Duration
	// GroupLinger is how long a batch that just ended waits for the
	// deliveries of the next one when none queued behind it (default 3ms;
	// negative: never). Under load, the callers a batch answered come back
	// within a few milliseconds: without the wait, the first of them starts
	// a transaction of its own, which costs Postgres about what a batch of
	// five does. A batch of one never waits: one caller at a time never has
	// company to wait for.
	GroupLinger time.Duration
	// CommitWait bounds how long a write whose success is answered may run
	// on past its caller's deadline (default 1m; 0 or less: the default):
	// decisions (callbacks and reconciliation), shipments, transitions, the
	// orders API's writes and review resolutions (Store.commit). It is not
	// cancelled at the deadline, because a cancel that reaches a commit
	// waiting for its synchronous standby ends the wait with the commit
	// made on the primary only and visible: a retry would be replayed
	// SUCCESS from a row no standby has, and a failover would lose it.
	// Process and ProcessOps still answer by their caller's deadline (an
	// error) while the statement runs on; the other writes return when
	// they end. Execution is bounded by statement_timeout and lock_timeout
	// on the server; only the standby's acknowledgement is waited for this
	// long, past which the statement is cancelled after all and the write
	// is an error (ErrTimeout). Close waits for such statements to end: up
	// to this long after a stall.
	CommitWait time.Duration
}

func (c Config) withDefaults() Config {
	c.MaxConns = cmp.Or(c.MaxConns, 32)
	c.MinConns = cmp.Or(c.MinConns, max(c.MaxConns/2, 1))
	c.StatementTimeout = cmp.Or(c.StatementTimeout, 5*time.Second)
	c.LockTimeout = cmp.Or(c.LockTimeout, c.StatementTimeout)
	c.IdleInTxTimeout = cmp.Or(c.IdleInTxTimeout, 10*time.Second)
	c.OpsMaxConns = cmp.Or(c.OpsMaxConns, 4)
	c.OpsStatementTimeout = cmp.Or(c.OpsStatementTimeout, 5*time.Second)
	c.OpsLockTimeout = cmp.Or(c.OpsLockTimeout, c.OpsStatementTimeout)
	c.GroupBatches = cmp.Or(c.GroupBatches, 2)
	c.GroupSize = cmp.Or(c.GroupSize, 64)
	c.GroupLockTimeout = cmp.Or(c.GroupLockTimeout, 50*time.Millisecond)
	c.GroupLinger = cmp.Or(c.GroupLinger, 3*time.Millisecond)
	c.CommitWait = cmp.Or(max(c.CommitWait, 0), time.Minute)
	return c
}

// Store is the durable authority over one Postgres database. It is safe for
// concurrent use; several Stores (nodes) may share one database.
//
// It holds two pools: the callback pool (Config.MaxConns, the callback
// budget's timeouts) for deliveries and transitions, and the small
// operator pool (Config.OpsMaxConns, its own timeouts) for metric scrapes,
// the review queue and the orders API, which never touch the callback pool.
type Store struct {
	pool         *pgxpool.Pool // callbacks, transitions, the relay's notifier
	ops          *pgxpool.Pool // operator reads, review resolutions, the orders API
	group        *group        // nil: one transaction per delivery
	commitWait   time.Duration // Config.CommitWait
	pokes        chan struct{}
	closing      chan struct{}
	closeOnce    sync.Once
	notifierDone chan struct{}
	// relayWoken is set by a notification on the relay's connection and
	// cleared as the relay goes to read: however many came meanwhile, one
	// read covers them all.
	relayWoken atomic.Bool
}

// preparedStatements are prepared on every new connection, so that the first
// request on a connection does not pay a Parse round trip.
var preparedStatements = []string{sqlProcess, sqlTransition, sqlProcessBatch}

// New connects to cfg.URL, migrates the schema (unless cfg.NoMigrate) and
// opens and prepares cfg.MinConns connections of the callback pool before
// it returns. The operator pool connects on first use, so it adds nothing
// to start-up or to the callback path.
func New(ctx context.Context, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if cfg.MinConns > cfg.MaxConns {
		return nil, fmt.Errorf("durable: MinConns %d > MaxConns %d", cfg.MinConns, cfg.MaxConns)
	}
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	if !cfg.NoMigrate {
		if err := runMigrations(ctx, pc.ConnConfig.Copy()); err != nil {
			return nil, err
		}
	}
	app := cmp.Or(pc.ConnConfig.RuntimeParams["application_name"], cfg.Application, "notifyedge")
	oc := pc.Copy()

	pc.MaxConns, pc.MinConns = cfg.MaxConns, cfg.MinConns
	setSession(pc, cfg, cfg.StatementTimeout, cfg.LockTimeout, app)
	// Every statement here is a primary-key or unique-index probe: a generic
	// plan is always right, and re-planning custom plans (the default for the
	// first executions, and whenever Postgres hesitates) cost ~10 % of
	// first-delivery throughput on two cores.
	pc.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	pc.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		for _, q := range preparedStatements {
			if _, err := c.Prepare(ctx, q, q); err != nil {
				return fmt.Errorf("prepare: %w", err)
			}
		}
		return nil
	}

	// The operator pool keeps the default plan_cache_mode (its queries filter
	// on parameters a custom plan can fold into an index choice), prepares
	// nothing up front and opens no connection until an operator read needs
	// one. Its own application_name tells its sessions apart in
	// pg_stat_activity.
	oc.MaxConns, oc.MinConns = cfg.OpsMaxConns, 0
	setSession(oc, cfg, cfg.OpsStatementTimeout, cfg.OpsLockTimeout, app+"-ops")

	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	ops, err := pgxpool.NewWithConfig(ctx, oc)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("open operator pool: %w", err)
	}
	s := &Store{pool: pool, ops: ops, commitWait: cfg.CommitWait, pokes: make(chan struct{}, 1), closing: make(chan struct{}), notifierDone: make(chan struct{})}
	if cfg.GroupCommit {
		s.group = newGroup(s, cfg)
	}
	if err := s.warm(ctx, int(cfg.MinConns)); err != nil {
		pool.Close()
		ops.Close()
		return nil, err
	}
	go s.notifier()
	return s, nil
}

// setSession sets what both pools configure alike, with each pool's own
// timeouts and application_name.
func setSession(pc *pgxpool.Config, cfg Config, statement, lock time.Duration, app string) {
	if cfg.Tracer != nil {
		pc.ConnConfig.Tracer = cfg.Tracer
	}
	rp := pc.ConnConfig.RuntimeParams
	rp["statement_timeout"] = ms(statement)
	rp["lock_timeout"] = ms(lock)
	rp["idle_in_transaction_session_timeout"] = ms(cfg.IdleInTxTimeout)
	rp["application_name"] = app
	// Every statement here walks a few index entries. JIT compiles a
	// statement whose estimated cost passes jit_above_cost, and a step the
	// planner must avoid (retention's and the operator reads' disabled
	// sorts and scans) is priced at 10^10: an outbox retention batch spent
	// 140 ms compiling 35 functions to run 2 ms of work. The relay's and
	// retention's sessions copy this pool's settings.
	rp["jit"] = "off"
	// On a deadline, ask the server to cancel at once (a running statement
	// rolls back and the connection stays usable); close the socket only
	// if it does not answer. A commit waiting for its synchronous standby
	// is not rolled back by a cancel: it ends the wait, committed on the
	// primary only. pgx sends a cancel request whenever it gives up on a
	// connection, so the writes whose success is answered get no deadline
	// from their caller at all (Store.commit, Config.CommitWait).
	pc.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 50 * time.Millisecond}
	}
}

// commit runs f, a write whose success is answered to someone (a
// decision, a shipment), on a connection of pool taken within ctx's
// deadline, under ctx's values (its trace) without ctx's deadline, for up
// to CommitWait (see Config.CommitWait): it returns when f does, which may
// be after ctx's deadline. A write whose CommitWait ran out is an error
// even when pgx reports success: the cancel it then sent may have ended
// the commit's wait for its standby, and pgx answers that with success.
func (s *Store) commit(ctx context.Context, pool *pgxpool.Pool, f func(ctx context.Context, conn *pgxpool.Conn) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if err := ctx.Err(); err != nil {
		return err // the caller has gone: start nothing for it
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.commitWait)
	defer cancel()
	err = f(cctx, conn)
	if cerr := cctx.Err(); cerr != nil {
		return fmt.Errorf("%w: the write ran past CommitWait (%s), its standby's acknowledgement unknown: %w", ErrTimeout, s.commitWait, errors.Join(cerr, err))
	}
	return err
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// warm holds n connections at once, so that n are open and prepared.
func (s *Store) warm(ctx context.Context, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("warm pool: %w", err)
		}
		conns = append(conns, c)
	}
	return nil
}

// GroupStats returns group commit's counters (nil when it is off).
func (s *Store) GroupStats() *GroupStats {
	if s.group == nil {
		return nil
	}
	return &s.group.stats
}

// Ping reports whether Postgres answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return wrap(ctx, "ping", err)
	}
	return nil
}

// Close closes both pools, waiting for connections in use to be released.
// A second call returns at once.
func (s *Store) Close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		<-s.notifierDone
		s.pool.Close()
		s.ops.Close()
	})
}

// wrap adds the operation to err and keeps the cause testable: a context
// that ended makes errors.Is(err, ctx.Err()) true even when the server
// reported the cancellation first; server-side timeouts are ErrTimeout, and
// serialization failures (under READ COMMITTED, the default, only durable's
// functions raise them) are ErrOrderChanged. The *pgconn.PgError stays in
// the chain.
func wrap(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%s: %w (%w)", op, cerr, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57014", "55P03": // query_canceled, lock_not_available
			return fmt.Errorf("%s: %w: %w", op, ErrTimeout, err)
		case "40001": // serialization_failure
			return fmt.Errorf("%s: %w: %w", op, ErrOrderChanged, err)
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}
