package edge

import (
	"net/http"

	"github.com/notifyedge/notifyedge/durable"
)

// Outcome is how a request ended: the outcome label of
// notifyedge_requests_total.
type Outcome uint8

// The contract's request outcomes.
const (
	OutcomeApplied Outcome = iota
	OutcomeSkipped
	OutcomeReplayedCache
	OutcomeReplayedDB
	OutcomePremature
	OutcomeConflict
	OutcomeAmountMismatch
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

var outcomeLabels = [numOutcomes]string{
	"applied", "skipped", "replayed_cache", "replayed_db", "premature", "conflict",
	"amount_mismatch", "merchant_mismatch", "unknown_order", "unknown_channel",
	"bad_signature", "bad_request", "too_large", "unavailable", "internal",
}

// String returns the metric label of o.
func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeLabels[o]
	}
	return "internal"
}

// Verdict is one answer before a channel renders it.
type Verdict struct {
	// HTTP is the status code.
	HTTP int
	// Success is true for a SUCCESS answer (code "SUCCESS"), false for FAIL.
	Success bool
	// Outcome is the body's outcome ("" to omit it): applied, skipped,
	// premature, conflict, amount_mismatch, merchant_mismatch, unknown_order.
	Outcome string
	// Status is the order's state ("" to omit it).
	Status string
	// Message says why, for a FAIL ("" to omit it).
	Message string
}

// Code returns "SUCCESS" or "FAIL".
func (v *Verdict) Code() string {
	if v.Success {
		return "SUCCESS"
	}
	return "FAIL"
}

// The answers table. For DONE outcomes (applied, skipped, and their replays)
// the verdict depends only on the stored result, so every replay renders
// the first answer's bytes.
func doneVerdict(o durable.Outcome, status durable.State) Verdict {
	return Verdict{HTTP: http.StatusOK, Success: true, Outcome: o.String(), Status: string(status)}
}

// failVerdict maps a durable result that is not DONE, and every rejection,
// to its answer.
func failVerdict(o Outcome, status durable.State, msg string) Verdict {
	v := Verdict{Status: string(status), Message: msg}
	switch o {
	case OutcomePremature:
		v.HTTP, v.Outcome = http.StatusConflict, "premature"
	case OutcomeConflict:
		v.HTTP, v.Outcome = http.StatusUnprocessableEntity, "conflict"
	case OutcomeAmountMismatch:
		v.HTTP, v.Outcome = http.StatusUnprocessableEntity, "amount_mismatch"
	case OutcomeMerchantMismatch:
		v.HTTP, v.Outcome = http.StatusUnprocessableEntity, "merchant_mismatch"
	case OutcomeUnknownOrder:
		v.HTTP, v.Outcome = http.StatusNotFound, "unknown_order"
	case OutcomeUnknownChannel:
		v.HTTP = http.StatusNotFound
	case OutcomeBadSignature:
		v.HTTP = http.StatusUnauthorized
	case OutcomeBadRequest:
		v.HTTP = http.StatusBadRequest
	case OutcomeTooLarge:
		v.HTTP = http.StatusRequestEntityTooLarge
	case OutcomeUnavailable:
		v.HTTP = http.StatusServiceUnavailable
	default:
		v.HTTP = http.StatusInternalServerError
	}
	return v
}

// resultOutcome maps durable's non-DONE outcomes to request outcomes.
func resultOutcome(o durable.Outcome) Outcome {
	switch o {
	case durable.Premature:
		return OutcomePremature
	case durable.Conflict:
		return OutcomeConflict
	case durable.AmountMismatch:
		return OutcomeAmountMismatch
	case durable.UnknownOrder:
		return OutcomeUnknownOrder
	}
	return OutcomeInternal
}

var resultMessages = map[durable.Outcome]string{
	durable.Premature:      "the event arrived before the payment it depends on; retry later",
	durable.Conflict:       "same key, different content: held for review",
	durable.AmountMismatch: "amount or currency differs from the order: held for review",
	durable.UnknownOrder:   "unknown order: held for review",
}

func channelEvent(b []byte) bool {
	_, ok := durable.ParseChannelEvent(b)
	return ok
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// appendVerdictJSON appends {"code":..,"outcome":..,"status":..,"message":..},
// keys in that order, empty ones omitted: the generic channel's answer.
func appendVerdictJSON(dst []byte, v *Verdict) []byte {
	dst = append(dst, `{"code":`...)
	dst = appendJSONString(dst, v.Code())
	if v.Outcome != "" {
		dst = append(dst, `,"outcome":`...)
		dst = appendJSONString(dst, v.Outcome)
	}
	if v.Status != "" {
		dst = append(dst, `,"status":`...)
		dst = appendJSONString(dst, v.Status)
	}
	if v.Message != "" {
		dst = append(dst, `,"message":`...)
		dst = appendJSONString(dst, v.Message)
	}
	return append(dst, '}')
}
