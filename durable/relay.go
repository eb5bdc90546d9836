package durable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/codes"

	"github.com/notifyedge/notifyedge/durable/outbox"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// OutboxMessage is one outbox row as the relay publishes it
// (outbox.Message: brokers need not import durable).
type OutboxMessage = outbox.Message

// Publisher delivers outbox rows to a downstream broker (outbox.Publisher).
type Publisher = outbox.Publisher

// RelayConfig configures RunRelay. Zero fields take the defaults noted.
type RelayConfig struct {
	// Publisher is the broker (required).
	Publisher Publisher
	// Batch is how many rows one publish carries (default 500).
	Batch int
	// Poll is the fallback wake-up when no notification arrives (default 1s).
	Poll time.Duration
	// LockID is the advisory lock that elects the leader (default a fixed id).
	LockID int64
	// OnState hears "running" (this node is the leader), "degraded" (the
	// leader, while the broker holds rows it has not confirmed) and
	// "standby".
	OnState func(state string)
	// OnUnconfirmed hears each publish the broker holds but has not
	// confirmed (outbox.ErrUnconfirmed: e.g. too few replicas): the rows
	// stay unpublished and are checked again every Poll, and the rows
	// behind them wait.
	OnUnconfirmed func(error)
	// OnError hears every failure the relay recovers from by retrying.
	OnError func(error)
}

// RelayApplication is the application_name of the relay's connection:
// monitoring (pg_stat_activity) tells its session from the nodes' by it.
const RelayApplication = "notifyedge-relay"

// outboxChannel is the LISTEN/NOTIFY channel that wakes the relay.
const outboxChannel = "notifyedge_outbox"

const relayLockID = int64(0x6e6f74696679) // "notify"

// RunRelay publishes unpublished outbox rows, in id order, and marks them
// published once the broker acknowledged them: at least once to the broker
// (a crash between publish and mark re-sends; consumers dedup on the outbox
// id). One relay is active at a time across nodes (RunLeader): the leader
// works on the lock's connection; a standby keeps its connection and tries
// for the lock every 100 ms, so it takes over within about that long of
// the leader's session ending. RunRelay returns when ctx ends.
func (s *Store) RunRelay(ctx context.Context, cfg RelayConfig) error {
	if cfg.Publisher == nil {
		return errors.New("durable: relay without a Publisher")
	}
	cfg.Batch = cmp.Or(cfg.Batch, 500)
	cfg.Poll = cmp.Or(cfg.Poll, time.Second)
	cfg.LockID = cmp.Or(cfg.LockID, relayLockID)
	state := func(st string) {
		if cfg.OnState != nil {
			cfg.OnState(st)
		}
	}
	s.runLeader(ctx, LeaderConfig{Name: relayName, LockID: cfg.LockID, Retry: leaderPoll, AfterError: cfg.Poll,
		KeepConnection: true, base: s.relayConnConfig, OnError: cfg.OnError,
		// The relay's own words for the leader: running (or degraded).
		OnState: func(st string) {
			if st == StateStandby {
				state(StateStandby)
			}
		},
	}, true, func(ctx context.Context, conn *pgx.Conn) error { return s.relayLead(ctx, conn, cfg, state) })
	return nil
}

// relayName names the relay's session: "notifyedge-relay"
// (RelayApplication).
const relayName = "relay"

// leaderPoll is how often a standby relay tries for leadership: a
// takeover follows a leader's end within about this long.
const leaderPoll = 100 * time.Millisecond

// relayLead relays while this node holds the relay's lock on conn, until
// an error or ctx ends.
func (s *Store) relayLead(ctx context.Context, conn *pgx.Conn, cfg RelayConfig, state func(string)) error {
	state("running")
	if _, err := conn.Exec(ctx, "LISTEN "+outboxChannel); err != nil {
		return fmt.Errorf("relay: listen: %w", err)
	}
	// While the broker holds rows it has not confirmed, they stay
	// unpublished and are read again, first in id order, every Poll: the
	// broker checks them again, and the rows behind them wait (a read
	// past them would append a row that commits late below them after a
	// later event of its order).
	degraded := false
	for {
		started := time.Now()
		n, err := s.relayBatch(ctx, conn, cfg)
		switch {
		case errors.Is(err, outbox.ErrUnconfirmed):
			if !degraded {
				degraded = true
				state("degraded")
			}
			if cfg.OnUnconfirmed != nil {
				cfg.OnUnconfirmed(err)
			}
			wait.Sleep(ctx, cfg.Poll)
			if ctx.Err() != nil {
				return nil
			}
			continue
		case err != nil:
			return err
		}
		if degraded {
			degraded = false
			state("running")
		}
		if n == cfg.Batch {
			continue // more waiting
		}
		// A notification that came during the batch means rows the batch
		// may not have read: read again at once.
		if !s.relayWoken.Swap(false) {
			wctx, cancel := context.WithTimeout(ctx, cfg.Poll)
			err = conn.PgConn().WaitForNotification(wctx)
			cancel()
			s.relayWoken.Store(false)
			if err != nil && ctx.Err() != nil {
				return nil
			}
			if err != nil && !errors.Is(err, context.DeadlineExceeded) && !pgconn.Timeout(err) {
				return fmt.Errorf("relay: wait: %w", err)
			}
		}
		// Under load, wake-ups come every few milliseconds: the rows of
		// several go in one batch (one read, one publish, one mark).
		if d := relayPace - time.Since(started); d > 0 {
			wait.Sleep(ctx, d)
		}
	}
}

const (
	// The trace context is a probe of notify_trace's primary key per row,
	// by the biz_key a callback's payload names (a scalar subquery, so the
	// walk of the unpublished rows is planned as before).
	sqlUnpublished = `SELECT id, coalesce(event_id::text, ''), topic, order_no, payload::text, created_at,
       coalesce((SELECT t.traceparent FROM notify_trace t WHERE t.biz_key = outbox.payload->>'biz_key'), '')
  FROM outbox
WHERE published_at IS NULL ORDER BY id LIMIT $1`
	sqlMarkPublished = `UPDATE outbox SET published_at = now() WHERE id = ANY($1) AND published_at IS NULL`
)

// relayBatch publishes and marks one batch; it returns the batch's size.
// An error wrapping outbox.ErrUnconfirmed: the broker holds the batch, and
// it stays unmarked.
func (s *Store) relayBatch(ctx context.Context, conn *pgx.Conn, cfg RelayConfig) (int, error) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rows, err := conn.Query(qctx, sqlUnpublished, cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("relay: read outbox: %w", err)
	}
	msgs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxMessage, error) {
		var m OutboxMessage
		var payload string
		err := r.Scan(&m.ID, &m.EventID, &m.Topic, &m.OrderNo, &payload, &m.CreatedAt, &m.Traceparent)
		m.Payload = []byte(payload)
		return m, err
	})
	if err != nil {
		return 0, fmt.Errorf("relay: read outbox: %w", err)
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	pctx, span := relaySpan(qctx, msgs)
	err = s.publishAndMark(pctx, conn, cfg, msgs)
	if span != nil {
		if err != nil {
			span.SetStatus(codes.Error, "publish failed")
		}
		span.End()
	}
	if err != nil {
		return 0, err
	}
	return len(msgs), nil
}

// publishAndMark publishes msgs and marks their rows published.
func (s *Store) publishAndMark(ctx context.Context, conn *pgx.Conn, cfg RelayConfig, msgs []OutboxMessage) error {
	if err := cfg.Publisher.Publish(ctx, msgs); err != nil {
		return fmt.Errorf("relay: publish %d rows from id %d: %w", len(msgs), msgs[0].ID, err)
	}
	ids := make([]int64, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	if _, err := conn.Exec(ctx, sqlMarkPublished, ids); err != nil {
		return fmt.Errorf("relay: mark published: %w", err)
	}
	return nil
}

// relayConnConfig is the relay's own connection: no timeouts (it holds the
// leader's lock and waits for notifications), a name of its own.
func (s *Store) relayConnConfig() *pgx.ConnConfig {
	cc := s.pool.Config().ConnConfig.Copy()
	for _, p := range []string{"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"} {
		delete(cc.RuntimeParams, p)
	}
	cc.RuntimeParams["application_name"] = RelayApplication
	// Marking rows published need not wait for the disk: a mark lost in a
	// crash only sends its rows again, which consumers dedup on the outbox
	// id (at least once, as a crash between publish and mark already does).
	// The mark's commit was a flush of its own several hundred times a
	// second under load.
	cc.RuntimeParams["synchronous_commit"] = "off"
	// Notifications only wake the relay: note that one came, keep none.
	// pgx's default keeps each in a slice the relay took one from per
	// batch, and the callbacks notify faster than a busy relay loops: the
	// slice grew for as long as the load lasted (about 85 bytes a
	// notification, 0.4 MB of heap a minute at 1,900 payments a second).
	cc.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) { s.relayWoken.Store(true) }
	return cc
}

// notifyWindow coalesces wake-ups: at most one NOTIFY per window (each is
// a statement and a transaction on the callback pool). relayPace is the
// least time from one partial batch's start to the next one's. Together
// they bound what an idle outbox adds to a row's way out (about 10 ms)
// and what a busy one costs per row.
const (
	notifyWindow = 10 * time.Millisecond
	relayPace    = 10 * time.Millisecond
)

// notifier wakes the relay (on any node) after outbox rows were committed.
// The NOTIFY goes out of band, on its own statement, never inside the
// deciding transaction: a NOTIFY in a transaction takes Postgres's global
// notify lock until after commit, which would serialize every applying
// transaction's WAL flush and defeat group commit.
func (s *Store) notifier() {
	defer close(s.notifierDone)
	for {
		select {
		case <-s.closing:
			return
		case <-s.pokes:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, _ = s.pool.Exec(ctx, `SELECT pg_notify($1, '')`, outboxChannel) // the relay's poll is the fallback
		cancel()
		time.Sleep(notifyWindow)
	}
}

// poke asks the notifier for a wake-up, without waiting.
func (s *Store) poke() {
	select {
	case s.pokes <- struct{}{}:
	default:
	}
}
