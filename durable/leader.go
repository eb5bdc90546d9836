package durable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/notifyedge/notifyedge/durable/wait"
)

// One node at a time does each of the background roles (the outbox relay,
// retention, reconciliation, the daily bills): the holder of a session
// advisory lock of the role's own, on a connection of its own. The lock
// goes with the session, so a node that dies, or whose network vanishes
// (once the server notices: tcp_keepalives_idle), lets another take over.
//
// Standbys poll pg_try_advisory_lock rather than wait in pg_advisory_lock:
// a statement that waits holds its snapshot for as long as it waits, which
// keeps vacuum from removing any row deleted after it began and makes
// CREATE INDEX CONCURRENTLY (a migration) wait for it, while the
// migration's node waits for the lock: a deadlock.

// The states a role's OnState hears.
const (
	StateLeader  = "leader"
	StateStandby = "standby"
)

// LeaderConfig configures RunLeader. Zero fields take the defaults noted.
type LeaderConfig struct {
	// Name names the role: its session's application_name is
	// "notifyedge-"+Name (pg_stat_activity tells the roles apart by it),
	// and its errors say it.
	Name string
	// LockID is the role's advisory lock.
	LockID int64
	// Retry is how often a standby tries for the lock (default 1s): a
	// takeover follows a leader's end within about this long.
	Retry time.Duration
	// AfterError is the wait after a leadership that ended in an error
	// (default Retry).
	AfterError time.Duration
	// KeepConnection keeps a standby's connection between tries (a
	// takeover without a reconnect); otherwise each try connects anew and
	// a standby holds no connection in between.
	KeepConnection bool
	// Eligible, when set, says whether this node may lead now (e.g. it
	// has the credentials the role needs): while it says no, the node does
	// not try for the lock, so a node that could do nothing never holds it
	// from one that could. lead returns once it no longer may.
	Eligible func() bool
	// Session adjusts the session's parameters (timeouts,
	// synchronous_commit) of a copy of the operator pool's.
	Session func(*pgx.ConnConfig)
	// base, when set, is the session's configuration instead (durable's
	// own roles: the relay and retention start from the callbacks' pool,
	// with its generic plans and its application_name).
	base func() *pgx.ConnConfig
	// OnState hears StateLeader and StateStandby.
	OnState func(string)
	// OnError hears each error a leadership or a try ended with.
	OnError func(error)
}

// leaderCheck is how often a leadership whose role does not use the lock's
// connection pings it: a lost session is noticed within about this long.
const leaderCheck = 2 * time.Second

// ErrNotLeader: another session holds the lock.
var ErrNotLeader = errors.New("durable: another node leads")

// RunLeader runs lead while this node holds cfg.LockID, and tries for the
// lock every Retry while another node does, until ctx ends. lead's context
// ends with ctx, or when the lock's session is found lost (it is pinged
// every few seconds: the lock went with it, and another node may lead);
// whatever lead returns, the lock is released and the node stands by
// again.
func (s *Store) RunLeader(ctx context.Context, cfg LeaderConfig, lead func(ctx context.Context) error) {
	s.runLeader(ctx, cfg, false, func(ctx context.Context, _ *pgx.Conn) error { return lead(ctx) })
}

// runLeader is RunLeader for durable's own roles too: with usesConn, lead
// works on the lock's connection (the relay, retention), whose own queries
// notice a lost session, and it is not pinged.
func (s *Store) runLeader(ctx context.Context, cfg LeaderConfig, usesConn bool, lead func(ctx context.Context, conn *pgx.Conn) error) {
	cfg.Retry = cmp.Or(cfg.Retry, time.Second)
	cfg.AfterError = cmp.Or(cfg.AfterError, cfg.Retry)
	state := func(st string) {
		if cfg.OnState != nil {
			cfg.OnState(st)
		}
	}
	fail := func(err error) {
		if cfg.OnError != nil && err != nil && ctx.Err() == nil {
			cfg.OnError(err)
		}
	}
	state(StateStandby)
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for ctx.Err() == nil {
		if cfg.Eligible != nil && !cfg.Eligible() {
			if conn != nil {
				conn.Close(context.WithoutCancel(ctx))
				conn = nil
			}
			wait.Sleep(ctx, cfg.Retry)
			continue
		}
		if conn == nil {
			var err error
			if conn, err = s.leaderConn(ctx, cfg); err != nil {
				fail(err)
				wait.Sleep(ctx, cfg.AfterError)
				continue
			}
		}
		var held bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, cfg.LockID).Scan(&held); err != nil {
			fail(wrap(ctx, cfg.Name+": try for leadership", err))
			conn.Close(context.WithoutCancel(ctx))
			conn = nil
			wait.Sleep(ctx, cfg.AfterError)
			continue
		}
		if !held {
			if !cfg.KeepConnection {
				conn.Close(context.WithoutCancel(ctx))
				conn = nil
			}
			wait.Sleep(ctx, cfg.Retry)
			continue
		}
		state(StateLeader)
		err := s.holding(ctx, cfg, conn, usesConn, lead)
		release(ctx, conn, cfg.LockID)
		state(StateStandby)
		conn = nil
		if err != nil && ctx.Err() == nil {
			fail(err)
			wait.Sleep(ctx, cfg.AfterError)
		}
	}
}

// leaderConn connects the role's session.
func (s *Store) leaderConn(ctx context.Context, cfg LeaderConfig) (*pgx.Conn, error) {
	var cc *pgx.ConnConfig
	if cfg.base != nil {
		cc = cfg.base()
	} else {
		cc = s.ops.Config().ConnConfig.Copy()
		cc.RuntimeParams["application_name"] = "notifyedge-" + cfg.Name
	}
	if cfg.Session != nil {
		cfg.Session(cc)
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("%s: connect: %w", cfg.Name, err)
	}
	return conn, nil
}

// holding runs lead on conn, whose lock is held; unless lead uses the
// connection, it pings it every leaderCheck and ends lead's context when
// it fails.
func (s *Store) holding(ctx context.Context, cfg LeaderConfig, conn *pgx.Conn, usesConn bool, lead func(context.Context, *pgx.Conn) error) error {
	if usesConn {
		return lead(ctx, conn)
	}
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	lost := make(chan error, 1)
	// The pings are the connection's only user: they end before it closes.
	var checking sync.WaitGroup
	checking.Add(1)
	go func() {
		defer checking.Done()
		t := time.NewTicker(leaderCheck)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				pctx, pcancel := context.WithTimeout(lctx, leaderCheck)
				err := conn.Ping(pctx)
				pcancel()
				if err != nil && lctx.Err() == nil {
					err = fmt.Errorf("%s: the leadership's connection failed: %w", cfg.Name, err)
					lost <- err
					cancel(err)
					return
				}
			}
		}
	}()
	err := lead(lctx, nil)
	close(done)
	checking.Wait()
	select {
	case l := <-lost:
		return l
	default:
	}
	return err
}

// WithLock runs run while holding the session advisory lock lockID, tried
// once on a connection of its own: ErrNotLeader when another session holds
// it. For one-off work that must not run twice at once (a day's bill run),
// not for a role that leads. run's context ends when the lock's session is
// found lost.
func (s *Store) WithLock(ctx context.Context, lockID int64, name string, run func(context.Context) error) error {
	cfg := LeaderConfig{Name: name, LockID: lockID}
	conn, err := s.leaderConn(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var held bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, lockID).Scan(&held); err != nil {
		return wrap(ctx, name+": try for the lock", err)
	}
	if !held {
		return ErrNotLeader
	}
	defer release(ctx, conn, lockID)
	return s.holding(ctx, cfg, conn, false, func(ctx context.Context, _ *pgx.Conn) error { return run(ctx) })
}

// release gives the lock up and ends the session. The unlock comes first:
// a closed connection's backend may take a moment to exit, and until it
// has, the lock would still be held from the next one to try.
func release(ctx context.Context, conn *pgx.Conn, lockID int64) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, lockID) // a dead session has released it already
	cancel()
	conn.Close(context.WithoutCancel(ctx))
}
