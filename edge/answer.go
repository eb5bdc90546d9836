package edge

import (
	"net/http"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge/channel"
)

// Outcome is how a request ended: the outcome label of
// notifyedge_requests_total.
type Outcome uint8

// The request outcomes.
const (
	OutcomeApplied Outcome = iota
	OutcomeSkipped
	OutcomeReplayedCache
	OutcomeReplayedDB
	OutcomePremature
	OutcomeConflict
	OutcomeAmountMismatch
	OutcomeRefundExceeds
	OutcomeMerchantMismatch
	OutcomeUnknownOrder
	OutcomeUnknownChannel
	OutcomeBadSignature
	OutcomeBadRequest
	OutcomeTooLarge
	OutcomeUnavailable
	OutcomeInternal
	numOutcomes
)

// answer is one row of the answers table: everything that follows from an
// outcome, kept in one place so that a new outcome is one new row.
type answer struct {
	// label is the metric label.
	label string
	// http is the status of a FAIL answer (DONE outcomes are always 200).
	http int
	// body is the answer body's "outcome" ("" to omit it).
	body string
	// durable is the durable outcome this row answers (zero for none),
	// and message the FAIL message that goes with it.
	durable durable.Outcome
	message string
}

var answers = [numOutcomes]answer{
	OutcomeApplied:          {label: "applied", http: http.StatusOK, body: "applied", durable: durable.Applied},
	OutcomeSkipped:          {label: "skipped", http: http.StatusOK, body: "skipped", durable: durable.Skipped},
	OutcomeReplayedCache:    {label: "replayed_cache", http: http.StatusOK},
	OutcomeReplayedDB:       {label: "replayed_db", http: http.StatusOK},
	OutcomePremature:        {label: "premature", http: http.StatusConflict, body: "premature", durable: durable.Premature, message: "the event arrived before the payment it depends on; retry later"},
	OutcomeConflict:         {label: "conflict", http: http.StatusUnprocessableEntity, body: "conflict", durable: durable.Conflict, message: "same key, different content: held for review"},
	OutcomeAmountMismatch:   {label: "amount_mismatch", http: http.StatusUnprocessableEntity, body: "amount_mismatch", durable: durable.AmountMismatch, message: "amount or currency differs from the order: held for review"},
	OutcomeRefundExceeds:    {label: "refund_exceeds", http: http.StatusUnprocessableEntity, body: "refund_exceeds", durable: durable.RefundExceeds, message: "refund beyond what the trade paid: held for review"},
	OutcomeMerchantMismatch: {label: "merchant_mismatch", http: http.StatusUnprocessableEntity, body: "merchant_mismatch"},
	OutcomeUnknownOrder:     {label: "unknown_order", http: http.StatusNotFound, body: "unknown_order", durable: durable.UnknownOrder, message: "unknown order: held for review"},
	OutcomeUnknownChannel:   {label: "unknown_channel", http: http.StatusNotFound, message: "unknown channel"},
	OutcomeBadSignature:     {label: "bad_signature", http: http.StatusUnauthorized},
	OutcomeBadRequest:       {label: "bad_request", http: http.StatusBadRequest},
	OutcomeTooLarge:         {label: "too_large", http: http.StatusRequestEntityTooLarge},
	OutcomeUnavailable:      {label: "unavailable", http: http.StatusServiceUnavailable, message: "temporarily unavailable; retry"},
	OutcomeInternal:         {label: "internal", http: http.StatusInternalServerError, message: "internal error; retry"},
}

// String returns the metric label of o.
func (o Outcome) String() string {
	if o < numOutcomes {
		return answers[o].label
	}
	return answers[OutcomeInternal].label
}

// fromDurable maps each durable outcome to its row, built from the table.
var fromDurable = func() map[durable.Outcome]Outcome {
	m := make(map[durable.Outcome]Outcome)
	for o, a := range answers {
		if a.durable != 0 {
			m[a.durable] = Outcome(o)
		}
	}
	return m
}()

// durableOutcome returns the request outcome of a durable outcome
// (OutcomeInternal for one the table does not answer).
func durableOutcome(o durable.Outcome) Outcome {
	if r, ok := fromDurable[o]; ok {
		return r
	}
	return OutcomeInternal
}

// fromReject maps an adapter's refusal to its outcome.
var fromReject = [...]Outcome{
	channel.BadRequest:       OutcomeBadRequest,
	channel.BadSignature:     OutcomeBadSignature,
	channel.MerchantMismatch: OutcomeMerchantMismatch,
}

// rejectOutcome returns the request outcome of an adapter's refusal.
func rejectOutcome(k channel.RejectKind) Outcome {
	if int(k) < len(fromReject) {
		return fromReject[k]
	}
	return OutcomeBadRequest
}

// doneVerdict is the answer of a DONE outcome (applied, skipped, and their
// replays): it depends only on the stored result, so every replay renders
// the first answer's bytes.
func doneVerdict(o durable.Outcome, status durable.State) channel.Verdict {
	return channel.Verdict{HTTP: http.StatusOK, Success: true, Outcome: o.String(), Status: string(status)}
}

// failVerdict is the answer of every other outcome; msg "" takes the
// table's message.
func failVerdict(o Outcome, status durable.State, msg string) channel.Verdict {
	if o >= numOutcomes {
		o = OutcomeInternal
	}
	a := &answers[o]
	if msg == "" {
		msg = a.message
	}
	return channel.Verdict{HTTP: a.http, Outcome: a.body, Status: string(status), Message: msg}
}
