package durable

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// This file is compiled into the test binary only: it lets the external
// tests (package durable_test) reach the two pools without the production
// API exporting them.

// HoldCallbackPool acquires every connection of s's callback pool and
// returns the function that gives them back, so that a test can show what
// still answers while callbacks have the whole pool.
func HoldCallbackPool(ctx context.Context, s *Store) (release func(), err error) {
	conns := make([]*pgxpool.Conn, 0, s.pool.Config().MaxConns)
	release = func() {
		for _, c := range conns {
			c.Release()
		}
		conns = nil
	}
	for range cap(conns) {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			release()
			return nil, fmt.Errorf("hold callback pool: %w", err)
		}
		conns = append(conns, c)
	}
	return release, nil
}

// ShowSetting returns a run-time parameter as a session of the callback
// pool (ops false) or of the operator pool (ops true) sees it.
func ShowSetting(ctx context.Context, s *Store, ops bool, name string) (string, error) {
	p := s.pool
	if ops {
		p = s.ops
	}
	var v string
	if err := p.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v); err != nil {
		return "", fmt.Errorf("show %s: %w", name, err)
	}
	return v, nil
}

// ExplainOutboxBacklog runs OutboxBacklog's query as OutboxBacklog does,
// under EXPLAIN (ANALYZE, FORMAT JSON), and returns the plan.
func ExplainOutboxBacklog(ctx context.Context, s *Store) ([]byte, error) {
	var plan []byte
	if err := s.inIndexOrder(ctx, "EXPLAIN (ANALYZE, TIMING off, FORMAT JSON) "+sqlOutboxBacklog, &plan); err != nil {
		return nil, fmt.Errorf("explain outbox backlog: %w", err)
	}
	return plan, nil
}

// OpsPoolStat returns the operator pool's statistics.
func OpsPoolStat(s *Store) *pgxpool.Stat { return s.ops.Stat() }

// GroupQueued is how many deliveries wait for a batch slot.
func GroupQueued(s *Store) int {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return len(s.group.queue)
}

// GroupLingering reports whether a batch that ended waits for the next
// one's deliveries, and how many runs hold a slot.
func GroupLingering(s *Store) (lingering bool, inFlight int) {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return s.group.waiting != nil, s.group.inFlight
}

// MigrationLock is the key of the migration's session advisory lock.
const MigrationLock = migrationLock

// CheckVocabulary checks the literals of the SQL functions defs (name ->
// pg_get_functiondef) against Go's vocabulary.
func CheckVocabulary(t testing.TB, defs map[string]string) { checkVocabulary(t, defs) }

// RelayPace is the least time between the relay's partial batches.
const RelayPace = relayPace

// RelaySetting returns a run-time parameter as the relay's own connection
// sees it.
func RelaySetting(ctx context.Context, s *Store, name string) (string, error) {
	conn, err := pgx.ConnectConfig(ctx, s.relayConnConfig())
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var v string
	err = conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v)
	return v, err
}

// RelayNotificationsKept LISTENs on a connection configured as the
// relay's, lets notify send n notifications from another session, reads
// them in on a query, and returns how many the connection keeps (pgx
// hands kept ones out one per WaitForNotification) and whether the relay
// would know it was woken.
func RelayNotificationsKept(ctx context.Context, s *Store, n int, notify func(context.Context) error) (kept int, woken bool, err error) {
	s.relayWoken.Store(false)
	conn, err := pgx.ConnectConfig(ctx, s.relayConnConfig())
	if err != nil {
		return 0, false, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "LISTEN "+outboxChannel); err != nil {
		return 0, false, err
	}
	for range n {
		if err := notify(ctx); err != nil {
			return 0, false, err
		}
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil { // the notifications arrive ahead of its answer
		return 0, false, err
	}
	for {
		done, cancel := context.WithCancel(ctx)
		cancel() // what is kept comes back at once; nothing is waited for
		note, _ := conn.WaitForNotification(done)
		if note == nil {
			return kept, s.relayWoken.Load(), nil
		}
		kept++
	}
}

// DecideTogether decides ns as group commit decides a batch of them (one
// alone: the one-at-a-time statement), on s's callback pool, and returns
// the first one's outcome.
func DecideTogether(ctx context.Context, s *Store, ns []Notification) (Outcome, error) {
	if len(ns) == 1 {
		r, err := s.processOn(ctx, s.pool, &ns[0])
		return r.Outcome, err
	}
	return DecideAsBatch(ctx, s, ns)
}

// DecideAsBatch decides ns through the batch statement, even one alone,
// and returns the first one's outcome.
func DecideAsBatch(ctx context.Context, s *Store, ns []Notification) (Outcome, error) {
	batch := make([]*member, len(ns))
	for i := range ns {
		batch[i] = &member{n: ns[i], ctx: ctx, out: make(chan answer, 1)}
	}
	res, _, err := s.processBatch(ctx, batch)
	if err != nil {
		return 0, err
	}
	return res[0].res.Outcome, res[0].err
}

// CallbackPool is s's callback pool, for statements a benchmark runs on
// the same sessions as Process.
func CallbackPool(s *Store) *pgxpool.Pool { return s.pool }

// CallbackBackendPID returns the backend pid of a session of s's callback
// pool (the only one, with MaxConns 1).
func CallbackBackendPID(ctx context.Context, s *Store) (pid int, err error) {
	err = s.pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
	return pid, err
}
