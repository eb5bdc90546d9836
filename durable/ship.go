package durable

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ShipResult is what Ship did.
type ShipResult uint8

// The results of Ship.
const (
	// ShipApplied: the order moved PAID -> SHIPPED and a shipment was recorded.
	ShipApplied ShipResult = iota + 1
	// NotShipped: the order was not PAID (already shipped, or a stale
	// message): nothing happened.
	NotShipped
	// DuplicateMessage: this consumer processed this outbox id before.
	DuplicateMessage
)

// String returns the result's name: shipped, not_shipped or duplicate.
func (r ShipResult) String() string {
	switch r {
	case ShipApplied:
		return "shipped"
	case NotShipped:
		return "not_shipped"
	case DuplicateMessage:
		return "duplicate"
	}
	return fmt.Sprintf("ShipResult(%d)", uint8(r))
}

const sqlShip = `SELECT o_result, o_status FROM notifyedge_ship($1, $2, $3, $4, $5, $6, $7)`

// Ship is the shipping consumer's effect, in one transaction: it records
// that consumer handled outboxID (outboxID 0: an internal path, no inbox),
// moves the order PAID -> SHIPPED through the same conditional transition
// as every writer, and records the shipment only if the order moved. A
// redelivered message and a stale ORDER_PAID after SHIPPED ship nothing.
func (s *Store) Ship(ctx context.Context, consumer string, outboxID int64, orderNo string) (ShipResult, State, error) {
	r := eventRules[Ship]
	var result, status *string
	// Through commit: a shipment recorded on the primary only would be
	// found a duplicate by the message's redelivery, and lost with it.
	err := s.commit(ctx, s.pool, func(ctx context.Context, conn *pgxpool.Conn) error {
		return conn.QueryRow(ctx, sqlShip, consumer, inboxID(outboxID), orderNo, r.from, r.act, r.to, r.topic).Scan(&result, &status)
	})
	if err != nil {
		return 0, "", wrap(ctx, fmt.Sprintf("ship %s", orderNo), err)
	}
	d, err := decodeShip(orderNo, result, status)
	if err == nil && d.Result == ShipApplied {
		s.poke() // ORDER_SHIPPED is in the outbox
	}
	return d.Result, d.Status, err
}

// ShipItem is one message for ShipMany.
type ShipItem struct {
	OutboxID int64
	OrderNo  string
}

// ShipDecision is what Ship decided for one item of ShipMany.
type ShipDecision struct {
	Result ShipResult
	Status State
}

const sqlShipBatch = `SELECT o_result, o_status FROM notifyedge_ship_batch($1, $2, $3, $4, $5, $6, $7)`

// ShipMany is Ship for each of items in one statement, decided as sets:
// the messages a consumer reads together cost one commit (one flush) and a
// handful of statements instead of one each. Each item gets what Ship
// gives it when the items are shipped one by one in (order_no, outbox id)
// order: a repeated outbox id is a duplicate, and of several messages of
// one order the first ships it. The orders are locked in order_no order
// (after the inbox rows, by outbox id), the global order of every writer
// that holds several, so that two consumers' batches cannot deadlock.
//
// After an error the caller ships each item alone (one item that fails
// must not hold the others back): whatever the statement did commit then
// comes back as duplicates, through the inbox rows.
func (s *Store) ShipMany(ctx context.Context, consumer string, items []ShipItem) ([]ShipDecision, error) {
	ids := make([]*int64, len(items))
	orders := make([]string, len(items))
	for i, it := range items {
		ids[i], orders[i] = inboxID(it.OutboxID), it.OrderNo
	}
	r := eventRules[Ship]
	out := make([]ShipDecision, 0, len(items))
	shipped := false
	var result, status *string
	err := s.commit(ctx, s.pool, func(ctx context.Context, conn *pgxpool.Conn) error { // as Ship
		rows, err := conn.Query(ctx, sqlShipBatch, consumer, ids, orders, r.from, r.act, r.to, r.topic)
		if err != nil {
			return err
		}
		_, err = pgx.ForEachRow(rows, []any{&result, &status}, func() error {
			if len(out) == len(items) {
				return fmt.Errorf("more decisions than the %d items", len(items))
			}
			d, err := decodeShip(items[len(out)].OrderNo, result, status)
			if err != nil {
				return err
			}
			out = append(out, d)
			shipped = shipped || d.Result == ShipApplied
			return nil
		})
		return err
	})
	if err == nil && len(out) != len(items) {
		err = fmt.Errorf("%d decisions for %d items", len(out), len(items))
	}
	if err != nil {
		return nil, wrap(ctx, fmt.Sprintf("ship %d orders", len(items)), err)
	}
	if shipped {
		s.poke() // ORDER_SHIPPED rows are in the outbox
	}
	return out, nil
}

// inboxID is the statement's outbox id: NULL for an internal path (0).
func inboxID(outboxID int64) *int64 {
	if outboxID == 0 {
		return nil
	}
	return &outboxID
}

// decodeShip reads notifyedge_ship's answer.
func decodeShip(orderNo string, result, status *string) (ShipDecision, error) {
	if result == nil {
		panic("BUG: notifyedge_ship returned no result")
	}
	var st State
	if status != nil {
		st = State(*status)
	}
	switch *result {
	case "shipped":
		return ShipDecision{ShipApplied, st}, nil
	case "not_shipped":
		return ShipDecision{NotShipped, st}, nil
	case "duplicate":
		return ShipDecision{DuplicateMessage, ""}, nil
	}
	return ShipDecision{}, fmt.Errorf("ship %s: unknown result %q", orderNo, *result)
}
