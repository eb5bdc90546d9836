package durable

import (
	"bytes"
	"fmt"
)

// Outcome is what durable decided for one delivery. Outcomes are values,
// not errors: a duplicate, a conflict or a stale event is a normal result.
type Outcome uint8

// The outcomes durable decides (the README's answers table).
const (
	// Applied: first delivery, legal transition; claim DONE, order moved,
	// outbox row written, all in one transaction.
	Applied Outcome = iota + 1
	// Skipped: legal key, stale or out-of-order transition; claim DONE with
	// this result, order and outbox untouched (maybe a review row).
	Skipped
	// Premature: the event arrived before the one it depends on (a refund
	// before its payment); nothing stored.
	Premature
	// Conflict: the key has a claim with another digest, or the delivery is
	// a payment whose trade paid another order (one trade pays one order);
	// a review row is open, and nothing else is written.
	Conflict
	// AmountMismatch: amount or currency differ from the order; a review
	// row is open and no claim exists, so a retry succeeds once fixed.
	AmountMismatch
	// UnknownOrder: no such order; a review row is open, no claim.
	UnknownOrder
	// RefundExceeds: a refund of the paying trade would take the order's
	// refunded amount above its amount; a review row is open and no claim
	// exists, so a retry succeeds once an operator fixes the cause.
	RefundExceeds
)

var outcomeNames = [...]string{
	Applied:        "applied",
	Skipped:        "skipped",
	Premature:      "premature",
	Conflict:       "conflict",
	AmountMismatch: "amount_mismatch",
	UnknownOrder:   "unknown_order",
	RefundExceeds:  "refund_exceeds",
}

// Outcomes lists every outcome.
var Outcomes = []Outcome{Applied, Skipped, Premature, Conflict, AmountMismatch, UnknownOrder, RefundExceeds}

// replayedOutcome is what notifyedge_process answers for a committed claim
// of the same digest: not an Outcome of its own (a replay carries the first
// delivery's), so Process reads the stored result instead.
const replayedOutcome = "replayed"

// String returns the README's name of the outcome ("applied", ...).
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Done reports whether the outcome is a DONE claim: only those are stored,
// cached and replayed; every other outcome is answered afresh.
func (o Outcome) Done() bool { return o == Applied || o == Skipped }

func parseOutcome(s string) (Outcome, bool) {
	for o, name := range outcomeNames {
		if name != "" && name == s {
			return Outcome(o), true
		}
	}
	return 0, false
}

// Result is the decision for one delivery.
type Result struct {
	// Outcome is the decision. For a replay it is the first delivery's
	// outcome (Applied or Skipped).
	Outcome Outcome
	// Replayed is true when the result is the stored one of an earlier
	// delivery of the same key and digest.
	Replayed bool
	// Status is the order's state: the new one when Applied (unchanged by
	// a partial refund), the current one when Skipped, Premature or
	// RefundExceeds, "" when there is no order.
	Status State
	// Review is the reason of the review row this delivery opened or
	// found open ("" for none).
	Review ReviewReason
	// Canonical is the result_json of the DONE claim, byte for byte as
	// stored (nil unless Outcome.Done()): the durable record of the first
	// answer, for callers that audit or compare results (the tests check
	// that a replay carries the first delivery's bytes). Adapters do not
	// render from it: they render from Outcome and Status, which a replay
	// reads back from these same bytes (ParseCanonical), so it answers as
	// the first delivery did.
	Canonical []byte
	// Position is a WAL position the database will have flushed when the
	// answer goes out: for a decision that wrote, the insert position past
	// its writes (its commit record follows, flushed before the answer);
	// for a replay, which writes nothing, the flushed position when it
	// read the claim (past the claim's commit, visible only once flushed).
	// The claim cache raises its watermark to it before it caches the
	// answer (claimcache.Completion.Position), so that a database restored
	// to a point before it is found behind the watermark.
	Position uint64
}

// The canonical form of a DONE result, as notifyedge_result writes it (the
// one writer: every claim's result_json comes from it), so reading it back
// is a prefix match, not a JSON decode. The bytes never change: a replay
// answers with the stored bytes of the first delivery, whichever build
// wrote them.
const (
	canonicalHead   = `{"http":200,"code":"SUCCESS","outcome":"`
	canonicalMiddle = `","status":"`
	canonicalTail   = `"}`
)

// ParseCanonical reads a stored result_json back into a Result. It accepts
// only the exact canonical form of an applied or skipped result.
func ParseCanonical(b []byte) (Result, error) {
	rest, ok := bytes.CutPrefix(b, []byte(canonicalHead))
	name, rest, ok2 := bytes.Cut(rest, []byte(canonicalMiddle))
	state, ok3 := bytes.CutSuffix(rest, []byte(canonicalTail))
	if !ok || !ok2 || !ok3 {
		return Result{}, fmt.Errorf("parse result_json %q: not canonical", b)
	}
	o, found := parseOutcome(string(name))
	st, known := parseState(state)
	if !found || !o.Done() || !known {
		return Result{}, fmt.Errorf("parse result_json %q: not a DONE result", b)
	}
	return Result{Outcome: o, Status: st, Canonical: b}, nil
}

func parseState(b []byte) (State, bool) {
	for _, s := range States {
		if string(s) == string(b) {
			return s, true
		}
	}
	return "", false
}
