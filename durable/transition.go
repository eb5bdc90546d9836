package durable

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Move is the result of an internal transition.
type Move struct {
	// Applied is true when the order moved (and an outbox row was written).
	Applied bool
	// From is the state the order was in.
	From State
	// Status is the order's state afterwards.
	Status State
}

const sqlTransition = `SELECT o_found, o_applied, o_from, o_status
FROM notifyedge_transition($1, $2, $3, $4, $5, $6)`

// Transition moves an order for an internal path (SHIP by the shipping
// consumer, CLOSE by the orders API, a compensation job's PAY_SUCCESS)
// through the same conditional UPDATE and outbox write as Process, without
// a claim. An illegal move is a result (Applied false), not an error: a
// redelivered or stale event moves nothing. An order that does not exist is
// ErrUnknownOrder.
//
// Internal paths name no trade, so events that move money against one
// (REFUND_SUCCESS, TRADE_CLOSED) are ErrInvalid here: they come from a
// channel, through Process. A PAY_SUCCESS through Transition leaves paid_by
// unknown (NULL); the first refund or close then names the payer.
func (s *Store) Transition(ctx context.Context, orderNo string, e Event) (Move, error) {
	r, ok := eventRules[e]
	if !ok || !r.internal {
		return Move{}, fmt.Errorf("%w: event %q on an internal path", ErrInvalid, e)
	}
	var found, applied bool
	var from, status *string
	err := s.commit(ctx, s.pool, func(ctx context.Context, conn *pgxpool.Conn) error {
		return conn.QueryRow(ctx, sqlTransition, orderNo, string(e), r.from, r.act, r.to, r.topic).
			Scan(&found, &applied, &from, &status)
	})
	if err != nil {
		return Move{}, wrap(ctx, fmt.Sprintf("transition %s %s", orderNo, e), err)
	}
	if !found {
		return Move{}, fmt.Errorf("transition %s %s: %w", orderNo, e, ErrUnknownOrder)
	}
	if applied {
		s.poke()
	}
	return Move{Applied: applied, From: State(*from), Status: State(*status)}, nil
}
