package durable_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
)

// delivery builds one notification for an order of the given amount.
type delivery func(orderNo string, amount int64) durable.Notification

// chNote is note for channel ch: event e of trade ch:txn, keyed by
// refundID when it has one, with the README's digest.
func chNote(ch, txn string, e durable.Event, orderNo string, amount int64, refundID string, refundAmount int64, cumulative bool) durable.Notification {
	key := txn
	digest := fmt.Sprintf("%s\n%s\n%s\n%d\nCNY", txn, e, orderNo, amount)
	if refundID != "" {
		key = refundID
		digest += fmt.Sprintf("\n%s\n%d", refundID, refundAmount)
	}
	sum := sha256.Sum256([]byte(digest))
	return durable.Notification{
		BizKey: fmt.Sprintf("%s:%s:%s", ch, key, e), OrderNo: orderNo, Event: e,
		Amount: amount, Currency: "CNY", Digest: hex.EncodeToString(sum[:]),
		RawBody: fmt.Appendf(nil, `{"channel_txn_id":%q,"event_type":%q,"refund_id":%q}`, txn, e, refundID),
		Trade:   ch + ":" + txn, RefundID: refundID, RefundAmount: refundAmount, Cumulative: cumulative,
	}
}

// ev is event e of trade ch:txn (a payment, or a close).
func ev(ch, txn string, e durable.Event) delivery {
	return func(orderNo string, amount int64) durable.Notification {
		return chNote(ch, txn, e, orderNo, amount, "", 0, false)
	}
}

// rf is a refund of trade ch:txn: refundAmount 0 refunds the whole amount.
func rf(ch, txn, refundID string, refundAmount int64) delivery {
	return func(orderNo string, amount int64) durable.Notification {
		if refundAmount == 0 {
			refundAmount = amount
		}
		return chNote(ch, txn, durable.RefundSuccess, orderNo, amount, refundID, refundAmount, false)
	}
}

// cum is a cumulative refund notification of trade ch:txn: total is the
// trade's refunded total so far (Alipay's refund_fee).
func cum(ch, txn, refundID string, total int64) delivery {
	return func(orderNo string, amount int64) durable.Notification {
		return chNote(ch, txn, durable.RefundSuccess, orderNo, amount, refundID, total, true)
	}
}

// step is one delivery of a scenario and the answer it must get; forget
// steps delete every claim first, as retention does.
type step struct {
	d       delivery
	outcome durable.Outcome
	status  durable.State
	review  durable.ReviewReason
	replay  bool // the answer replays an earlier delivery's
	forget  bool
}

func forget() step { return step{forget: true} }

// tradeScenario is a sequence of deliveries to one order, then what the
// order, its refunds, outbox and reviews must hold. Trades in refunds are
// channel:txn as delivered.
type tradeScenario struct {
	name     string
	steps    []step
	status   durable.State
	payer    string
	refunded int64
	refunds  []refund
	topics   []string
	// moves lists the refund payloads: "from->to trade refund_id +refund_amount =refunded_amount".
	moves   []string
	reviews []string
}

func TestTradesAndRefunds(t *testing.T) {
	const amount = 1999
	const (
		A = durable.Paid
		C = durable.Closed
		R = durable.Refunded
	)
	applied, skipped, exceeds := durable.Applied, durable.Skipped, durable.RefundExceeds
	scenarios := []tradeScenario{
		{
			name: "a refund on CLOSED resolves the payment after close, once the trade is refunded in full",
			steps: []step{
				{d: ev("test", "A1", durable.PayClosed), outcome: applied, status: C},
				{d: ev("test", "W1", durable.PaySuccess), outcome: skipped, status: C, review: durable.ReviewPaidAfterClose},
				{d: rf("test", "W1", "W1-r1", 1000), outcome: skipped, status: C},
				{d: rf("test", "W1", "W1-r2", 999), outcome: skipped, status: C},
			},
			status: C, refunds: []refund{{"test:W1", "W1-r1", 1000}, {"test:W1", "W1-r2", 999}},
			topics:  []string{"ORDER_CLOSED"},
			reviews: []string{"PAID_AFTER_CLOSE resolved by notifyedge"},
		},
		{
			name: "Alipay closes an abandoned attempt before WeChat's delayed payment lands",
			steps: []step{
				{d: ev("alipay", "2026120222001", durable.TradeClosed), outcome: applied, status: C},
				{d: ev("wechatpay", "4200001234", durable.PaySuccess), outcome: skipped, status: C, review: durable.ReviewPaidAfterClose},
				{d: rf("wechatpay", "4200001234", "50300001", 0), outcome: skipped, status: C},
			},
			status: C, refunds: []refund{{"wechatpay:4200001234", "50300001", amount}},
			topics:  []string{"ORDER_CLOSED"},
			reviews: []string{"PAID_AFTER_CLOSE resolved by notifyedge"},
		},
		{
			name: "a full refund without an id re-sent after its claim was deleted",
			steps: []step{
				{d: ev("test", "P1", durable.PaySuccess), outcome: applied, status: A},
				{d: rf("test", "P1", "", 0), outcome: applied, status: R},
				forget(),
				{d: rf("test", "P1", "", 0), outcome: skipped, status: R},
			},
			status: R, payer: "test:P1", refunded: amount, refunds: []refund{{"test:P1", "", amount}},
			topics: []string{"ORDER_PAID", "ORDER_REFUNDED"},
			moves:  []string{"PAID->REFUNDED test:P1 <nil> +1999 =1999"},
		},
		{
			name: "a full refund with an id re-sent after its claim was deleted",
			steps: []step{
				{d: ev("test", "P1", durable.PaySuccess), outcome: applied, status: A},
				{d: rf("test", "P1", "F1", 0), outcome: applied, status: R},
				forget(),
				{d: rf("test", "P1", "F1", 0), outcome: skipped, status: R},
				{d: ev("test", "P1", durable.TradeClosed), outcome: skipped, status: R},
			},
			status: R, payer: "test:P1", refunded: amount, refunds: []refund{{"test:P1", "F1", amount}},
			topics: []string{"ORDER_PAID", "ORDER_REFUNDED"},
			moves:  []string{"PAID->REFUNDED test:P1 F1 +1999 =1999"},
		},
		{
			name: "TRADE_CLOSED of the paying trade after a partial refund, then the rest's own notification",
			steps: []step{
				{d: ev("test", "P1", durable.PaySuccess), outcome: applied, status: A},
				{d: rf("test", "P1", "r1", 500), outcome: applied, status: A},
				{d: ev("test", "P1", durable.TradeClosed), outcome: applied, status: R},
				{d: rf("test", "P1", "r2", 1499), outcome: skipped, status: R},
				{d: rf("test", "P1", "", 0), outcome: skipped, status: R}, // the trade's full refund: recorded already
			},
			status: R, payer: "test:P1", refunded: amount,
			refunds: []refund{{"test:P1", "", 0}, {"test:P1", "r1", 500}, {"test:P1", "r2", 1499}},
			topics:  []string{"ORDER_PAID", "ORDER_PARTIALLY_REFUNDED", "ORDER_REFUNDED"},
			moves:   []string{"PAID->PAID test:P1 r1 +500 =500", "PAID->REFUNDED test:P1 <nil> +1499 =1999"},
		},
		{
			name: "a late duplicate of the payment after its claim was deleted, then a second payment",
			steps: []step{
				{d: ev("test", "P1", durable.PaySuccess), outcome: applied, status: A},
				forget(),
				{d: ev("test", "P1", durable.PaySuccess), outcome: skipped, status: A},
				{d: ev("test", "P2", durable.PaySuccess), outcome: skipped, status: A, review: durable.ReviewDuplicatePayment},
				{d: ev("test", "P2", durable.TradeClosed), outcome: skipped, status: A}, // not the payer
				{d: ev("test", "P1", durable.PayClosed), outcome: skipped, status: A},   // a stale snapshot
			},
			status: A, payer: "test:P1",
			topics:  []string{"ORDER_PAID"},
			reviews: []string{"DUPLICATE_PAYMENT open"},
		},
		{
			name: "a duplicate payment refunded in two parts, then a refund beyond it",
			steps: []step{
				{d: ev("test", "P1", durable.PaySuccess), outcome: applied, status: A},
				{d: ev("test", "P2", durable.PaySuccess), outcome: skipped, status: A, review: durable.ReviewDuplicatePayment},
				{d: rf("test", "P2", "d1", 1000), outcome: skipped, status: A},
				{d: rf("test", "P2", "d2", 999), outcome: skipped, status: A},
				{d: rf("test", "P2", "d3", 1), outcome: skipped, status: A, review: durable.ReviewRefundOtherTrade},
			},
			status: A, payer: "test:P1",
			refunds: []refund{{"test:P2", "d1", 1000}, {"test:P2", "d2", 999}, {"test:P2", "d3", 1}},
			topics:  []string{"ORDER_PAID"},
			reviews: []string{"DUPLICATE_PAYMENT resolved by notifyedge", "REFUND_OTHER_TRADE open"},
		},
		{
			name: "a duplicate payment refunded by cumulative totals",
			steps: []step{
				{d: ev("alipay", "P1", durable.PaySuccess), outcome: applied, status: A},
				{d: ev("alipay", "P2", durable.PaySuccess), outcome: skipped, status: A, review: durable.ReviewDuplicatePayment},
				{d: cum("alipay", "P2", "x2", 1999), outcome: skipped, status: A},
				{d: cum("alipay", "P2", "x1", 1000), outcome: skipped, status: A}, // adds nothing: not recorded
			},
			status: A, payer: "alipay:P1",
			refunds: []refund{{"alipay:P2", "x2", 1999}},
			topics:  []string{"ORDER_PAID"},
			reviews: []string{"DUPLICATE_PAYMENT resolved by notifyedge"},
		},
		{
			name: "a refund beyond the amount is refused, each time, with one review row",
			steps: []step{
				{d: ev("test", "P1", durable.PaySuccess), outcome: applied, status: A},
				{d: rf("test", "P1", "r1", 1500), outcome: applied, status: A},
				{d: rf("test", "P1", "r2", 600), outcome: exceeds, status: A, review: durable.ReviewRefundExceeds},
				{d: rf("test", "P1", "r2", 600), outcome: exceeds, status: A, review: durable.ReviewRefundExceeds},
				{d: cum("test", "P1", "r3", amount+1), outcome: exceeds, status: A, review: durable.ReviewRefundExceeds},
				{d: rf("test", "P1", "r4", 499), outcome: applied, status: R},
			},
			status: R, payer: "test:P1", refunded: amount,
			refunds: []refund{{"test:P1", "r1", 1500}, {"test:P1", "r4", 499}},
			topics:  []string{"ORDER_PAID", "ORDER_PARTIALLY_REFUNDED", "ORDER_REFUNDED"},
			moves:   []string{"PAID->PAID test:P1 r1 +1500 =1500", "PAID->REFUNDED test:P1 r4 +499 =1999"},
			reviews: []string{"REFUND_EXCEEDS open", "REFUND_EXCEEDS open"},
		},
		{
			name: "a failed refund is a review, whatever the state",
			steps: []step{
				{d: ev("wechatpay", "P1", durable.PaySuccess), outcome: applied, status: A},
				{d: func(o string, a int64) durable.Notification {
					return chNote("wechatpay", "P1", durable.RefundFailed, o, a, "503", a, false)
				}, outcome: skipped, status: A, review: durable.ReviewRefundFailed},
			},
			status: A, payer: "wechatpay:P1",
			topics:  []string{"ORDER_PAID"},
			reviews: []string{"REFUND_FAILED open"},
		},
		// Point 2: partial refunds out of order and twice never refund twice.
		{
			name: "cumulative totals delivered in reverse order, each twice, and again after retention",
			steps: []step{
				{d: ev("alipay", "P1", durable.PaySuccess), outcome: applied, status: A},
				{d: cum("alipay", "P1", "c2", 1200), outcome: applied, status: A},
				{d: cum("alipay", "P1", "c2", 1200), outcome: applied, status: A, replay: true},
				{d: cum("alipay", "P1", "c1", 500), outcome: skipped, status: A},
				{d: cum("alipay", "P1", "c1", 500), outcome: skipped, status: A, replay: true},
				{d: cum("alipay", "P1", "c3", 1999), outcome: applied, status: R},
				{d: cum("alipay", "P1", "c3", 1999), outcome: applied, status: R, replay: true},
				forget(),
				{d: cum("alipay", "P1", "c1", 500), outcome: skipped, status: R},
				{d: cum("alipay", "P1", "c2", 1200), outcome: skipped, status: R},
				{d: cum("alipay", "P1", "c3", 1999), outcome: skipped, status: R},
			},
			status: R, payer: "alipay:P1", refunded: amount,
			refunds: []refund{{"alipay:P1", "c2", 1200}, {"alipay:P1", "c3", 799}},
			topics:  []string{"ORDER_PAID", "ORDER_PARTIALLY_REFUNDED", "ORDER_REFUNDED"},
			moves:   []string{"PAID->PAID alipay:P1 c2 +1200 =1200", "PAID->REFUNDED alipay:P1 c3 +799 =1999"},
		},
		{
			name: "cumulative totals in order, then the first again after retention",
			steps: []step{
				{d: ev("alipay", "P1", durable.PaySuccess), outcome: applied, status: A},
				{d: cum("alipay", "P1", "c1", 500), outcome: applied, status: A},
				{d: cum("alipay", "P1", "c2", 1200), outcome: applied, status: A},
				forget(),
				{d: cum("alipay", "P1", "c1", 500), outcome: skipped, status: A},
			},
			status: A, payer: "alipay:P1", refunded: 1200,
			refunds: []refund{{"alipay:P1", "c1", 500}, {"alipay:P1", "c2", 700}},
			topics:  []string{"ORDER_PAID", "ORDER_PARTIALLY_REFUNDED", "ORDER_PARTIALLY_REFUNDED"},
			moves:   []string{"PAID->PAID alipay:P1 c1 +500 =500", "PAID->PAID alipay:P1 c2 +700 =1200"},
		},
		{
			name: "refunds with ids delivered in reverse order, each twice, and again after retention",
			steps: []step{
				{d: ev("wechatpay", "P1", durable.PaySuccess), outcome: applied, status: A},
				{d: rf("wechatpay", "P1", "r2", 700), outcome: applied, status: A},
				{d: rf("wechatpay", "P1", "r2", 700), outcome: applied, status: A, replay: true},
				{d: rf("wechatpay", "P1", "r1", 500), outcome: applied, status: A},
				{d: rf("wechatpay", "P1", "r1", 500), outcome: applied, status: A, replay: true},
				forget(),
				{d: rf("wechatpay", "P1", "r1", 500), outcome: skipped, status: A},
				{d: rf("wechatpay", "P1", "r2", 700), outcome: skipped, status: A},
				{d: rf("wechatpay", "P1", "r3", 799), outcome: applied, status: R},
			},
			status: R, payer: "wechatpay:P1", refunded: amount,
			refunds: []refund{{"wechatpay:P1", "r1", 500}, {"wechatpay:P1", "r2", 700}, {"wechatpay:P1", "r3", 799}},
			topics:  []string{"ORDER_PAID", "ORDER_PARTIALLY_REFUNDED", "ORDER_PARTIALLY_REFUNDED", "ORDER_REFUNDED"},
			moves: []string{"PAID->PAID wechatpay:P1 r2 +700 =700", "PAID->PAID wechatpay:P1 r1 +500 =1200",
				"PAID->REFUNDED wechatpay:P1 r3 +799 =1999"},
		},
		{
			name: "a partial refund of a shipped order keeps it shipped",
			steps: []step{
				{d: ev("test", "P1", durable.PaySuccess), outcome: applied, status: A},
				{d: func(o string, _ int64) durable.Notification { return shipNote(o) }, outcome: applied, status: durable.Shipped},
				{d: rf("test", "P1", "r1", 1000), outcome: applied, status: durable.Shipped},
				{d: ev("test", "P1", durable.TradeClosed), outcome: applied, status: R},
			},
			status: R, payer: "test:P1", refunded: amount,
			refunds: []refund{{"test:P1", "", 999}, {"test:P1", "r1", 1000}},
			topics:  []string{"ORDER_PAID", "ORDER_SHIPPED", "ORDER_PARTIALLY_REFUNDED", "ORDER_REFUNDED"},
			moves:   []string{"SHIPPED->SHIPPED test:P1 r1 +1000 =1000", "SHIPPED->REFUNDED test:P1 <nil> +999 =1999"},
		},
	}
	ctx := context.Background()
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t) // a database of its own: the scenarios share txn ids
			const orderNo = "O-1"
			b.order(t, orderNo, durable.PendingPay, amount, "CNY")
			var keys []string
			forgot := false
			for j, s := range sc.steps {
				if s.forget {
					b.forget(t, keys...)
					forgot = true
					continue
				}
				n := s.d(orderNo, amount)
				if n.Event == durable.Ship { // an internal step
					if _, err := b.store.Transition(ctx, orderNo, durable.Ship); err != nil {
						t.Fatalf("step %d: ship: %v", j, err)
					}
					continue
				}
				keys = append(keys, n.BizKey)
				got := process(t, b.store, n)
				if got.Outcome != s.outcome || got.Status != s.status || got.Review != s.review || got.Replayed != s.replay {
					t.Fatalf("step %d (%s): got %v/%s/review %q/replayed %v, want %v/%s/review %q/replayed %v", j, n.BizKey,
						got.Outcome, got.Status, got.Review, got.Replayed, s.outcome, s.status, s.review, s.replay)
				}
				if !s.outcome.Done() {
					if c := b.claims(t, n.BizKey); c != 0 {
						t.Errorf("step %d: %s left %d claims, want none", j, s.outcome, c)
					}
				}
			}
			if st := b.status(t, orderNo); st != sc.status {
				t.Errorf("status %s, want %s", st, sc.status)
			}
			payer, refunded, refunds := b.money(t, orderNo)
			if payer != sc.payer || refunded != sc.refunded {
				t.Errorf("paid_by %q refunded_amount %d, want %q and %d", payer, refunded, sc.payer, sc.refunded)
			}
			if d := cmp.Diff(sc.refunds, refunds); d != "" {
				t.Errorf("trade_refund rows (-want +got):\n%s", d)
			}
			if d := cmp.Diff(sc.topics, b.topics(t, orderNo)); d != "" {
				t.Errorf("outbox topics (-want +got):\n%s", d)
			}
			var moves []string
			for _, p := range b.payloads(t, orderNo) {
				if _, ok := p["refund_amount"]; ok {
					moves = append(moves, fmt.Sprintf("%v->%v %v %v +%v =%v", p["from"], p["to"], p["trade"], p["refund_id"], p["refund_amount"], p["refunded_amount"]))
				}
			}
			if d := cmp.Diff(sc.moves, moves); d != "" {
				t.Errorf("refund payloads (-want +got):\n%s", d)
			}
			if d := cmp.Diff(sc.reviews, b.reviews(t, orderNo)); d != "" {
				t.Errorf("review rows (-want +got):\n%s", d)
			}
			// Retention breaks the claim/outbox pairing Invariants checks; the
			// refund invariants are the refunded amount and rows above.
			if !forgot {
				if err := durabletest.Invariants(ctx, b.db, orderNo, nil); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// shipNote marks a scenario step that ships the order through Transition.
func shipNote(orderNo string) durable.Notification {
	return durable.Notification{OrderNo: orderNo, Event: durable.Ship}
}
