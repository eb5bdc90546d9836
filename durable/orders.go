package durable

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The orders API's errors.
var (
	// ErrOrderExists: PUT of an order that exists with another amount or
	// currency.
	ErrOrderExists = errors.New("durable: the order exists with another amount or currency")
	// ErrOrderNotPending: PATCH of an order that is no longer PENDING_PAY
	// (its amount is what was paid).
	ErrOrderNotPending = errors.New("durable: the order is not PENDING_PAY")
	// ErrRequestReused: an internal event's request id was used before for
	// another event of the order.
	ErrRequestReused = errors.New("durable: the request id was used for another event")
	// ErrEventRefused: an internal event the order's state forbids (SHIP
	// before payment or after a close or refund, CLOSE once paid). Nothing
	// is stored, so the same request id works once the state allows it.
	ErrEventRefused = errors.New("durable: the order's state forbids the event")
)

// Order is an order as the orders API shows it.
type Order struct {
	OrderNo        string
	Status         State
	Amount         int64
	Currency       string
	PaidBy         *string // the paying trade, nil while unknown
	RefundedAmount int64
	UpdatedAt      time.Time
	// Channel is the channel the order system named ("" for none).
	Channel string
}

// OrderHistory answers "what happened to this order?": the order, its claims
// and outbox events still within retention, its refunds and review rows.
type OrderHistory struct {
	Order
	Claims  []OrderClaim
	Refunds []OrderRefund
	Events  []OrderEvent
	Reviews []OrderReview
	// Truncated: a list held more rows than were asked for; the oldest
	// were left out.
	Truncated bool
}

// OrderClaim is one decided delivery of the order.
type OrderClaim struct {
	BizKey    string
	Outcome   string // applied, skipped
	Status    State  // the order's state it answered
	CreatedAt time.Time
}

// OrderRefund is one recorded refund of a trade of the order.
type OrderRefund struct {
	Trade, RefundID string
	Amount          int64
	CreatedAt       time.Time
}

// OrderEvent is one outbox row of the order.
type OrderEvent struct {
	ID int64
	// EventID is the row's event_id (nil for a row published before
	// event ids existed).
	EventID     *string
	Topic       string
	Payload     json.RawMessage
	CreatedAt   time.Time
	PublishedAt *time.Time
}

// OrderReview is one review row of the order (its body is not here: order
// systems read orders, operators read reviews).
type OrderReview struct {
	ID         int64
	Reason     ReviewReason
	BizKey     string
	CreatedAt  time.Time
	ResolvedAt *time.Time
}

// orderRetries bounds how often an orders API call decides again when a
// concurrent writer changed the order between its statements.
const orderRetries = 8

// PutOrder registers a PENDING_PAY order: created is true for a new order,
// false when the same order (amount and currency) already exists, whatever
// its state; another amount or currency is ErrOrderExists. channel, when
// not "", names the channel the order is paid through (reconciliation asks
// only that one): an order registered without one takes it, one registered
// with another is ErrOrderExists. It runs on the operator pool: order
// systems must not take the callbacks' connections.
//
// Concurrent PUTs of one new order answer as if they ran one after the
// other: the INSERT waits for a concurrent inserter and then inserts
// nothing, and the row it lost to is read by a statement of its own, whose
// snapshot sees that commit (a fallback inside the INSERT's statement
// would not).
func (s *Store) PutOrder(ctx context.Context, orderNo string, amount int64, currency, channel string) (created bool, err error) {
	for range orderRetries {
		var gotAmount int64
		var gotCurrency, gotChannel string
		err = s.commit(ctx, s.ops, func(ctx context.Context, conn *pgxpool.Conn) error {
			return conn.QueryRow(ctx, `INSERT INTO biz_order (order_no, status, amount, currency, channel)
    VALUES ($1, 'PENDING_PAY', $2, $3, NULLIF($4, ''))
    ON CONFLICT (order_no) DO NOTHING RETURNING amount`, orderNo, amount, currency, channel).Scan(&gotAmount)
		})
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return false, wrap(ctx, "put order "+orderNo, err)
		}
		err = s.ops.QueryRow(ctx, `SELECT amount, currency, COALESCE(channel, '') FROM biz_order WHERE order_no = $1`, orderNo).
			Scan(&gotAmount, &gotCurrency, &gotChannel)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // deleted between the two statements: insert again
		}
		if err != nil {
			return false, wrap(ctx, "put order "+orderNo, err)
		}
		if gotAmount != amount || gotCurrency != currency {
			return false, fmt.Errorf("put order %s: %w (%d %s)", orderNo, ErrOrderExists, gotAmount, gotCurrency)
		}
		if channel != "" && gotChannel != "" && gotChannel != channel {
			return false, fmt.Errorf("put order %s: %w (channel %s)", orderNo, ErrOrderExists, gotChannel)
		}
		if channel != "" && gotChannel == "" {
			// Named late: recorded, leaving the order's clock (updated_at)
			// alone. A concurrent PUT naming another channel loses here
			// and is read again.
			var tag pgconn.CommandTag
			err := s.commit(ctx, s.ops, func(ctx context.Context, conn *pgxpool.Conn) (err error) {
				tag, err = conn.Exec(ctx, `UPDATE biz_order SET channel = $2 WHERE order_no = $1 AND channel IS NULL`, orderNo, channel)
				return err
			})
			if err != nil {
				return false, wrap(ctx, "put order "+orderNo, err)
			}
			if tag.RowsAffected() == 0 {
				continue
			}
		}
		return false, nil
	}
	return false, fmt.Errorf("put order %s: inserted and deleted concurrently %d times", orderNo, orderRetries)
}

// PatchOrder corrects the amount and currency of a PENDING_PAY order (e.g.
// before re-driving an AMOUNT_MISMATCH). Any other state is
// ErrOrderNotPending: the amount of a paid order is what was paid.
//
// The UPDATE waits for a concurrent writer of the row and re-checks its
// condition on the committed version; when it changed nothing, the state
// that refused it is read by a statement of its own (a fallback inside the
// UPDATE's statement would read the version from before the wait, and
// answer success for a change that was not made).
func (s *Store) PatchOrder(ctx context.Context, orderNo string, amount int64, currency string) error {
	for range orderRetries {
		// updated_at is the order's registration for reconciliation: a
		// correction registers it again, and its queries start over. A
		// PATCH that changes nothing changes nothing, the schedule
		// included.
		var tag pgconn.CommandTag
		err := s.commit(ctx, s.ops, func(ctx context.Context, conn *pgxpool.Conn) (err error) {
			tag, err = conn.Exec(ctx, `UPDATE biz_order SET amount = $2::bigint, currency = $3::text,
         updated_at = CASE WHEN (amount, currency) = ($2::bigint, $3::text) THEN updated_at ELSE now() END,
         reconcile_at = CASE WHEN (amount, currency) = ($2::bigint, $3::text) THEN reconcile_at END,
         reconcile_step = CASE WHEN (amount, currency) = ($2::bigint, $3::text) THEN reconcile_step ELSE 0 END,
         reconcile_errors = CASE WHEN (amount, currency) = ($2::bigint, $3::text) THEN reconcile_errors ELSE 0 END
     WHERE order_no = $1 AND status = 'PENDING_PAY'`, orderNo, amount, currency)
			return err
		})
		if err != nil {
			return wrap(ctx, "patch order "+orderNo, err)
		}
		if tag.RowsAffected() == 1 {
			return nil
		}
		var status string
		err = s.ops.QueryRow(ctx, `SELECT status FROM biz_order WHERE order_no = $1`, orderNo).Scan(&status)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("patch order %s: %w", orderNo, ErrUnknownOrder)
		case err != nil:
			return wrap(ctx, "patch order "+orderNo, err)
		case status != string(PendingPay):
			return fmt.Errorf("patch order %s: %w (%s)", orderNo, ErrOrderNotPending, status)
		}
		// PENDING_PAY again, e.g. created between the two statements: retry.
	}
	return fmt.Errorf("patch order %s: changed concurrently %d times", orderNo, orderRetries)
}

// sqlOrderHistory reads the order and everything about it in one round
// trip, one snapshot: of each list the newest $2 rows, oldest first. Claims
// are found by order_no (the index notify_claim_order_no_idx), refunds by
// order, events and reviews by order.
const sqlOrderHistory = `SELECT o.status, o.amount, o.currency, o.paid_by, o.refunded_amount, o.updated_at, COALESCE(o.channel, ''),
  (SELECT coalesce(jsonb_agg(x.j ORDER BY x.id), '[]') FROM (
     SELECT c.id, jsonb_build_object('biz_key', c.biz_key, 'result', c.result_json, 'created_at', c.created_at) AS j
       FROM notify_claim c WHERE c.order_no = o.order_no AND c.claim_state = 'DONE' ORDER BY c.id DESC LIMIT $2) x),
  (SELECT coalesce(jsonb_agg(x.j ORDER BY x.created_at, x.trade, x.refund_id), '[]') FROM (
     SELECT r.created_at, r.trade, r.refund_id,
            jsonb_build_object('trade', r.trade, 'refund_id', r.refund_id, 'amount', r.amount, 'created_at', r.created_at) AS j
       FROM trade_refund r WHERE r.order_no = o.order_no ORDER BY r.created_at DESC, r.trade DESC, r.refund_id DESC LIMIT $2) x),
  (SELECT coalesce(jsonb_agg(x.j ORDER BY x.id), '[]') FROM (
     SELECT e.id, jsonb_build_object('id', e.id, 'event_id', e.event_id, 'topic', e.topic, 'payload', e.payload, 'created_at', e.created_at, 'published_at', e.published_at) AS j
       FROM outbox e WHERE e.order_no = o.order_no ORDER BY e.id DESC LIMIT $2) x),
  (SELECT coalesce(jsonb_agg(x.j ORDER BY x.id), '[]') FROM (
     SELECT v.id, jsonb_build_object('id', v.id, 'reason', v.reason, 'biz_key', v.biz_key, 'created_at', v.created_at, 'resolved_at', v.resolved_at) AS j
       FROM notify_review v WHERE v.order_no = o.order_no ORDER BY v.id DESC LIMIT $2) x)
FROM biz_order o WHERE o.order_no = $1`

// DefaultHistoryLimit is how many rows of each list OrderHistory returns
// when the caller sets no limit; MaxHistoryLimit is the most it returns.
const (
	DefaultHistoryLimit = 100
	MaxHistoryLimit     = 1000
)

// OrderHistory returns the order and its history, or ErrUnknownOrder: of
// each list (claims, refunds, events, reviews) the newest limit rows,
// oldest first (limit 0: DefaultHistoryLimit; at most MaxHistoryLimit), and
// Truncated when any list held more. An order that took thousands of
// deliveries would otherwise answer megabytes to a lookup.
func (s *Store) OrderHistory(ctx context.Context, orderNo string, limit int) (OrderHistory, error) {
	if limit <= 0 {
		limit = DefaultHistoryLimit
	}
	limit = min(limit, MaxHistoryLimit)
	var h OrderHistory
	var claims, refunds, events, reviews []byte
	var status string
	err := s.ops.QueryRow(ctx, sqlOrderHistory, orderNo, limit+1).Scan(&status, &h.Amount, &h.Currency, &h.PaidBy,
		&h.RefundedAmount, &h.UpdatedAt, &h.Channel, &claims, &refunds, &events, &reviews)
	if errors.Is(err, pgx.ErrNoRows) {
		return OrderHistory{}, fmt.Errorf("order %s: %w", orderNo, ErrUnknownOrder)
	}
	if err != nil {
		return OrderHistory{}, wrap(ctx, "order "+orderNo, err)
	}
	h.OrderNo, h.Status = orderNo, State(status)
	var rawClaims []struct {
		BizKey    string    `json:"biz_key"`
		Result    string    `json:"result"`
		CreatedAt time.Time `json:"created_at"`
	}
	var rawRefunds []struct {
		Trade     string    `json:"trade"`
		RefundID  string    `json:"refund_id"`
		Amount    int64     `json:"amount"`
		CreatedAt time.Time `json:"created_at"`
	}
	var rawEvents []struct {
		ID          int64           `json:"id"`
		EventID     *string         `json:"event_id"`
		Topic       string          `json:"topic"`
		Payload     json.RawMessage `json:"payload"`
		CreatedAt   time.Time       `json:"created_at"`
		PublishedAt *time.Time      `json:"published_at"`
	}
	var rawReviews []struct {
		ID         int64      `json:"id"`
		Reason     string     `json:"reason"`
		BizKey     string     `json:"biz_key"`
		CreatedAt  time.Time  `json:"created_at"`
		ResolvedAt *time.Time `json:"resolved_at"`
	}
	for _, part := range []struct {
		raw []byte
		v   any
	}{{claims, &rawClaims}, {refunds, &rawRefunds}, {events, &rawEvents}, {reviews, &rawReviews}} {
		if err := json.Unmarshal(part.raw, part.v); err != nil {
			return OrderHistory{}, fmt.Errorf("order %s: decode history: %w", orderNo, err)
		}
	}
	rawClaims = keepNewest(rawClaims, limit, &h.Truncated)
	rawRefunds = keepNewest(rawRefunds, limit, &h.Truncated)
	rawEvents = keepNewest(rawEvents, limit, &h.Truncated)
	rawReviews = keepNewest(rawReviews, limit, &h.Truncated)
	for _, c := range rawClaims {
		oc := OrderClaim{BizKey: c.BizKey, CreatedAt: c.CreatedAt}
		if r, err := ParseCanonical([]byte(c.Result)); err == nil {
			oc.Outcome, oc.Status = r.Outcome.String(), r.Status
		}
		h.Claims = append(h.Claims, oc)
	}
	for _, r := range rawRefunds {
		h.Refunds = append(h.Refunds, OrderRefund{Trade: r.Trade, RefundID: r.RefundID, Amount: r.Amount, CreatedAt: r.CreatedAt})
	}
	for _, e := range rawEvents {
		h.Events = append(h.Events, OrderEvent{ID: e.ID, EventID: e.EventID, Topic: e.Topic, Payload: e.Payload, CreatedAt: e.CreatedAt, PublishedAt: e.PublishedAt})
	}
	for _, v := range rawReviews {
		h.Reviews = append(h.Reviews, OrderReview{ID: v.ID, Reason: ReviewReason(v.Reason), BizKey: v.BizKey, CreatedAt: v.CreatedAt, ResolvedAt: v.ResolvedAt})
	}
	return h, nil
}

// keepNewest drops the oldest row of a list read with one row more than
// limit (oldest first), and records that there was more.
func keepNewest[T any](rows []T, limit int, truncated *bool) []T {
	if len(rows) <= limit {
		return rows
	}
	*truncated = true
	return rows[len(rows)-limit:]
}

// InternalKey is the claim key of an internal event's request id: no
// channel can produce it (channel names are [a-z0-9_], never "@"), and the
// order number's length in front makes it unambiguous whatever characters
// the order number and the request id hold ("K-1" with "wms:7781" and
// "K-1:wms" with "7781" are two keys).
func InternalKey(orderNo, requestID string) string {
	return "@orders:" + strconv.Itoa(len(orderNo)) + ":" + orderNo + ":" + requestID
}

// OrderEvent applies an internal event (SHIP or CLOSE) for the merchant's
// own systems, through the same conditional transition as every other
// writer, and stores its answer durably under the request id: Applied when
// it moved the order, Skipped when the order already is where the event
// leads (SHIP on SHIPPED, CLOSE on CLOSED). Any other state refuses it:
// ErrEventRefused with the Result's Status the order's state, and nothing
// stored, so the same request id works once the state allows it. The same
// request id again returns the first answer (Replayed), with another event
// it is ErrRequestReused; an unknown order is ErrUnknownOrder. The claim,
// the move and its outbox row commit together. It runs on the operator
// pool, under its timeouts: order systems never take the callbacks'
// connections or budget.
func (s *Store) OrderEvent(ctx context.Context, orderNo string, e Event, requestID string) (Result, error) {
	r, ok := eventRules[e]
	if !ok || !r.internal || (e != Ship && e != Close) {
		return Result{}, fmt.Errorf("%w: %q is not an order system's event (SHIP, CLOSE)", ErrInvalid, e)
	}
	key := InternalKey(orderNo, requestID)
	sum := sha256.Sum256([]byte(e))
	hash := hex.EncodeToString(sum[:])
	var res Result
	err := s.commit(ctx, s.ops, func(ctx context.Context, conn *pgxpool.Conn) error {
		return pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{}, func(tx pgx.Tx) error {
			// The claim first: a concurrent request with the same id waits here
			// until this one commits (then replays it) or rolls back (then
			// decides itself).
			var claimed bool
			err := tx.QueryRow(ctx, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json)
			SELECT $1::text, $2::text, $3::text, 'DONE', '' WHERE EXISTS (SELECT 1 FROM biz_order WHERE order_no = $2::text)
			ON CONFLICT (biz_key) DO NOTHING RETURNING true`, key, orderNo, hash).Scan(&claimed)
			if errors.Is(err, pgx.ErrNoRows) {
				var gotHash, result string
				err = tx.QueryRow(ctx, `SELECT payload_hash, result_json FROM notify_claim WHERE biz_key = $1`, key).Scan(&gotHash, &result)
				if errors.Is(err, pgx.ErrNoRows) {
					return ErrUnknownOrder
				}
				if err != nil {
					return err
				}
				if gotHash != hash {
					return ErrRequestReused
				}
				if res, err = ParseCanonical([]byte(result)); err != nil {
					return err
				}
				res.Replayed = true
				return nil
			}
			if err != nil {
				return err
			}
			var found, applied bool
			var from, status *string
			if err := tx.QueryRow(ctx, sqlTransition, orderNo, string(e), r.from, r.act, r.to, r.topic).
				Scan(&found, &applied, &from, &status); err != nil {
				return err
			}
			if !found {
				return ErrUnknownOrder // deleted meanwhile: roll the claim back too
			}
			res = Result{Outcome: Applied, Status: State(*status)}
			switch {
			case applied:
			case res.Status == r.target():
				res.Outcome = Skipped
			default:
				return ErrEventRefused // rolls the claim back: nothing stored
			}
			// The stored answer, written by the one writer of canonical
			// results, and read back as a replay will read it.
			var stored []byte
			if err := tx.QueryRow(ctx, `UPDATE notify_claim SET result_json = notifyedge_result($2, $3) WHERE biz_key = $1
			RETURNING result_json`, key, res.Outcome.String(), string(res.Status)).Scan(&stored); err != nil {
				return err
			}
			res, err = ParseCanonical(stored)
			return err
		})
	})
	switch {
	case errors.Is(err, ErrEventRefused):
		return Result{Status: res.Status}, fmt.Errorf("order %s event %s: %w (%s)", orderNo, e, err, res.Status)
	case errors.Is(err, ErrUnknownOrder), errors.Is(err, ErrRequestReused):
		return Result{}, fmt.Errorf("order %s event %s request %s: %w", orderNo, e, requestID, err)
	case err != nil:
		return Result{}, wrap(ctx, fmt.Sprintf("order %s event %s", orderNo, e), err)
	}
	if res.Outcome == Applied && !res.Replayed {
		s.poke()
	}
	return res, nil
}

// Review returns one review row, or ErrReviewNotFound.
func (s *Store) Review(ctx context.Context, id int64) (Review, error) {
	rows, err := s.ops.Query(ctx, `SELECT `+reviewColumns+` FROM notify_review WHERE id = $1::bigint`, id)
	if err != nil {
		return Review{}, wrap(ctx, "review", err)
	}
	r, err := pgx.CollectExactlyOneRow(rows, scanReview)
	if errors.Is(err, pgx.ErrNoRows) {
		return Review{}, fmt.Errorf("review %d: %w", id, ErrReviewNotFound)
	}
	if err != nil {
		return Review{}, wrap(ctx, "review", err)
	}
	return r, nil
}

// ResolveRedriven records that an operator's re-drive settled review row
// id: resolved by that operator with resolution, also when deciding the
// delivery again already closed the row by itself (resolved_by
// 'notifyedge', moments before): the re-drive is what cleared it. A
// re-drive whose decision was a replay decided nothing: a row already
// closed that way was closed by the concurrent re-drive whose decision it
// replayed, and stays that one's to resolve. It reports false when the row
// was resolved by someone else already (e.g. a concurrent re-drive of the
// same row, which settled it first).
func (s *Store) ResolveRedriven(ctx context.Context, id int64, resolution, by string, replayed bool) (bool, error) {
	var tag pgconn.CommandTag
	err := s.commit(ctx, s.ops, func(ctx context.Context, conn *pgxpool.Conn) (err error) {
		tag, err = conn.Exec(ctx, `UPDATE notify_review
   SET resolved_at = coalesce(resolved_at, now()), resolution = $2, resolved_by = $3
 WHERE id = $1::bigint AND (resolved_at IS NULL OR (resolved_by = 'notifyedge' AND NOT $4))`, id, resolution, by, replayed)
		return err
	})
	if err != nil {
		return false, wrap(ctx, "resolve re-driven review", err)
	}
	return tag.RowsAffected() == 1, nil
}
