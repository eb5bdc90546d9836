package durable

// State is a value of biz_order.status.
type State string

// The order states of the README's events/states table.
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

// The events of the README's events/states table.
const (
	PaySuccess    Event = "PAY_SUCCESS"
	PayClosed     Event = "PAY_CLOSED"
	RefundSuccess Event = "REFUND_SUCCESS"
	// RefundFailed is a channel's report that a refund did not reach the
	// buyer (WeChat REFUND.ABNORMAL / REFUND.CLOSED): acknowledged, skipped,
	// and a review row, in any state.
	RefundFailed Event = "REFUND_FAILED"
	TradeClosed  Event = "TRADE_CLOSED"
	// Ship comes from internal paths only (the shipping consumer), never
	// from a channel.
	Ship Event = "SHIP"
	// Close comes from internal paths only (the merchant cancels an unpaid
	// order through the orders API), never from a channel.
	Close Event = "CLOSE"
)

// Events lists every event, channel and internal.
var Events = []Event{PaySuccess, PayClosed, RefundSuccess, RefundFailed, TradeClosed, Ship, Close}

// ParseChannelEvent returns the event named s when a channel may send it.
// SHIP, CLOSE and unknown names return false: they are a malformed body.
func ParseChannelEvent(s []byte) (Event, bool) {
	switch string(s) { // no allocation: the compiler compares in place
	case string(PaySuccess):
		return PaySuccess, true
	case string(PayClosed):
		return PayClosed, true
	case string(RefundSuccess):
		return RefundSuccess, true
	case string(RefundFailed):
		return RefundFailed, true
	case string(TradeClosed):
		return TradeClosed, true
	}
	return "", false
}

// ReviewReason is notify_review.reason: why a human must look.
type ReviewReason string

// The review reasons in the README.
const (
	ReviewPayloadConflict  ReviewReason = "PAYLOAD_CONFLICT"
	ReviewAmountMismatch   ReviewReason = "AMOUNT_MISMATCH"
	ReviewMerchantMismatch ReviewReason = "MERCHANT_MISMATCH"
	ReviewUnknownOrder     ReviewReason = "UNKNOWN_ORDER"
	ReviewPaidAfterClose   ReviewReason = "PAID_AFTER_CLOSE"
	ReviewDuplicatePayment ReviewReason = "DUPLICATE_PAYMENT"
	// ReviewRefundExceeds: a refund of the paying trade would take the
	// refunded amount above the order's amount; it was refused (no claim).
	ReviewRefundExceeds ReviewReason = "REFUND_EXCEEDS"
	// ReviewRefundOtherTrade: a trade that is not the order's payer was
	// refunded, and no duplicate payment or payment after close of that
	// trade was on record to explain it.
	ReviewRefundOtherTrade ReviewReason = "REFUND_OTHER_TRADE"
	// ReviewRefundFailed: the channel reports a refund that failed: the
	// buyer did not get the money.
	ReviewRefundFailed ReviewReason = "REFUND_FAILED"
	// ReviewRefundedAtChannel: asked about an order still waiting for its
	// payment, the channel says the trade was paid and then refunded: the
	// order stays as it is (no goods against money the buyer got back),
	// and a person settles it with the order system.
	ReviewRefundedAtChannel ReviewReason = "REFUNDED_AT_CHANNEL"
	// ReviewNotInBill: a payment or refund recorded here is in none of
	// the channel's statements of its day, the day before and the day
	// after.
	ReviewNotInBill ReviewReason = "NOT_IN_BILL"
	// ReviewBillMismatch: the channel's statement and the ledger hold the
	// same payment or refund with different amounts.
	ReviewBillMismatch ReviewReason = "BILL_MISMATCH"
)

// ReviewReasons lists every review reason.
var ReviewReasons = []ReviewReason{
	ReviewPayloadConflict, ReviewAmountMismatch, ReviewMerchantMismatch,
	ReviewUnknownOrder, ReviewPaidAfterClose, ReviewDuplicatePayment,
	ReviewRefundExceeds, ReviewRefundOtherTrade, ReviewRefundFailed,
	ReviewRefundedAtChannel, ReviewNotInBill, ReviewBillMismatch,
}

// Topic is outbox.topic: what downstream consumers learn happened.
type Topic string

// The outbox topics.
const (
	TopicOrderPaid    Topic = "ORDER_PAID"
	TopicOrderShipped Topic = "ORDER_SHIPPED"
	TopicOrderClosed  Topic = "ORDER_CLOSED"
	// TopicOrderRefunded: the paying trade is refunded in full (the last
	// refund, or TRADE_CLOSED); the order is REFUNDED.
	TopicOrderRefunded Topic = "ORDER_REFUNDED"
	// TopicOrderPartiallyRefunded: a refund of the paying trade that leaves
	// part of the amount paid; the order keeps its state. It may repeat.
	TopicOrderPartiallyRefunded Topic = "ORDER_PARTIALLY_REFUNDED"
)

// Topics lists every outbox topic.
var Topics = []Topic{TopicOrderPaid, TopicOrderShipped, TopicOrderClosed, TopicOrderRefunded, TopicOrderPartiallyRefunded}

// party is whose trade an event names, as the order sees it: the trade that
// paid it (biz_order.paid_by), or another one. The values are the SQL
// functions' vocabulary.
type party string

const (
	// anyTrade: the cell holds whatever trade the event names (an unpaid
	// order has no payer to compare with; on CLOSED every trade is another).
	anyTrade party = ""
	// payingTrade: the event names the order's payer. For an event that
	// adopts (eventTable.adopt), a paid order without paid_by takes the
	// trade the event names as its payer, and this cell applies.
	payingTrade party = "paying"
	// otherTrade: the event names another trade than the payer.
	otherTrade party = "other"
)

// action is what a cell of the state machine does. The values are the SQL
// functions' vocabulary (durable/sql).
type action string

const (
	// actMove: the conditional transition from -> to, with its outbox row.
	actMove action = "move"
	// actPay: actMove that records the event's trade as the order's payer.
	actPay action = "pay"
	// actSettle: the paying trade was closed by the channel, so it is
	// refunded in full: -> REFUNDED, refunded_amount = amount, the part not
	// refunded before recorded as one refund without an id.
	actSettle action = "settle"
	// actRefund: a refund of the paying trade: refunded_amount raised (to
	// the total when cumulative); -> to once it reaches the amount, else
	// the state stays and the topic is the partial one. A refund already
	// recorded, or a total that raises nothing, is skipped; one beyond the
	// amount is refund_exceeds.
	actRefund action = "refund"
	// actItemise: a refund of the paying trade of an order refunded
	// already: skipped, and recorded against the part refunded without an
	// id (TRADE_CLOSED's) when it fits there.
	actItemise action = "itemise"
	// actRecord: a refund of another trade: skipped, recorded; it resolves
	// that trade's open DUPLICATE_PAYMENT / PAID_AFTER_CLOSE row once the
	// trade's recorded refunds reach the amount, or opens
	// REFUND_OTHER_TRADE when there is no such row.
	actRecord action = "record"
	// actSkip: acknowledged, order untouched (review, if the cell has one).
	actSkip action = "skip"
	// actPremature: too early (a refund before its payment): nothing stored.
	actPremature action = "premature"
)

// actions lists every action (the vocabulary test checks the SQL knows each).
var actions = []action{actMove, actPay, actSettle, actRefund, actItemise, actRecord, actSkip, actPremature}

// movesMoney reports whether a cell of this action needs the event's trade
// and refund: internal paths (Transition), which have neither, refuse such
// events.
func (a action) movesMoney() bool {
	return a == actSettle || a == actRefund || a == actItemise || a == actRecord
}

// cell is one entry of the state machine: what event e does to an order in
// state from, for the trade party (anyTrade: whatever the trade).
type cell struct {
	from   State
	party  party
	act    action
	to     State        // actMove, actPay, actSettle, actRefund (once in full)
	topic  Topic        // the outbox topic of a move to `to`
	review ReviewReason // actSkip: the review a skipped delivery opens
}

// eventTable is one event's row of the state machine.
type eventTable struct {
	// cells cover every state once, or twice (payingTrade then otherTrade)
	// where the trade decides.
	cells []cell
	// adopt: a paid order without paid_by takes the trade this event names
	// as its payer (the README's "Upgrading": refunds and closes do,
	// payments do not: a payment we cannot place is a possible second
	// payment, for a human to look at), unless that trade paid another
	// order: one trade pays one order, so the event is another trade's.
	adopt bool
	// partial is the topic of a refund that leaves part of the amount.
	partial Topic
}

// machine is the README's events/states table together with its "Trades
// and refunds" table: the only place in the code base that says what an
// event does to an order. Process, Transition and Ship hand the row of
// their event to the SQL functions as arrays, so the database never holds
// a second copy that could drift. durable's package doc draws it.
var machine = map[Event]eventTable{
	PaySuccess: {cells: []cell{
		{from: PendingPay, act: actPay, to: Paid, topic: TopicOrderPaid},
		// A late duplicate of the payment whose claim retention deleted.
		{from: Paid, party: payingTrade, act: actSkip},
		{from: Paid, party: otherTrade, act: actSkip, review: ReviewDuplicatePayment},
		{from: Shipped, party: payingTrade, act: actSkip},
		{from: Shipped, party: otherTrade, act: actSkip, review: ReviewDuplicatePayment},
		{from: Closed, act: actSkip, review: ReviewPaidAfterClose},
		{from: Refunded, party: payingTrade, act: actSkip},
		{from: Refunded, party: otherTrade, act: actSkip, review: ReviewDuplicatePayment},
	}},
	PayClosed: {cells: []cell{
		{from: PendingPay, act: actMove, to: Closed, topic: TopicOrderClosed},
		// On a paid order, a stale "unpaid, closed" snapshot: the incident.
		{from: Paid, act: actSkip},
		{from: Shipped, act: actSkip},
		{from: Closed, act: actSkip},
		{from: Refunded, act: actSkip},
	}},
	RefundSuccess: {adopt: true, partial: TopicOrderPartiallyRefunded, cells: []cell{
		{from: PendingPay, act: actPremature},
		{from: Paid, party: payingTrade, act: actRefund, to: Refunded, topic: TopicOrderRefunded},
		{from: Paid, party: otherTrade, act: actRecord},
		{from: Shipped, party: payingTrade, act: actRefund, to: Refunded, topic: TopicOrderRefunded},
		{from: Shipped, party: otherTrade, act: actRecord},
		{from: Closed, act: actRecord},
		{from: Refunded, party: payingTrade, act: actItemise},
		{from: Refunded, party: otherTrade, act: actRecord},
	}},
	RefundFailed: {cells: []cell{
		{from: PendingPay, act: actSkip, review: ReviewRefundFailed},
		{from: Paid, act: actSkip, review: ReviewRefundFailed},
		{from: Shipped, act: actSkip, review: ReviewRefundFailed},
		{from: Closed, act: actSkip, review: ReviewRefundFailed},
		{from: Refunded, act: actSkip, review: ReviewRefundFailed},
	}},
	TradeClosed: {adopt: true, cells: []cell{
		{from: PendingPay, act: actMove, to: Closed, topic: TopicOrderClosed},
		{from: Paid, party: payingTrade, act: actSettle, to: Refunded, topic: TopicOrderRefunded},
		// An abandoned payment attempt closed: nothing to do.
		{from: Paid, party: otherTrade, act: actSkip},
		{from: Shipped, party: payingTrade, act: actSettle, to: Refunded, topic: TopicOrderRefunded},
		{from: Shipped, party: otherTrade, act: actSkip},
		{from: Closed, act: actSkip},
		{from: Refunded, party: payingTrade, act: actSkip},
		{from: Refunded, party: otherTrade, act: actSkip},
	}},
	Ship: {cells: []cell{
		{from: PendingPay, act: actSkip},
		{from: Paid, act: actMove, to: Shipped, topic: TopicOrderShipped},
		{from: Shipped, act: actSkip},
		{from: Closed, act: actSkip},
		{from: Refunded, act: actSkip},
	}},
	Close: {cells: []cell{
		{from: PendingPay, act: actMove, to: Closed, topic: TopicOrderClosed},
		{from: Paid, act: actSkip},
		{from: Shipped, act: actSkip},
		{from: Closed, act: actSkip},
		{from: Refunded, act: actSkip},
	}},
}

// rules is an event's row of the machine laid out as the parallel text[]
// arguments of the SQL functions: element i describes cell i. Built once:
// Process writes them into its statements as constants (processSQL),
// Transition and Ship pass the same slices as parameters on every call.
type rules struct {
	from, party, act, to, topic, review []string
	partial                             string
	adopt                               bool
	// internal: no cell moves money, so an internal path (no trade, no
	// refund) may run the event through Transition.
	internal bool
}

var eventRules = buildRules()

func buildRules() map[Event]*rules {
	out := make(map[Event]*rules, len(machine))
	for e, t := range machine {
		r := &rules{partial: string(t.partial), adopt: t.adopt, internal: true}
		for _, c := range t.cells {
			r.from = append(r.from, string(c.from))
			r.party = append(r.party, string(c.party))
			r.act = append(r.act, string(c.act))
			r.to = append(r.to, string(c.to))
			r.topic = append(r.topic, string(c.topic))
			r.review = append(r.review, string(c.review))
			if c.act.movesMoney() {
				r.internal = false
			}
		}
		out[e] = r
	}
	return out
}

// target is the state the event's move leads to ("" when none moves): an
// internal event on an order already there is a repeat, not a refusal.
func (r *rules) target() State {
	for _, to := range r.to {
		if to != "" {
			return State(to)
		}
	}
	return ""
}
