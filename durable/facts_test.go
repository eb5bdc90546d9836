package durable_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
)

// payloadFacts is what every outbox payload carries besides its move.
type payloadFacts struct {
	OrderNo    string  `json:"order_no"`
	Amount     int64   `json:"amount"`
	Currency   string  `json:"currency"`
	Channel    *string `json:"channel"`
	PaidBy     *string `json:"paid_by"`
	OccurredAt string  `json:"occurred_at"`
	Via        string  `json:"via"`
}

// Every outbox payload carries what a receiver needs without calling back,
// as the move left the order, and the path it came by: a callback (in a
// group commit's batch or alone), an answer to a query, a re-drive, the
// order system's own transition, the reference shipper; refunds too. Each
// row has an event id of its own.
func TestPayloadFacts(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	for _, o := range []string{"F-cb", "F-q", "F-rd", "F-close"} {
		b.order(t, o, durable.PendingPay, 1999, "CNY")
	}
	if _, err := b.store.PutOrder(ctx, "F-reg", 500, "JPY", "wx"); err != nil {
		t.Fatal(err)
	}
	process := func(n durable.Notification, ops bool) {
		t.Helper()
		var r durable.Result
		var err error
		if ops {
			r, err = b.store.ProcessOps(ctx, n)
		} else {
			r, err = b.store.Process(ctx, n)
		}
		if err != nil || r.Outcome != durable.Applied {
			t.Fatalf("%s: %+v %v", n.BizKey, r, err)
		}
	}
	before := time.Now().UTC().Add(-time.Minute)
	// At once, so that group commit decides them in batches.
	var batch []string
	for i := range 16 {
		o := fmt.Sprintf("F-b%02d", i)
		b.order(t, o, durable.PendingPay, 1999, "CNY")
		batch = append(batch, o)
	}
	var wg sync.WaitGroup
	for _, o := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r, err := b.store.Process(ctx, note("T"+o, durable.PaySuccess, o, 1999, "CNY")); err != nil || r.Outcome != durable.Applied {
				t.Errorf("%s: %+v %v", o, r, err)
			}
		}()
	}
	wg.Wait()
	process(note("Tcb", durable.PaySuccess, "F-cb", 1999, "CNY"), false)
	process(note("Tq", durable.PaySuccess, "F-q", 1999, "CNY"), true)
	rd := note("Trd", durable.PaySuccess, "F-rd", 1999, "CNY")
	rd.Via = durable.ViaRedrive
	process(rd, false)
	process(refundNote("Tcb", "R1", "F-cb", 1999, 500, false), false)
	if _, err := b.store.OrderEvent(ctx, "F-close", durable.Close, "req-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.OrderEvent(ctx, "F-reg", durable.Close, "req-2"); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := b.db.QueryRow(ctx, `SELECT id FROM outbox WHERE order_no = 'F-q' AND topic = 'ORDER_PAID'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.store.Ship(ctx, "test-shipper", id, "F-q"); err != nil {
		t.Fatal(err)
	}

	str := func(s string) *string { return &s }
	want := map[string]payloadFacts{
		"F-cb ORDER_PAID":               {"F-cb", 1999, "CNY", str("test"), str("test:Tcb"), "", "callback"},
		"F-q ORDER_PAID":                {"F-q", 1999, "CNY", str("test"), str("test:Tq"), "", "query"},
		"F-rd ORDER_PAID":               {"F-rd", 1999, "CNY", str("test"), str("test:Trd"), "", "redrive"},
		"F-cb ORDER_PARTIALLY_REFUNDED": {"F-cb", 1999, "CNY", str("test"), str("test:Tcb"), "", "callback"},
		"F-close ORDER_CLOSED":          {"F-close", 1999, "CNY", nil, nil, "", "orders_api"},
		"F-reg ORDER_CLOSED":            {"F-reg", 500, "JPY", str("wx"), nil, "", "orders_api"},
		"F-q ORDER_SHIPPED":             {"F-q", 1999, "CNY", str("test"), str("test:Tq"), "", "orders_api"},
	}
	for _, o := range batch {
		want[o+" ORDER_PAID"] = payloadFacts{o, 1999, "CNY", str("test"), str("test:T" + o), "", "callback"}
	}
	rows, err := b.db.Query(ctx, `SELECT order_no || ' ' || topic, payload::text, event_id::text, created_at FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen, ids := map[string]bool{}, map[string]bool{}
	for rows.Next() {
		var key, payload, eventID string
		var created time.Time
		if err := rows.Scan(&key, &payload, &eventID, &created); err != nil {
			t.Fatal(err)
		}
		var got payloadFacts
		if err := json.Unmarshal([]byte(payload), &got); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		w, ok := want[key]
		if !ok {
			t.Errorf("unexpected row %s: %s", key, payload)
			continue
		}
		seen[key] = true
		at, err := time.Parse(time.RFC3339Nano, got.OccurredAt)
		if err != nil || at.Before(before) || !at.Equal(created.Truncate(time.Microsecond)) || got.OccurredAt[len(got.OccurredAt)-1] != 'Z' {
			t.Errorf("%s: occurred_at %q (%v), want the row's created_at %v in UTC", key, got.OccurredAt, err, created)
		}
		got.OccurredAt = ""
		if !equalFacts(got, w) {
			t.Errorf("%s: payload %s, want %+v", key, payload, w)
		}
		if len(eventID) != 36 || eventID[14] != '7' || ids[eventID] {
			t.Errorf("%s: event_id %q, want a UUID version 7 of its own", key, eventID)
		}
		ids[eventID] = true
	}
	for key := range want {
		if !seen[key] {
			t.Errorf("no outbox row %s", key)
		}
	}
}

func equalFacts(a, b payloadFacts) bool {
	eq := func(x, y *string) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return a.OrderNo == b.OrderNo && a.Amount == b.Amount && a.Currency == b.Currency &&
		eq(a.Channel, b.Channel) && eq(a.PaidBy, b.PaidBy) && a.OccurredAt == b.OccurredAt && a.Via == b.Via
}
