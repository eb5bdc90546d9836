package durable

import (
	"bytes"
	"context"
	"fmt"
	"unicode/utf8"
)

// Notification is one callback delivery, already parsed, authenticated and
// keyed by the edge.
type Notification struct {
	// BizKey is the idempotency key "{channel}:{channel_txn_id}:{event_type}"
	// (at most 160 bytes).
	BizKey string
	// OrderNo names the order (1 to 64 bytes).
	OrderNo string
	// Event is the channel event.
	Event Event
	// Amount is the order total in minor units (> 0).
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
}

func (n *Notification) validate() error {
	bad := func(field string) error { return fmt.Errorf("%w: %s", ErrInvalid, field) }
	switch {
	case n.BizKey == "" || len(n.BizKey) > 160:
		return bad("biz_key")
	case n.OrderNo == "" || len(n.OrderNo) > 64:
		return bad("order_no")
	case n.Amount <= 0:
		return bad("amount")
	case len(n.Currency) != 3:
		return bad("currency")
	case !isHexDigest(n.Digest):
		return bad("digest")
	}
	if _, ok := ParseChannelEvent([]byte(n.Event)); !ok {
		return bad("event_type")
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

// sqlProcess answers a replay (a committed claim with the same digest) in
// plain SQL, one index probe; only otherwise does it call notifyedge_process,
// handing it the digest of any claim it found. The one-time filter keeps the
// function from running at all on a replay: on two cores, a PL/pgSQL call
// costs about as much as the probe.
const sqlProcess = `WITH c AS MATERIALIZED (
    SELECT payload_hash, result_json FROM notify_claim WHERE biz_key = $1)
SELECT 'replayed', NULL, result_json, NULL FROM c WHERE payload_hash = $3
UNION ALL
SELECT o_outcome, o_status, o_result, o_review
  FROM notifyedge_process($1, $2, $3, $4, (SELECT payload_hash FROM c), $5, $6, $7, $8, $9, $10, $11, $12)
 WHERE NOT EXISTS (SELECT 1 FROM c WHERE payload_hash = $3)`

// Process decides one delivery in one transaction (see the package doc).
// Decisions follow the contract's order: an existing claim (replay, or
// Conflict), then the order (UnknownOrder, AmountMismatch), then the event
// against the current state (Premature, Skipped, Applied).
//
// A returned Result is committed. An error means the transaction did not
// commit or its fate is unknown; when ctx's deadline expired,
// errors.Is(err, context.DeadlineExceeded) is true.
func (s *Store) Process(ctx context.Context, n Notification) (Result, error) {
	if err := n.validate(); err != nil {
		return Result{}, err
	}
	r := eventRules[n.Event]
	var outcome, status, result, review *string
	err := s.pool.QueryRow(ctx, sqlProcess,
		n.BizKey, n.OrderNo, n.Digest, textSafe(n.RawBody),
		string(n.Event), n.Amount, n.Currency,
		r.states, r.to, r.topics, r.reviews, r.premature,
	).Scan(&outcome, &status, &result, &review)
	if err != nil {
		return Result{}, wrap(ctx, "process "+n.BizKey, err)
	}
	if outcome == nil {
		panic("BUG: notifyedge_process returned no outcome")
	}
	var res Result
	if *outcome == "replayed" {
		if result == nil {
			return Result{}, fmt.Errorf("process %s: claim without result_json", n.BizKey)
		}
		res, err = ParseCanonical([]byte(*result))
		if err != nil {
			return Result{}, fmt.Errorf("process %s: %w", n.BizKey, err)
		}
		res.Replayed = true
		return res, nil
	}
	o, ok := parseOutcome(*outcome)
	if !ok {
		return Result{}, fmt.Errorf("process %s: unknown outcome %q", n.BizKey, *outcome)
	}
	res.Outcome = o
	if o == Applied {
		s.poke() // an outbox row was committed: wake the relay
	}
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
