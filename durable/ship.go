package durable

import (
	"context"
	"fmt"
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
	var id *int64
	if outboxID != 0 {
		id = &outboxID
	}
	var result, status *string
	err := s.pool.QueryRow(ctx, sqlShip, consumer, id, orderNo, r.from, r.act, r.to, r.topic).Scan(&result, &status)
	if err != nil {
		return 0, "", wrap(ctx, fmt.Sprintf("ship %s", orderNo), err)
	}
	if result == nil {
		panic("BUG: notifyedge_ship returned no result")
	}
	var st State
	if status != nil {
		st = State(*status)
	}
	switch *result {
	case "shipped":
		s.poke() // ORDER_SHIPPED is in the outbox
		return ShipApplied, st, nil
	case "not_shipped":
		return NotShipped, st, nil
	case "duplicate":
		return DuplicateMessage, "", nil
	}
	return 0, "", fmt.Errorf("ship %s: unknown result %q", orderNo, *result)
}
