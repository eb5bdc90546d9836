package durable

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
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
	err := s.pool.QueryRow(ctx, sqlShip, consumer, inboxID(outboxID), orderNo, r.from, r.act, r.to, r.topic).Scan(&result, &status)
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

// ShipMany is Ship for each of items in one transaction and one round trip
// for the statements: the messages a consumer reads together cost one
// commit (one flush) instead of one each. The orders are locked in
// order_no order (then outbox id, for the inbox rows), the global order of
// every writer that holds several, so that two consumers' batches cannot
// deadlock. An error means nothing of
// it committed: the caller ships each item alone (one item that fails must
// not hold the others back).
func (s *Store) ShipMany(ctx context.Context, consumer string, items []ShipItem) ([]ShipDecision, error) {
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	// Each item's inbox row is locked before its order: two messages of one
	// order (a re-sent row) must come in one order in every transaction too.
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(strings.Compare(items[a].OrderNo, items[b].OrderNo), cmp.Compare(items[a].OutboxID, items[b].OutboxID))
	})
	r := eventRules[Ship]
	out := make([]ShipDecision, len(items))
	shipped := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for _, i := range order {
			b.Queue(sqlShip, consumer, inboxID(items[i].OutboxID), items[i].OrderNo, r.from, r.act, r.to, r.topic)
		}
		br := tx.SendBatch(ctx, b)
		defer br.Close()
		for _, i := range order {
			var result, status *string
			if err := br.QueryRow().Scan(&result, &status); err != nil {
				return err
			}
			d, err := decodeShip(items[i].OrderNo, result, status)
			if err != nil {
				return err
			}
			out[i] = d
			shipped = shipped || d.Result == ShipApplied
		}
		return br.Close()
	})
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
