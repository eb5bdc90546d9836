package durable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reconciliation's bookkeeping: which PENDING_PAY orders are due for a
// query of the channel, and when each is asked next. The decision of a
// paid answer is Process's (ProcessOps); this file only schedules.
//
// An order's clock is its updated_at, the time it was registered (or last
// corrected by PATCH, which registers it again): it is first due After past
// it, and never asked once Horizon past it. reconcile_at holds the next
// query ('infinity' once nothing is to be asked), and nothing here ever
// touches updated_at.

// DueOrder is a PENDING_PAY order whose query of the channel is due.
type DueOrder struct {
	OrderNo string
	// Channel is the channel the order system named ("" asks every channel
	// that has query credentials).
	Channel string
	// Step counts the queries answered so far (the back-off's position),
	// Errors the failed ones since the last answer.
	Step, Errors int
}

// ReconcileWindow is when an order is asked: first After past its
// registration, never Horizon past it.
type ReconcileWindow struct {
	After, Horizon time.Duration
}

// micros passes a duration to SQL as microseconds (multiplied there by
// interval '1 microsecond'): exact, and the same encoding for every pgx
// version.
func micros(d time.Duration) int64 { return d.Microseconds() }

// sqlDueOrders reads the due orders of both indexes: never asked yet
// (biz_order_reconcile_first, by updated_at within the window) and asked
// before (biz_order_reconcile_next, by reconcile_at), oldest first.
const sqlDueOrders = `
(SELECT order_no, COALESCE(channel, ''), reconcile_step, reconcile_errors FROM biz_order
  WHERE status = 'PENDING_PAY' AND reconcile_at IS NULL
    AND updated_at <= now() - $1 * interval '1 microsecond'
    AND updated_at > now() - $2 * interval '1 microsecond'
  ORDER BY updated_at LIMIT $3)
UNION ALL
(SELECT order_no, COALESCE(channel, ''), reconcile_step, reconcile_errors FROM biz_order
  WHERE status = 'PENDING_PAY' AND reconcile_at IS NOT NULL AND reconcile_at <= now()
  ORDER BY reconcile_at LIMIT $3)`

// DueOrders returns up to about limit orders whose query is due (limit of
// each kind, never asked and asked before), on the operator pool.
func (s *Store) DueOrders(ctx context.Context, w ReconcileWindow, limit int) ([]DueOrder, error) {
	rows, err := s.ops.Query(ctx, sqlDueOrders, micros(w.After), micros(w.Horizon), limit)
	if err != nil {
		return nil, wrap(ctx, "due orders", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DueOrder, error) {
		var o DueOrder
		var step, errs int16
		err := r.Scan(&o.OrderNo, &o.Channel, &step, &errs)
		o.Step, o.Errors = int(step), int(errs)
		return o, err
	})
	if err != nil {
		return nil, wrap(ctx, "due orders", err)
	}
	return out, nil
}

// sqlScheduleReconcile records one query's end and sets the next. It
// changes nothing of a order that left PENDING_PAY meanwhile, and never
// updated_at (the order's clock).
const sqlScheduleReconcile = `
UPDATE biz_order SET
    reconcile_step   = reconcile_step + CASE WHEN $2 THEN 1 ELSE 0 END,
    reconcile_errors = CASE WHEN $2 THEN 0 ELSE LEAST(reconcile_errors + 1, 32000) END,
    reconcile_at     = CASE WHEN $5 OR now() + $3 * interval '1 microsecond' > updated_at + $4 * interval '1 microsecond'
                            THEN 'infinity'::timestamptz
                            ELSE now() + $3 * interval '1 microsecond' END
 WHERE order_no = $1 AND status = 'PENDING_PAY'`

// Reconciled is how one query of an order ended, for ScheduleReconcile.
type Reconciled struct {
	// Answered: the channel answered (any state); false: it could not be
	// asked, or its answer failed verification.
	Answered bool
	// Next is how long until the order is asked again; Never: it is not
	// (closed at the channel, or decided). A next time past the horizon is
	// never too.
	Next  time.Duration
	Never bool
}

// ScheduleReconcile records how a query of orderNo ended and when it is
// asked next, on the operator pool. An order no longer PENDING_PAY is left
// alone: it is not asked again anyway.
func (s *Store) ScheduleReconcile(ctx context.Context, orderNo string, w ReconcileWindow, r Reconciled) error {
	if _, err := s.ops.Exec(ctx, sqlScheduleReconcile, orderNo, r.Answered, micros(r.Next), micros(w.Horizon), r.Never); err != nil {
		return wrap(ctx, "schedule reconcile "+orderNo, err)
	}
	return nil
}

// ReconcileTarget returns the order as the scheduler keeps it (its named
// channel, "" for none, and its back-off position) and its state, for a
// query asked now; ErrUnknownOrder when there is no such order.
func (s *Store) ReconcileTarget(ctx context.Context, orderNo string) (DueOrder, State, error) {
	o := DueOrder{OrderNo: orderNo}
	var status string
	var step, errs int16
	err := s.ops.QueryRow(ctx, `SELECT status, COALESCE(channel, ''), reconcile_step, reconcile_errors FROM biz_order WHERE order_no = $1`,
		orderNo).Scan(&status, &o.Channel, &step, &errs)
	if errors.Is(err, pgx.ErrNoRows) {
		return DueOrder{}, "", fmt.Errorf("reconcile %s: %w", orderNo, ErrUnknownOrder)
	}
	if err != nil {
		return DueOrder{}, "", wrap(ctx, "reconcile "+orderNo, err)
	}
	o.Step, o.Errors = int(step), int(errs)
	return o, State(status), nil
}

// ReconcileBacklog reads how many orders are due for a query now and how
// long the oldest has waited (0 when none), on the operator pool: two
// index range reads.
func (s *Store) ReconcileBacklog(ctx context.Context, w ReconcileWindow) (due int64, oldest time.Duration, err error) {
	var oldestSec float64
	err = s.ops.QueryRow(ctx, `
SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(due)), 0)::float8 FROM (
  SELECT updated_at + $1 * interval '1 microsecond' AS due FROM biz_order
   WHERE status = 'PENDING_PAY' AND reconcile_at IS NULL
     AND updated_at <= now() - $1 * interval '1 microsecond'
     AND updated_at > now() - $2 * interval '1 microsecond'
  UNION ALL
  SELECT reconcile_at FROM biz_order
   WHERE status = 'PENDING_PAY' AND reconcile_at IS NOT NULL AND reconcile_at <= now()) d`,
		micros(w.After), micros(w.Horizon)).Scan(&due, &oldestSec)
	if err != nil {
		return 0, 0, wrap(ctx, "reconcile backlog", err)
	}
	return due, time.Duration(oldestSec * float64(time.Second)), nil
}

// ProcessOps decides n as Process does, in a transaction of its own on the
// operator pool, under the operator's timeouts: for deliveries that did
// not come as callbacks (a channel's answer to a query, its bill), which
// must never take the callbacks' connections or budget. n.Via says which
// (ViaQuery when empty).
func (s *Store) ProcessOps(ctx context.Context, n Notification) (Result, error) {
	if err := n.validate(); err != nil {
		return Result{}, err
	}
	n.Via = cmp.Or(n.Via, ViaQuery)
	return s.alone(ctx, s.ops, n)
}

// ReconcileLockID is the session advisory lock that elects the one node
// that asks the channels (apart from the relay's and retention's).
const ReconcileLockID = int64(0x7265636f6e63) // "reconc"
