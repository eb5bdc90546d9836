package durable_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
)

// Point 1: every event in every state, for every trade the event may name:
// the order's payer ("paying"), another trade while the order has a payer
// ("other"), or any trade while it has none ("none": unpaid, or paid before
// the payer was recorded). The expectations are written out here, not
// derived from durable's table.
func TestProcessEveryEventInEveryState(t *testing.T) {
	const amount = 1999
	// In want, trades are named: P is the seeded payer, N the event's trade
	// when it is another one; refund ids are R (the event's) or "" (none).
	type want struct {
		outcome durable.Outcome
		status  durable.State        // after
		topic   string               // outbox topic, "" for none
		review  durable.ReviewReason // the review row opened, "" for none
		payer   string               // paid_by after: "P", "N" or "" (NULL)
		refunds []refund             // trade_refund rows after, by trade then refund id
	}
	const (
		P = durable.PendingPay
		A = durable.Paid
		S = durable.Shipped
		C = durable.Closed
		R = durable.Refunded
	)
	applied := func(to durable.State, topic, payer string, refunds ...refund) want {
		return want{durable.Applied, to, topic, "", payer, refunds}
	}
	skipped := func(st durable.State, review durable.ReviewReason, payer string, refunds ...refund) want {
		return want{durable.Skipped, st, "", review, payer, refunds}
	}
	full := func(trade, refundID string) refund { return refund{trade, refundID, amount} }
	// What a REFUNDED order with a payer holds: refunded in full by a
	// refund without an id (TRADE_CLOSED's, or the upgrade's).
	aggregate := full("P", "")
	type row struct {
		e    durable.Event
		from durable.State
		rel  string // paying, other, none
		w    want
	}
	table := []row{
		{durable.PaySuccess, P, "none", applied(A, "ORDER_PAID", "N")},
		{durable.PaySuccess, A, "paying", skipped(A, "", "P")}, // a late duplicate whose claim is gone
		{durable.PaySuccess, A, "other", skipped(A, durable.ReviewDuplicatePayment, "P")},
		{durable.PaySuccess, A, "none", skipped(A, durable.ReviewDuplicatePayment, "")}, // payments never adopt
		{durable.PaySuccess, S, "paying", skipped(S, "", "P")},
		{durable.PaySuccess, S, "other", skipped(S, durable.ReviewDuplicatePayment, "P")},
		{durable.PaySuccess, S, "none", skipped(S, durable.ReviewDuplicatePayment, "")},
		{durable.PaySuccess, C, "none", skipped(C, durable.ReviewPaidAfterClose, "")},
		{durable.PaySuccess, R, "paying", skipped(R, "", "P", aggregate)},
		{durable.PaySuccess, R, "other", skipped(R, durable.ReviewDuplicatePayment, "P", aggregate)},
		{durable.PaySuccess, R, "none", skipped(R, durable.ReviewDuplicatePayment, "")},

		{durable.PayClosed, P, "none", applied(C, "ORDER_CLOSED", "")},
		{durable.PayClosed, A, "paying", skipped(A, "", "P")}, // the incident's stale snapshot
		{durable.PayClosed, A, "other", skipped(A, "", "P")},
		{durable.PayClosed, A, "none", skipped(A, "", "")},
		{durable.PayClosed, S, "paying", skipped(S, "", "P")},
		{durable.PayClosed, S, "other", skipped(S, "", "P")},
		{durable.PayClosed, S, "none", skipped(S, "", "")},
		{durable.PayClosed, C, "none", skipped(C, "", "")},
		{durable.PayClosed, R, "paying", skipped(R, "", "P", aggregate)},
		{durable.PayClosed, R, "other", skipped(R, "", "P", aggregate)},
		{durable.PayClosed, R, "none", skipped(R, "", "")},

		{durable.RefundSuccess, P, "none", want{durable.Premature, P, "", "", "", nil}},
		{durable.RefundSuccess, A, "paying", applied(R, "ORDER_REFUNDED", "P", full("P", "R"))},
		{durable.RefundSuccess, A, "other", skipped(A, durable.ReviewRefundOtherTrade, "P", full("N", "R"))},
		{durable.RefundSuccess, A, "none", applied(R, "ORDER_REFUNDED", "N", full("N", "R"))}, // adopts
		{durable.RefundSuccess, S, "paying", applied(R, "ORDER_REFUNDED", "P", full("P", "R"))},
		{durable.RefundSuccess, S, "other", skipped(S, durable.ReviewRefundOtherTrade, "P", full("N", "R"))},
		{durable.RefundSuccess, S, "none", applied(R, "ORDER_REFUNDED", "N", full("N", "R"))},
		{durable.RefundSuccess, C, "none", skipped(C, durable.ReviewRefundOtherTrade, "", full("N", "R"))},
		// Refunded already: the refund takes its amount out of the refund
		// without an id, so the payer's rows still sum to the amount.
		{durable.RefundSuccess, R, "paying", skipped(R, "", "P", refund{"P", "", 0}, full("P", "R"))},
		{durable.RefundSuccess, R, "other", skipped(R, durable.ReviewRefundOtherTrade, "P", full("N", "R"), aggregate)},
		// Adopted: what was refunded becomes the new payer's refund without
		// an id, then the refund itemises it.
		{durable.RefundSuccess, R, "none", skipped(R, "", "N", refund{"N", "", 0}, full("N", "R"))},

		{durable.RefundFailed, P, "none", skipped(P, durable.ReviewRefundFailed, "")},
		{durable.RefundFailed, A, "paying", skipped(A, durable.ReviewRefundFailed, "P")},
		{durable.RefundFailed, A, "other", skipped(A, durable.ReviewRefundFailed, "P")},
		{durable.RefundFailed, A, "none", skipped(A, durable.ReviewRefundFailed, "")},
		{durable.RefundFailed, S, "paying", skipped(S, durable.ReviewRefundFailed, "P")},
		{durable.RefundFailed, S, "other", skipped(S, durable.ReviewRefundFailed, "P")},
		{durable.RefundFailed, S, "none", skipped(S, durable.ReviewRefundFailed, "")},
		{durable.RefundFailed, C, "none", skipped(C, durable.ReviewRefundFailed, "")},
		{durable.RefundFailed, R, "paying", skipped(R, durable.ReviewRefundFailed, "P", aggregate)},
		{durable.RefundFailed, R, "other", skipped(R, durable.ReviewRefundFailed, "P", aggregate)},
		{durable.RefundFailed, R, "none", skipped(R, durable.ReviewRefundFailed, "")},

		{durable.TradeClosed, P, "none", applied(C, "ORDER_CLOSED", "")},
		{durable.TradeClosed, A, "paying", applied(R, "ORDER_REFUNDED", "P", full("P", ""))},
		{durable.TradeClosed, A, "other", skipped(A, "", "P")}, // an abandoned attempt
		{durable.TradeClosed, A, "none", applied(R, "ORDER_REFUNDED", "N", full("N", ""))},
		{durable.TradeClosed, S, "paying", applied(R, "ORDER_REFUNDED", "P", full("P", ""))},
		{durable.TradeClosed, S, "other", skipped(S, "", "P")},
		{durable.TradeClosed, S, "none", applied(R, "ORDER_REFUNDED", "N", full("N", ""))},
		{durable.TradeClosed, C, "none", skipped(C, "", "")},
		{durable.TradeClosed, R, "paying", skipped(R, "", "P", aggregate)},
		{durable.TradeClosed, R, "other", skipped(R, "", "P", aggregate)},
		{durable.TradeClosed, R, "none", skipped(R, "", "N", full("N", ""))},
	}
	b := setup(t)
	ctx := context.Background()
	// Every cell's order is seeded first, then every delivery is decided:
	// with group commit, all of them in one batch, so each cell's answer is
	// the batch's; one at a time, one after the other.
	type cell struct {
		orderNo  string
		names    map[string]string
		refunded int64
		n        durable.Notification
		got      durable.Result
	}
	cells := make([]cell, len(table))
	for i, c := range table {
		orderNo := fmt.Sprintf("O-%s-%s-%s", c.e, c.from, c.rel)
		names := map[string]string{"P": "test:P-" + orderNo, "N": "test:N-" + orderNo, "R": "R-" + orderNo, "": ""}
		payer, txn := "", "N-"+orderNo
		switch c.rel {
		case "paying":
			payer, txn = names["P"], "P-"+orderNo
		case "other":
			payer = names["P"]
		}
		var refunded int64
		var seeded []refund
		if c.from == R {
			refunded = amount
			if payer != "" {
				seeded = []refund{{payer, "", amount}}
			}
		}
		b.seed(t, orderNo, c.from, amount, payer, refunded, seeded...)
		n := note(txn, c.e, orderNo, amount, "CNY")
		if c.e == durable.RefundSuccess || c.e == durable.RefundFailed {
			n = refundNote(txn, names["R"], orderNo, amount, amount, false)
			n.Event = c.e
			n.BizKey = fmt.Sprintf("test:%s:%s", names["R"], c.e)
		}
		cells[i] = cell{orderNo: orderNo, names: names, refunded: refunded, n: n}
	}
	notes := make([]durable.Notification, len(cells))
	for i := range cells {
		notes[i] = cells[i].n
	}
	for i, r := range decideAll(t, b, notes) {
		cells[i].got = r
	}
	for i, c := range table {
		t.Run(fmt.Sprintf("%s on %s, %s trade", c.e, c.from, c.rel), func(t *testing.T) {
			w := c.w
			orderNo, names, refunded, n, got := cells[i].orderNo, cells[i].names, cells[i].refunded, cells[i].n, cells[i].got
			if got.Outcome != w.outcome || got.Status != w.status || got.Review != w.review || got.Replayed {
				t.Fatalf("got %v/%s/review %q/replayed %v, want %v/%s/review %q",
					got.Outcome, got.Status, got.Review, got.Replayed, w.outcome, w.status, w.review)
			}
			if st := b.status(t, orderNo); st != w.status {
				t.Errorf("order status %s, want %s", st, w.status)
			}
			gotPayer, gotRefunded, gotRefunds := b.money(t, orderNo)
			wantRefunded := refunded
			if w.status == R {
				wantRefunded = amount
			}
			var wantRefunds []refund
			for _, r := range w.refunds {
				wantRefunds = append(wantRefunds, refund{names[r.Trade], names[r.RefundID], r.Amount})
			}
			if gotPayer != names[w.payer] || gotRefunded != wantRefunded {
				t.Errorf("paid_by %q refunded_amount %d, want %q and %d", gotPayer, gotRefunded, names[w.payer], wantRefunded)
			}
			if d := cmp.Diff(wantRefunds, gotRefunds); d != "" {
				t.Errorf("trade_refund rows (-want +got):\n%s", d)
			}
			wantClaims := 0
			if w.outcome.Done() {
				wantClaims = 1
				if g, w := string(got.Canonical), canonical(w.outcome, w.status); g != w {
					t.Errorf("canonical %s, want %s", g, w)
				}
				var stored string
				if err := b.db.QueryRow(ctx, `SELECT result_json FROM notify_claim WHERE biz_key = $1 AND claim_state = 'DONE'`, n.BizKey).Scan(&stored); err != nil {
					t.Fatalf("read claim: %v", err)
				}
				if stored != string(got.Canonical) {
					t.Errorf("stored %s, answered %s", stored, got.Canonical)
				}
			}
			if c := b.claims(t, n.BizKey); c != wantClaims {
				t.Errorf("claims %d, want %d", c, wantClaims)
			}
			var wantTopics []string
			if w.topic != "" {
				wantTopics = []string{w.topic}
			}
			if d := cmp.Diff(wantTopics, b.topics(t, orderNo)); d != "" {
				t.Errorf("outbox topics (-want +got):\n%s", d)
			}
			if w.topic != "" {
				wantPayload := map[string]any{"order_no": orderNo, "event_type": string(c.e), "from": string(c.from), "to": string(w.status), "biz_key": n.BizKey}
				if w.topic == "ORDER_REFUNDED" {
					var refundID any // TRADE_CLOSED names no refund
					if c.e == durable.RefundSuccess {
						refundID = names["R"]
					}
					wantPayload["trade"] = names[w.payer]
					wantPayload["refund_id"] = refundID
					wantPayload["refund_amount"] = float64(amount)
					wantPayload["refunded_amount"] = float64(amount)
				}
				// And the order's facts as the move left them.
				var paidBy *string
				var orderAmount int64
				var currency string
				if err := b.db.QueryRow(ctx, `SELECT paid_by, amount, currency FROM biz_order WHERE order_no = $1`, orderNo).Scan(&paidBy, &orderAmount, &currency); err != nil {
					t.Fatal(err)
				}
				wantPayload["amount"], wantPayload["currency"], wantPayload["via"] = float64(orderAmount), currency, durable.ViaCallback
				wantPayload["paid_by"], wantPayload["channel"] = nil, nil
				if paidBy != nil {
					wantPayload["paid_by"] = *paidBy
					wantPayload["channel"], _, _ = strings.Cut(*paidBy, ":")
				}
				got := b.payloads(t, orderNo)
				for _, p := range got {
					if at, _ := p["occurred_at"].(string); at == "" {
						t.Errorf("outbox payload without occurred_at: %v", p)
					}
					delete(p, "occurred_at")
				}
				if d := cmp.Diff([]map[string]any{wantPayload}, got); d != "" {
					t.Errorf("outbox payload (-want +got):\n%s", d)
				}
			}
			var wantReviews []string
			if w.review != "" {
				wantReviews = []string{string(w.review) + " open"}
			}
			if d := cmp.Diff(wantReviews, b.reviews(t, orderNo)); d != "" {
				t.Errorf("review rows (-want +got):\n%s", d)
			}
			if w.outcome.Done() {
				// The same delivery again replays the first result byte for byte.
				again := process(t, b.store, n)
				if !again.Replayed || string(again.Canonical) != string(got.Canonical) {
					t.Errorf("second delivery: replayed %v canonical %s, want replay of %s", again.Replayed, again.Canonical, got.Canonical)
				}
				if c := b.outbox(t, orderNo); c != len(wantTopics) {
					t.Errorf("outbox rows after replay %d, want %d", c, len(wantTopics))
				}
			}
			// An order refunded before its payer was known, and still without
			// one, is the upgrade's leftover the invariants exist to show.
			if !(c.from == R && gotPayer == "") {
				if err := durabletest.Invariants(ctx, b.db, orderNo, nil); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// Point 1, internal paths: SHIP and a compensation job's PAY_SUCCESS.
func TestTransitionEveryState(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	cases := []struct {
		e       durable.Event
		from    durable.State
		applied bool
		to      durable.State
		topic   string
	}{
		{durable.Ship, durable.Paid, true, durable.Shipped, "ORDER_SHIPPED"},
		{durable.Ship, durable.PendingPay, false, durable.PendingPay, ""},
		{durable.Ship, durable.Shipped, false, durable.Shipped, ""},
		{durable.Ship, durable.Closed, false, durable.Closed, ""},
		{durable.Ship, durable.Refunded, false, durable.Refunded, ""},
		{durable.Close, durable.PendingPay, true, durable.Closed, "ORDER_CLOSED"},
		{durable.Close, durable.Paid, false, durable.Paid, ""},
		{durable.Close, durable.Shipped, false, durable.Shipped, ""},
		{durable.Close, durable.Closed, false, durable.Closed, ""},
		{durable.Close, durable.Refunded, false, durable.Refunded, ""},
		{durable.PaySuccess, durable.PendingPay, true, durable.Paid, "ORDER_PAID"},
		{durable.PaySuccess, durable.Paid, false, durable.Paid, ""},
		{durable.PaySuccess, durable.Closed, false, durable.Closed, ""},
		{durable.PayClosed, durable.PendingPay, true, durable.Closed, "ORDER_CLOSED"},
		{durable.PayClosed, durable.Paid, false, durable.Paid, ""},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s on %s", c.e, c.from), func(t *testing.T) {
			orderNo := fmt.Sprintf("I-%s-%s", c.e, c.from)
			b.order(t, orderNo, c.from, 500, "USD")
			m, err := b.store.Transition(ctx, orderNo, c.e)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(durable.Move{Applied: c.applied, From: c.from, Status: c.to}, m); d != "" {
				t.Errorf("move (-want +got):\n%s", d)
			}
			if st := b.status(t, orderNo); st != c.to {
				t.Errorf("status %s, want %s", st, c.to)
			}
			wantRows := 0
			if c.applied {
				wantRows = 1
				var topic string
				var bizKey *string
				if err := b.db.QueryRow(ctx, `SELECT topic, payload->>'biz_key' FROM outbox WHERE order_no = $1`, orderNo).Scan(&topic, &bizKey); err != nil {
					t.Fatal(err)
				}
				if topic != c.topic || bizKey != nil {
					t.Errorf("outbox topic %s biz_key %v, want %s and null", topic, bizKey, c.topic)
				}
			}
			if n := b.outbox(t, orderNo); n != wantRows {
				t.Errorf("outbox rows %d, want %d", n, wantRows)
			}
			if n := b.count(t, `SELECT count(*) FROM notify_claim`); n != 0 {
				t.Errorf("claims %d, want 0", n)
			}
		})
	}
	if _, err := b.store.Transition(ctx, "no-such-order", durable.Ship); !errors.Is(err, durable.ErrUnknownOrder) {
		t.Errorf("unknown order: err %v, want ErrUnknownOrder", err)
	}
	// Money moves only against a trade, and an internal path names none.
	b.order(t, "I-money", durable.Paid, 500, "USD")
	for _, e := range []durable.Event{durable.RefundSuccess, durable.TradeClosed, "NO_SUCH_EVENT"} {
		if _, err := b.store.Transition(ctx, "I-money", e); !errors.Is(err, durable.ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", e, err)
		}
	}
	if st := b.status(t, "I-money"); st != durable.Paid {
		t.Errorf("status %s after refused transitions, want PAID", st)
	}
	// A compensation job's payment leaves the payer unknown (NULL): the
	// first refund or close names it.
	var paidBy *string
	if err := b.db.QueryRow(ctx, `SELECT paid_by FROM biz_order WHERE order_no = 'I-PAY_SUCCESS-PENDING_PAY'`).Scan(&paidBy); err != nil || paidBy != nil {
		t.Errorf("paid_by after an internal payment: %v %v, want NULL", paidBy, err)
	}
}

// Point 2: 64 goroutines send the same notification at once.
func TestConcurrentDuplicatesOneApplied(t *testing.T) {
	b := setup(t)
	b.order(t, "O-storm", durable.PendingPay, 1999, "CNY")
	n := note("T-storm", durable.PaySuccess, "O-storm", 1999, "CNY")
	const copies = 64
	results := make([]durable.Result, copies)
	errs := make([]error, copies)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			results[i], errs[i] = b.store.Process(ctx, n)
		}()
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Process: %v", err)
	}
	var applied, replayed int
	var first []byte
	for _, r := range results {
		if r.Outcome == durable.Applied && !r.Replayed {
			applied++
			first = r.Canonical
		}
	}
	for _, r := range results {
		if r.Replayed && string(r.Canonical) == string(first) {
			replayed++
		}
	}
	if applied != 1 || replayed != copies-1 {
		t.Fatalf("applied %d, identical replays %d; want 1 and %d", applied, replayed, copies-1)
	}
	if c := b.claims(t, n.BizKey); c != 1 {
		t.Errorf("claims %d, want 1", c)
	}
	if o := b.outbox(t, "O-storm"); o != 1 {
		t.Errorf("outbox rows %d, want 1", o)
	}
}

// Point 3: 1,000 keys x 8 concurrent duplicates across two nodes.
func TestTwoNodesOneDatabase(t *testing.T) {
	b := setup(t)
	nodes := []*durable.Store{b.store, newStore(t, b.url, durable.Config{})}
	ctx := context.Background()
	const keys, dups = 1000, 8
	rows := make([][]any, keys)
	for i := range keys {
		rows[i] = []any{fmt.Sprintf("N-%04d", i), "PENDING_PAY", int64(100 + i), "EUR"}
	}
	if _, err := b.db.CopyFrom(ctx, []string{"biz_order"}, []string{"order_no", "status", "amount", "currency"}, pgxCopyRows(rows)); err != nil {
		t.Fatal(err)
	}
	type job struct {
		node int
		n    durable.Notification
	}
	jobs := make(chan job)
	var mu sync.Mutex
	applied := map[string]int{}
	var answered []string // keys answered SUCCESS (applied or replayed)
	var failures []error
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				r, err := nodes[j.node].Process(cctx, j.n)
				cancel()
				mu.Lock()
				if err != nil {
					failures = append(failures, err)
				} else if r.Outcome == durable.Applied && !r.Replayed {
					applied[j.n.BizKey]++
					answered = append(answered, j.n.BizKey)
				} else if !r.Replayed {
					failures = append(failures, fmt.Errorf("%s: %v replayed=%v", j.n.BizKey, r.Outcome, r.Replayed))
				} else {
					answered = append(answered, j.n.BizKey)
				}
				mu.Unlock()
			}
		}()
	}
	for i := range keys {
		orderNo := fmt.Sprintf("N-%04d", i)
		n := note("TX-"+orderNo, durable.PaySuccess, orderNo, int64(100+i), "EUR")
		for d := range dups {
			jobs <- job{node: d % 2, n: n}
		}
	}
	close(jobs)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d failures, first: %v", len(failures), failures[0])
	}
	for k, c := range applied {
		if c != 1 {
			t.Errorf("%s applied %d times", k, c)
		}
	}
	if len(applied) != keys {
		t.Errorf("%d keys applied, want %d", len(applied), keys)
	}
	if err := durabletest.Invariants(ctx, b.db, "N-", answered); err != nil {
		t.Error(err)
	}
	durabletest.StormPaidOnce(t, b.db, keys)
}

// Point 4: the seed's incident.
func TestIncidentStaleSnapshotAfterShipping(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.order(t, "O-incident", durable.PendingPay, 4200, "CNY")
	first := note("T-1", durable.PaySuccess, "O-incident", 4200, "CNY")
	r1 := process(t, b.store, first)
	if r1.Outcome != durable.Applied || r1.Status != durable.Paid {
		t.Fatalf("first delivery: %+v", r1)
	}
	if m, err := b.store.Transition(ctx, "O-incident", durable.Ship); err != nil || !m.Applied {
		t.Fatalf("compensation ship: %+v %v", m, err)
	}
	r2 := process(t, b.store, first)
	if !r2.Replayed || string(r2.Canonical) != string(r1.Canonical) {
		t.Fatalf("duplicate: %+v, want replay of %s", r2, r1.Canonical)
	}
	stale := note("T-2", durable.PaySuccess, "O-incident", 4200, "CNY")
	r3 := process(t, b.store, stale)
	if r3.Outcome != durable.Skipped || r3.Status != durable.Shipped || r3.Replayed {
		t.Fatalf("stale snapshot: %+v, want skipped on SHIPPED", r3)
	}
	if st := b.status(t, "O-incident"); st != durable.Shipped {
		t.Errorf("status %s, want SHIPPED", st)
	}
	for topic, want := range map[string]int{"ORDER_PAID": 1, "ORDER_SHIPPED": 1} {
		if n := b.count(t, `SELECT count(*) FROM outbox WHERE order_no = 'O-incident' AND topic = $1`, topic); n != want {
			t.Errorf("%s rows %d, want %d", topic, n, want)
		}
	}
	if n := b.outbox(t, "O-incident"); n != 2 {
		t.Errorf("outbox rows %d, want 2", n)
	}
	if n := b.openReviews(t, stale.BizKey, durable.ReviewDuplicatePayment); n != 1 {
		t.Errorf("DUPLICATE_PAYMENT reviews %d, want 1", n)
	}
}

// Point 5: conflicts, amount mismatches and unknown orders open one review
// row each and leave no claim behind where the README says so.
func TestReviewCases(t *testing.T) {
	b := setup(t)
	ctx := context.Background()

	t.Run("conflict", func(t *testing.T) {
		b.order(t, "O-c", durable.PendingPay, 100, "CNY")
		orig := note("T-c", durable.PaySuccess, "O-c", 100, "CNY")
		process(t, b.store, orig)
		var before string
		_ = b.db.QueryRow(ctx, `SELECT row_to_json(c)::text FROM notify_claim c WHERE biz_key = $1`, orig.BizKey).Scan(&before)
		changed := note("T-c", durable.PaySuccess, "O-c", 999, "CNY") // same key, another amount
		for range 10 {
			if r := process(t, b.store, changed); r.Outcome != durable.Conflict || r.Review != durable.ReviewPayloadConflict {
				t.Fatalf("got %+v, want conflict", r)
			}
		}
		if n := b.openReviews(t, orig.BizKey, durable.ReviewPayloadConflict); n != 1 {
			t.Fatalf("open conflict rows %d, want 1", n)
		}
		var after string
		_ = b.db.QueryRow(ctx, `SELECT row_to_json(c)::text FROM notify_claim c WHERE biz_key = $1`, orig.BizKey).Scan(&after)
		if before != after || before == "" {
			t.Errorf("claim changed:\n%s\n%s", before, after)
		}
		var raw string
		_ = b.db.QueryRow(ctx, `SELECT raw_body FROM notify_review WHERE biz_key = $1`, orig.BizKey).Scan(&raw)
		if raw != string(changed.RawBody) {
			t.Errorf("raw_body %q, want %q", raw, changed.RawBody)
		}
		open, err := b.store.Reviews(ctx, durable.ReviewQuery{})
		if err != nil || len(open) != 1 {
			t.Fatalf("Reviews: %v %v", open, err)
		}
		if _, err := b.store.ResolveReview(ctx, open[0].ID, "refunded the difference", "ops@example"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.ResolveReview(ctx, open[0].ID, "again", "ops"); !errors.Is(err, durable.ErrReviewResolved) {
			t.Errorf("second resolve: %v, want ErrReviewResolved", err)
		}
		if _, err := b.store.ResolveReview(ctx, 1<<40, "x", "ops"); !errors.Is(err, durable.ErrReviewNotFound) {
			t.Errorf("unknown id: %v, want ErrReviewNotFound", err)
		}
		process(t, b.store, changed)
		if n := b.openReviews(t, orig.BizKey, durable.ReviewPayloadConflict); n != 1 {
			t.Errorf("after resolution: open rows %d, want a new 1", n)
		}
		if n := b.count(t, `SELECT count(*) FROM notify_review WHERE biz_key = $1`, orig.BizKey); n != 2 {
			t.Errorf("rows in all %d, want 2", n)
		}
	})

	t.Run("amount mismatch", func(t *testing.T) {
		b.order(t, "O-m", durable.PendingPay, 100, "CNY")
		n := note("T-m", durable.PaySuccess, "O-m", 101, "CNY")
		for range 3 {
			if r := process(t, b.store, n); r.Outcome != durable.AmountMismatch {
				t.Fatalf("got %+v, want amount_mismatch", r)
			}
		}
		if c := b.claims(t, n.BizKey); c != 0 {
			t.Errorf("claims %d, want 0", c)
		}
		if c := b.openReviews(t, n.BizKey, durable.ReviewAmountMismatch); c != 1 {
			t.Errorf("open AMOUNT_MISMATCH rows %d, want 1", c)
		}
		cur := note("T-m2", durable.PaySuccess, "O-m", 100, "USD")
		if r := process(t, b.store, cur); r.Outcome != durable.AmountMismatch {
			t.Errorf("currency differs: %+v, want amount_mismatch", r)
		}
		if _, err := b.db.Exec(ctx, `UPDATE biz_order SET amount = 101 WHERE order_no = 'O-m'`); err != nil {
			t.Fatal(err)
		}
		if r := process(t, b.store, n); r.Outcome != durable.Applied {
			t.Errorf("retry after the fix: %+v, want applied", r)
		}
		if o := b.outbox(t, "O-m"); o != 1 {
			t.Errorf("outbox %d, want 1", o)
		}
		// The row of the key applied closed itself; the other key's did not.
		want := []string{"AMOUNT_MISMATCH resolved by notifyedge", "AMOUNT_MISMATCH open"}
		if d := cmp.Diff(want, b.reviews(t, "O-m")); d != "" {
			t.Errorf("reviews (-want +got):\n%s", d)
		}
		var resolution string
		_ = b.db.QueryRow(ctx, `SELECT resolution FROM notify_review WHERE biz_key = $1`, n.BizKey).Scan(&resolution)
		if !strings.Contains(resolution, "amount") || !strings.Contains(resolution, "applied") {
			t.Errorf("resolution %q does not say why", resolution)
		}
	})

	t.Run("unknown order", func(t *testing.T) {
		n := note("T-u", durable.PaySuccess, "O-u", 100, "CNY")
		for range 3 {
			if r := process(t, b.store, n); r.Outcome != durable.UnknownOrder {
				t.Fatalf("got %+v, want unknown_order", r)
			}
		}
		if c := b.claims(t, n.BizKey); c != 0 {
			t.Errorf("claims %d, want 0", c)
		}
		if c := b.openReviews(t, n.BizKey, durable.ReviewUnknownOrder); c != 1 {
			t.Errorf("open UNKNOWN_ORDER rows %d, want 1", c)
		}
		b.order(t, "O-u", durable.PendingPay, 100, "CNY")
		if r := process(t, b.store, n); r.Outcome != durable.Applied {
			t.Errorf("retry once the order exists: %+v, want applied", r)
		}
		if d := cmp.Diff([]string{"UNKNOWN_ORDER resolved by notifyedge"}, b.reviews(t, "O-u")); d != "" {
			t.Errorf("reviews (-want +got):\n%s", d)
		}
	})

	counts, err := b.store.OpenReviews(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The AMOUNT_MISMATCH row of T-m and the UNKNOWN_ORDER row of T-u closed
	// themselves when their keys were applied; T-m2's stays open.
	want := map[durable.ReviewReason]int64{
		durable.ReviewPayloadConflict: 1, durable.ReviewAmountMismatch: 1, durable.ReviewUnknownOrder: 0,
		durable.ReviewMerchantMismatch: 0, durable.ReviewPaidAfterClose: 0, durable.ReviewDuplicatePayment: 0,
		durable.ReviewRefundExceeds: 0, durable.ReviewRefundOtherTrade: 0, durable.ReviewRefundFailed: 0,
		durable.ReviewRefundedAtChannel: 0, durable.ReviewNotInBill: 0, durable.ReviewBillMismatch: 0,
	}
	if d := cmp.Diff(want, counts); d != "" {
		t.Errorf("OpenReviews (-want +got):\n%s", d)
	}
}

// Point 6: a deadline that expires mid-transaction rolls everything back;
// the retry after the blocker is gone is applied.
func TestDeadlineRollsBack(t *testing.T) {
	b := setup(t)
	ctx := context.Background()

	t.Run("waiting on the order row", func(t *testing.T) {
		b.order(t, "O-d", durable.PendingPay, 100, "CNY")
		n := note("T-d", durable.PaySuccess, "O-d", 100, "CNY")
		release := b.lockOrder(t, "O-d")
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := b.store.Process(dctx, n)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v, want DeadlineExceeded", err)
		}
		durabletest.WaitCancelled(t, b.db)
		release()
		if c := b.claims(t, n.BizKey); c != 0 {
			t.Errorf("claims %d, want 0", c)
		}
		if r := process(t, b.store, n); r.Outcome != durable.Applied {
			t.Errorf("retry: %+v, want applied", r)
		}
		if o := b.outbox(t, "O-d"); o != 1 {
			t.Errorf("outbox %d, want 1", o)
		}
	})

	// Here the wait happens after the claim insert and the state decision:
	// the rollback must take the claim with it.
	t.Run("waiting after the claim insert", func(t *testing.T) {
		b.order(t, "O-d2", durable.Closed, 100, "CNY")
		n := note("T-d2", durable.PaySuccess, "O-d2", 100, "CNY")
		tx, err := b.db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO notify_review (biz_key, order_no, reason, payload_hash, raw_body)
			VALUES ($1, 'O-d2', 'PAID_AFTER_CLOSE', $2, 'blocker')`, n.BizKey, n.Digest); err != nil {
			t.Fatal(err)
		}
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err = b.store.Process(dctx, n)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v, want DeadlineExceeded", err)
		}
		durabletest.WaitCancelled(t, b.db)
		_ = tx.Rollback(ctx)
		if c := b.claims(t, n.BizKey); c != 0 {
			t.Errorf("claims %d after rollback, want 0", c)
		}
		r := process(t, b.store, n)
		if r.Outcome != durable.Skipped || r.Review != durable.ReviewPaidAfterClose {
			t.Errorf("retry: %+v, want skipped with PAID_AFTER_CLOSE", r)
		}
		if c := b.openReviews(t, n.BizKey, durable.ReviewPaidAfterClose); c != 1 {
			t.Errorf("open reviews %d, want 1", c)
		}
	})

	t.Run("server-side statement timeout", func(t *testing.T) {
		// A second, not less: the store's warm-up prepares its statements
		// under the same timeout, and on a loaded machine 150 ms was missed.
		s := newStore(t, b.url, durable.Config{StatementTimeout: time.Second})
		b.order(t, "O-d3", durable.PendingPay, 100, "CNY")
		n := note("T-d3", durable.PaySuccess, "O-d3", 100, "CNY")
		release := b.lockOrder(t, "O-d3")
		_, err := s.Process(ctx, n) // no client deadline: the server must give up
		if !errors.Is(err, durable.ErrTimeout) {
			t.Fatalf("err %v, want ErrTimeout", err)
		}
		release()
		if r := process(t, s, n); r.Outcome != durable.Applied {
			t.Errorf("retry: %+v, want applied", r)
		}
	})
}

// Point 7: four nodes migrating one fresh database at once.
func TestMigrateConcurrently(t *testing.T) {
	b := &bundle{}
	name := durabletestCreateEmpty(t)
	b.db = durabletest.Pool(t, name)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = durable.Migrate(context.Background(), name)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("migrator %d: %v", i, err)
		}
	}
	var version int
	if err := b.db.QueryRow(context.Background(), `SELECT version FROM notifyedge_schema_version`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 2 {
		t.Errorf("schema version %d", version)
	}
	if n := b.count(t, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename IN ('notify_claim','biz_order','outbox','notify_review')`); n != 4 {
		t.Errorf("%d contract tables, want 4", n)
	}
	// Each function once: no overload of an earlier signature.
	b.checkOnePerFile(t, b.installedFunctions(t))
	if n := b.count(t, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename = 'trade_refund'`); n != 1 {
		t.Errorf("%d trade_refund tables, want 1", n)
	}
	// Migrating a current schema again is a no-op.
	if err := durable.Migrate(context.Background(), name); err != nil {
		t.Errorf("re-migrate: %v", err)
	}
}

func TestCanonicalRoundTrip(t *testing.T) {
	for _, o := range []durable.Outcome{durable.Applied, durable.Skipped} {
		b := []byte(canonical(o, durable.Paid))
		r, err := durable.ParseCanonical(b)
		if err != nil || r.Outcome != o || r.Status != durable.Paid {
			t.Errorf("ParseCanonical(%s) = %+v, %v", b, r, err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Errorf("%s is not JSON: %v", b, err)
		}
	}
	for _, bad := range []string{`{}`, `{"http":200,"code":"SUCCESS","outcome":"conflict","status":"PAID"}`, `{"http":200,"code":"SUCCESS","outcome":"applied","status":"PAID","x":1}`, `nope`} {
		if _, err := durable.ParseCanonical([]byte(bad)); err == nil {
			t.Errorf("ParseCanonical(%s) accepted", bad)
		}
	}
}
