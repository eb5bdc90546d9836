package durable

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Notification is one callback delivery, already parsed, authenticated and
// keyed by the edge.
type Notification struct {
	// BizKey is the idempotency key "{channel}:{channel_txn_id}:{event_type}",
	// or "{channel}:{refund_id}:{event_type}" for a refund with an id (at
	// most 160 bytes).
	BizKey string
	// OrderNo names the order (1 to 64 bytes).
	OrderNo string
	// Event is the channel event.
	Event Event
	// Amount is the order total in minor units (> 0), for every event,
	// refunds included.
	Amount int64
	// Currency is the ISO 4217 code ([A-Z]{3}).
	Currency string
	// Digest is the lower-case hex SHA-256 of the business fields; the same
	// key with another digest is a conflict.
	Digest string
	// RawBody is the body as received, stored only in review rows. Process
	// reads it during the call and keeps no reference. Bytes that are not
	// valid UTF-8 (or NUL, which TEXT refuses) are replaced.
	RawBody []byte
	// Trade is the trade the event names, "{channel}:{channel_txn_id}" (1
	// to 100 bytes): for a refund the trade being refunded, for PAY_SUCCESS
	// the paying trade. Required for every channel event: money moves only
	// against the trade it belongs to.
	Trade string
	// RefundID names the refund (at most 64 bytes; "" for a refund without
	// one). REFUND_SUCCESS and REFUND_FAILED only.
	RefundID string
	// RefundAmount is this refund's amount in minor units (REFUND_SUCCESS:
	// required, > 0; = Amount for a full refund), or, when Cumulative, the
	// trade's refunded total so far (Alipay's refund_fee). A value above
	// Amount is decided (RefundExceeds), not refused. REFUND_FAILED may
	// carry it (ignored); other events must not.
	RefundAmount int64
	// Cumulative says RefundAmount is the trade's refunded total, not this
	// refund's amount: durable raises the refunded amount to it, and a
	// notification that raises nothing is skipped. REFUND_SUCCESS only.
	Cumulative bool
	// Via names the path a delivery that is not a channel's callback came
	// by, for the outbox payload's "via": ViaQuery, ViaBill or ViaRedrive
	// ("" is a callback). Such a delivery is decided in a transaction of
	// its own, never in a group commit's batch.
	Via string
	// Traceparent is the W3C traceparent of the callback's decision when
	// its trace is sampled ("" otherwise): an applied delivery's is kept
	// (notify_trace) for the relay to carry with the outbox row's event.
	Traceparent string
}

// The paths an outbox payload's "via" names: ViaQuery, ViaBill and
// ViaRedrive are what a Notification.Via may say; a callback and the order
// system's own transitions are known by their keys (notifyedge_event_facts).
const (
	ViaCallback  = "callback"
	ViaQuery     = "query"
	ViaBill      = "bill"
	ViaRedrive   = "redrive"
	ViaOrdersAPI = "orders_api"
)

func (n *Notification) validate() error {
	bad := func(field string) error { return fmt.Errorf("%w: %s", ErrInvalid, field) }
	switch {
	case n.BizKey == "" || len(n.BizKey) > 160:
		return bad("biz_key")
	case n.Via != "" && n.Via != ViaQuery && n.Via != ViaBill && n.Via != ViaRedrive:
		return bad("via")
	case n.OrderNo == "" || len(n.OrderNo) > 64:
		return bad("order_no")
	case n.Amount <= 0:
		return bad("amount")
	case len(n.Currency) != 3:
		return bad("currency")
	case !isHexDigest(n.Digest):
		return bad("digest")
	case n.Trade == "" || len(n.Trade) > 100:
		return bad("trade")
	case len(n.RefundID) > 64:
		return bad("refund_id")
	case n.Traceparent != "" && len(n.Traceparent) != traceparentLen:
		return bad("traceparent")
	}
	if _, ok := ParseChannelEvent([]byte(n.Event)); !ok {
		return bad("event_type")
	}
	switch n.Event {
	case RefundSuccess:
		if n.RefundAmount <= 0 {
			return bad("refund_amount")
		}
	case RefundFailed:
		if n.RefundAmount < 0 || n.Cumulative {
			return bad("refund_amount")
		}
	default:
		if n.RefundID != "" {
			return bad("refund_id")
		}
		if n.RefundAmount != 0 || n.Cumulative {
			return bad("refund_amount")
		}
	}
	return nil
}

func isHexDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// textSafe returns b, or a copy made safe for a TEXT column.
func textSafe(b []byte) []byte {
	if utf8.Valid(b) && bytes.IndexByte(b, 0) < 0 {
		return b
	}
	b = bytes.ToValidUTF8(b, []byte("\uFFFD"))
	return bytes.ReplaceAll(b, []byte{0}, []byte("\uFFFD"))
}

// processSQL holds, per channel event, the statement Process runs. It
// answers a replay (a committed claim with the same digest) in plain SQL,
// one index probe; only otherwise does it call notifyedge_process, handing
// it the digest of any claim it found. The one-time filter keeps the
// function from running at all on a replay: on two cores, a PL/pgSQL call
// costs about as much as the probe. Nothing else goes in this statement:
// the executor sets up every part of a plan on every execution, replays
// included, whether the part runs or not.
//
// The event's rules are constants in its statement, built once from the
// machine in state.go: typed arrays as parameters cost the server a parse of
// every element on every call, replays included, and one statement for all
// events, picking the event's rules from a VALUES list, cost it the
// initialisation of every event's constants on every call (about 5 % of a
// first delivery's CPU).
var processSQL = buildProcessSQL()

// processTracedSQL is processSQL for a sampled callback: the same
// decision, and, when it applied, the callback's traceparent ($12) kept
// in notify_trace by the same statement.
var processTracedSQL = func() map[Event]string {
	out := make(map[Event]string, len(processSQL))
	for e, sql := range processSQL {
		out[e] = `WITH d (o_outcome, o_status, o_result, o_review, o_position) AS MATERIALIZED (
` + sql + `
), tr AS (
  INSERT INTO notify_trace (biz_key, traceparent)
  SELECT $1, $12 FROM d WHERE d.o_outcome = 'applied'
  ON CONFLICT DO NOTHING)
SELECT * FROM d`
	}
	return out
}()

// traceparentLen is a W3C traceparent's length (version 00).
const traceparentLen = 55

// sqlProcess is the payment's statement, the event of nearly every first
// delivery: the Store prepares it on every new connection. The other
// events' statements are prepared by pgx's statement cache on their first
// use on a connection.
var sqlProcess = processSQL[PaySuccess]

func buildProcessSQL() map[Event]string {
	out := make(map[Event]string)
	for _, e := range Events {
		if _, ok := ParseChannelEvent([]byte(e)); !ok {
			continue // internal events never reach Process
		}
		r := eventRules[e]
		out[e] = `WITH c AS MATERIALIZED (
    SELECT payload_hash, result_json FROM notify_claim WHERE biz_key = $1)
SELECT 'replayed', NULL, result_json, NULL, ` + sqlPosition + ` FROM c WHERE payload_hash = $3
UNION ALL
SELECT o_outcome, o_status, o_result, o_review, ` + sqlPosition + `
  FROM notifyedge_process($1, $2, $3, $4, (SELECT payload_hash FROM c), $5, $6, $7,
       $8, $9, $10, $11,
       ` + strings.Join([]string{sqlTextArray(r.from), sqlTextArray(r.party), sqlTextArray(r.act),
			sqlTextArray(r.to), sqlTextArray(r.topic), sqlTextArray(r.review)}, ",\n       ") + `,
       ` + sqlText(r.partial) + `, ` + fmt.Sprint(r.adopt) + `)
 WHERE NOT EXISTS (SELECT 1 FROM c WHERE payload_hash = $3)`
	}
	return out
}

// sqlPosition is the WAL position a decision's statement returns with its
// answer (Result.Position): never past what the database will have flushed
// when the answer goes out.
//
//   - A statement that wrote (its transaction has an id) reads the insert
//     position, past its writes: its commit record follows, and is flushed
//     before the answer goes out.
//   - One that wrote nothing (a replay) commits nothing to flush, while the
//     insert position may already hold other transactions' records that no
//     flush has reached: a watermark raised there would find the database
//     "behind" it at the next check, and the cache would drop an epoch for
//     nothing. It reads the flushed position instead, which covers the
//     claim it read: a commit is visible only once its record is flushed.
const sqlPosition = `(CASE WHEN pg_current_xact_id_if_assigned() IS NULL
    THEN pg_current_wal_flush_lsn() ELSE pg_current_wal_insert_lsn() END - '0/0'::pg_lsn)::int8`

// sqlText quotes s as an SQL text constant.
func sqlText(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'::text" }

// sqlTextArray writes l as an SQL text[] constant.
func sqlTextArray(l []string) string {
	q := make([]string, len(l))
	for i, s := range l {
		q[i] = "'" + strings.ReplaceAll(s, "'", "''") + "'"
	}
	return "ARRAY[" + strings.Join(q, ", ") + "]::text[]"
}

// Process decides one delivery in one transaction (see the package doc).
// Decisions follow the README's order: an existing claim (replay, or
// Conflict) or, for a payment, its trade having paid another order
// (Conflict), then the order (UnknownOrder, AmountMismatch), then Premature,
// then the trade (another trade's refund or close is Skipped; the paying
// trade's refund is RefundExceeds or Applied), then the event against the
// current state (Skipped, Applied).
//
// A returned Result is committed. An error means the transaction did not
// commit or its fate is unknown; when ctx's deadline expired,
// errors.Is(err, context.DeadlineExceeded) is true. Process returns by
// ctx's deadline whatever the database does, with group commit or
// without: a caller's latency budget holds however slow Postgres is.
func (s *Store) Process(ctx context.Context, n Notification) (Result, error) {
	if err := n.validate(); err != nil {
		return Result{}, err
	}
	if s.group != nil && n.Via == "" {
		return s.group.process(ctx, n)
	}
	return s.alone(ctx, s.pool, n)
}

// alone decides n in a transaction of its own, on a goroutine of its own,
// and returns by ctx's deadline whatever the database does, as a batch
// member does. The statement is not cancelled (Config.CommitWait): the
// transaction goes on to its end (committed or rolled back); either is
// correct, because its claim, visible once committed where it must be,
// makes the channel's retry a replay.
func (s *Store) alone(ctx context.Context, pool *pgxpool.Pool, n Notification) (Result, error) {
	n.RawBody = bytes.Clone(n.RawBody) // the caller may reuse its bytes once we return
	out := make(chan answer, 1)        // buffered: the goroutine never waits for the caller
	go func() {
		defer func() {
			if p := recover(); p != nil {
				out <- answer{err: fmt.Errorf("process %s: %v", n.BizKey, p)}
			}
		}()
		res, err := s.processOn(ctx, pool, &n)
		if err == nil && res.Outcome == Applied {
			s.poke() // an outbox row was committed: wake the relay
		}
		out <- answer{res: res, err: err}
	}()
	select {
	case a := <-out:
		return a.res, a.err
	case <-ctx.Done():
		return Result{}, wrap(ctx, "process "+n.BizKey, ctx.Err())
	}
}

// processOn decides one validated delivery in a transaction of its own on
// pool, through commit: never cancelled while its commit waits for a
// standby, so it may return after ctx's deadline (alone returns by it).
func (s *Store) processOn(ctx context.Context, pool *pgxpool.Pool, n *Notification) (Result, error) {
	var outcome, status, result, review *string
	var position int64
	decide := func(ctx context.Context, q rowQuerier) error {
		args := []any{n.BizKey, n.OrderNo, n.Digest, textSafe(n.RawBody),
			string(n.Event), n.Amount, n.Currency,
			n.Trade, n.RefundID, n.RefundAmount, n.Cumulative}
		sql := processSQL[n.Event]
		if n.Traceparent != "" {
			sql, args = processTracedSQL[n.Event], append(args, n.Traceparent)
		}
		return q.QueryRow(ctx, sql, args...).Scan(&outcome, &status, &result, &review, &position)
	}
	err := s.commit(ctx, pool, func(cctx context.Context, conn *pgxpool.Conn) error {
		if n.Via == "" {
			return decide(cctx, conn) // a callback: one statement, its own transaction
		}
		// The payload's "via" comes from the transaction's setting.
		return pgx.BeginFunc(cctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(cctx, `SELECT set_config('notifyedge.via', $1, true)`, n.Via); err != nil {
				return err
			}
			return decide(cctx, tx)
		})
	})
	if err != nil {
		return Result{}, wrap(ctx, "process "+n.BizKey, err)
	}
	res, err := decodeDecision(n.BizKey, outcome, status, result, review)
	res.Position = uint64(position)
	return res, err
}

// rowQuerier is a pool or a transaction, for a statement that returns one
// row.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// decodeDecision reads one decision as notifyedge_process returns it (the
// batch's rows have the same columns).
func decodeDecision(key string, outcome, status, result, review *string) (Result, error) {
	if outcome == nil {
		panic("BUG: notifyedge_process returned no outcome")
	}
	var res Result
	if *outcome == replayedOutcome {
		if result == nil {
			return Result{}, fmt.Errorf("process %s: claim without result_json", key)
		}
		res, err := ParseCanonical([]byte(*result))
		if err != nil {
			return Result{}, fmt.Errorf("process %s: %w", key, err)
		}
		res.Replayed = true
		return res, nil
	}
	o, ok := parseOutcome(*outcome)
	if !ok {
		return Result{}, fmt.Errorf("process %s: unknown outcome %q", key, *outcome)
	}
	res.Outcome = o
	if status != nil {
		res.Status = State(*status)
	}
	if review != nil {
		res.Review = ReviewReason(*review)
	}
	if result != nil {
		res.Canonical = []byte(*result)
	}
	return res, nil
}
