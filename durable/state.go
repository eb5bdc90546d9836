package durable

import "strings"

// State is a value of biz_order.status.
type State string

// The order states of the contract's events/states table.
const (
	PendingPay State = "PENDING_PAY"
	Paid       State = "PAID"
	Shipped    State = "SHIPPED"
	Closed     State = "CLOSED"
	Refunded   State = "REFUNDED"
)

// States lists every order state, in the order the state machine's
// per-event tables are laid out.
var States = []State{PendingPay, Paid, Shipped, Closed, Refunded}

// Event is what moves an order: a channel event or an internal one.
type Event string

// The events of the contract's events/states table.
const (
	PaySuccess    Event = "PAY_SUCCESS"
	PayClosed     Event = "PAY_CLOSED"
	RefundSuccess Event = "REFUND_SUCCESS"
	TradeClosed   Event = "TRADE_CLOSED"
	// Ship comes from internal paths only (the shipping consumer), never
	// from a channel.
	Ship Event = "SHIP"
)

// ParseChannelEvent returns the event named s when a channel may send it.
// SHIP and unknown names return false: they are a malformed body.
func ParseChannelEvent(s []byte) (Event, bool) {
	switch string(s) { // no allocation: the compiler compares in place
	case string(PaySuccess):
		return PaySuccess, true
	case string(PayClosed):
		return PayClosed, true
	case string(RefundSuccess):
		return RefundSuccess, true
	case string(TradeClosed):
		return TradeClosed, true
	}
	return "", false
}

// ReviewReason is notify_review.reason: why a human must look.
type ReviewReason string

// The review reasons of the contract.
const (
	ReviewPayloadConflict  ReviewReason = "PAYLOAD_CONFLICT"
	ReviewAmountMismatch   ReviewReason = "AMOUNT_MISMATCH"
	ReviewMerchantMismatch ReviewReason = "MERCHANT_MISMATCH"
	ReviewUnknownOrder     ReviewReason = "UNKNOWN_ORDER"
	ReviewPaidAfterClose   ReviewReason = "PAID_AFTER_CLOSE"
	ReviewDuplicatePayment ReviewReason = "DUPLICATE_PAYMENT"
)

// ReviewReasons lists every review reason.
var ReviewReasons = []ReviewReason{
	ReviewPayloadConflict, ReviewAmountMismatch, ReviewMerchantMismatch,
	ReviewUnknownOrder, ReviewPaidAfterClose, ReviewDuplicatePayment,
}

// move is one legal transition of an event.
type move struct {
	from, to State
	topic    string
}

// machine is the events/states table: the only place in the code base that
// says which transition is legal. Both Process and Transition hand the row of
// their event to the same SQL function, so the database never holds a second
// copy that could drift.
var machine = map[Event][]move{
	PaySuccess:    {{PendingPay, Paid, "ORDER_PAID"}},
	PayClosed:     {{PendingPay, Closed, "ORDER_CLOSED"}},
	RefundSuccess: {{Paid, Refunded, "ORDER_REFUNDED"}, {Shipped, Refunded, "ORDER_REFUNDED"}},
	TradeClosed: {
		{PendingPay, Closed, "ORDER_CLOSED"},
		{Paid, Refunded, "ORDER_REFUNDED"},
		{Shipped, Refunded, "ORDER_REFUNDED"},
	},
	Ship: {{Paid, Shipped, "ORDER_SHIPPED"}},
}

// premature lists the states in which an event has arrived before the event
// it depends on: the channel's retry will land after it, so nothing is stored.
var premature = map[Event][]State{
	RefundSuccess: {PendingPay},
}

// reviews names the states in which an illegal event still means money
// moved, so a human must act on the acknowledged, skipped delivery.
var reviews = map[Event]map[State]ReviewReason{
	PaySuccess: {
		Closed:   ReviewPaidAfterClose,   // someone must refund
		Paid:     ReviewDuplicatePayment, // the customer may have paid twice
		Shipped:  ReviewDuplicatePayment,
		Refunded: ReviewDuplicatePayment,
	},
}

// Next returns the state that event e moves an order in state s to, and
// whether the move is legal.
func Next(e Event, s State) (State, bool) {
	for _, m := range machine[e] {
		if m.from == s {
			return m.to, true
		}
	}
	return "", false
}

// Topic returns the outbox topic of the legal move of e from s, or "".
func Topic(e Event, s State) string {
	for _, m := range machine[e] {
		if m.from == s {
			return m.topic
		}
	}
	return ""
}

// IsPremature reports whether e arriving on an order in state s is early.
func IsPremature(e Event, s State) bool {
	for _, p := range premature[e] {
		if p == s {
			return true
		}
	}
	return false
}

// rules is the row of the table for one event, laid out as the
// comma-separated parallel lists that the SQL functions take (element i
// describes States[i]; an empty element means none). They are built once, so
// a call passes constant strings.
type rules struct {
	states, to, topics, reviews, premature string
}

var eventRules = buildRules()

func buildRules() map[Event]*rules {
	out := make(map[Event]*rules, len(machine))
	for e := range machine {
		var states, to, topics, revs, early []string
		for _, s := range States {
			next, _ := Next(e, s)
			states = append(states, string(s))
			to = append(to, string(next))
			topics = append(topics, Topic(e, s))
			revs = append(revs, string(reviews[e][s]))
			if IsPremature(e, s) {
				early = append(early, string(s))
			}
		}
		j := func(l []string) string { return strings.Join(l, ",") }
		out[e] = &rules{j(states), j(to), j(topics), j(revs), j(early)}
	}
	return out
}
