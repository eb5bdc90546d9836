package edge_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// Concurrent PUTs of one new order answer as if they ran one after the
// other: one 201, the rest 200 (or 409 for another amount), never 503.
// The deterministic case holds the competing INSERT open in a second
// transaction until the PUT waits on it.
func TestConcurrentPutOfNewOrder(t *testing.T) {
	b := setup(t, options{})
	put := `{"amount":1999,"currency":"CNY"}`

	for _, tc := range []struct {
		name, payload string
		commit        bool
		want          int
	}{
		{"the same order committed first", put, true, 200},
		{"another amount committed first", `{"amount":2999,"currency":"CNY"}`, true, 409},
		{"the competing insert rolled back", put, false, 201},
	} {
		t.Run(tc.name, func(t *testing.T) {
			no := "P-held-" + strings.ReplaceAll(tc.name, " ", "-")
			r := b.whileHeld(t, tc.commit, `INSERT INTO biz_order (order_no, status, amount, currency) VALUES ($1, 'PENDING_PAY', 1999, 'CNY')`, no,
				"%INSERT INTO biz_order%", "PUT", "/orders/"+no, tc.payload)
			if r.err != nil || r.code != tc.want || r.body["order_no"] != no || r.body["amount"] != float64(1999) {
				t.Fatalf("PUT after the competing insert ended: %d %v %v, want %d with the order", r.code, r.body, r.err, tc.want)
			}
			if tc.want == 409 && r.body["message"] == nil {
				t.Errorf("409 without a message: %v", r.body)
			}
		})
	}

	// A storm: 8 clients PUT each of 30 new orders at once.
	const clients, orders = 8, 30
	for i := range orders {
		no := fmt.Sprintf("P-storm-%d", i)
		var wg sync.WaitGroup
		replies := make([]adminReply, clients)
		for c := range clients {
			wg.Go(func() { replies[c] = b.adminReply("PUT", "/orders/"+no, ordersToken, put) })
		}
		wg.Wait()
		codes := map[int]int{}
		for _, r := range replies {
			if r.err != nil {
				t.Fatal(r.err)
			}
			codes[r.code]++
		}
		if codes[201] != 1 || codes[200] != clients-1 {
			t.Fatalf("%s: answers %v, want one 201 and %d 200", no, codes, clients-1)
		}
	}
}

// whileHeld runs write (with the order number) in a transaction of its
// own, sends an orders request that must wait for it (its query matches
// waitLike), then commits or rolls the write back, and returns the
// request's answer: the race of two writers, made deterministic.
func (b *bundle) whileHeld(t *testing.T, commit bool, write, orderNo, waitLike, method, path, payload string) adminReply {
	t.Helper()
	tx, err := b.db.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context())
	if _, err := tx.Exec(t.Context(), write, orderNo); err != nil {
		t.Fatal(err)
	}
	reply := b.adminAsync(method, path, ordersToken, payload)
	durabletest.WaitLockWaiters(t, b.db, 1, waitLike)
	if commit {
		err = tx.Commit(t.Context())
	} else {
		err = tx.Rollback(t.Context())
	}
	if err != nil {
		t.Fatal(err)
	}
	r := <-reply
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r
}

// A PATCH that waits for another writer of the order answers from what
// that writer committed: 409 when the order left PENDING_PAY meanwhile,
// never 200 for a change that was not made.
func TestPatchRacesAnotherWriter(t *testing.T) {
	b := setup(t, options{})
	for _, commit := range []bool{true, false} {
		no := fmt.Sprintf("P-patch-%v", commit)
		b.order(t, no, durable.PendingPay, 1999)
		r := b.whileHeld(t, commit, `UPDATE biz_order SET status = 'CLOSED' WHERE order_no = $1`, no,
			"%UPDATE biz_order%", "PATCH", "/orders/"+no, `{"amount":2999,"currency":"CNY"}`)
		var amount int64
		if err := b.db.QueryRow(t.Context(), `SELECT amount FROM biz_order WHERE order_no = $1`, no).Scan(&amount); err != nil {
			t.Fatal(err)
		}
		switch {
		case commit && (r.code != 409 || r.body["status"] != "CLOSED" || r.body["message"] == nil || amount != 1999):
			t.Errorf("PATCH after a close committed: %d %v, amount %d; want 409 with a message, the amount unchanged", r.code, r.body, amount)
		case !commit && (r.code != 200 || r.body["amount"] != float64(2999) || amount != 2999):
			t.Errorf("PATCH after the other writer rolled back: %d %v, amount %d; want 200 and 2999", r.code, r.body, amount)
		}
	}
}

// Internal keys are unambiguous: "K-1" with request "wms:7781" and
// "K-1:wms" with "7781" are two requests, each shipping its own order.
func TestInternalKeysDoNotCollide(t *testing.T) {
	b := setup(t, options{})
	for i, no := range []string{"K-1", "K-1:wms"} {
		b.order(t, no, durable.PendingPay, 1999)
		if r := b.post(t, body(fmt.Sprintf("T-k%d", i), "PAY_SUCCESS", no, 1999)); r.status != 200 {
			t.Fatalf("pay %s: %+v", no, r)
		}
	}
	for _, c := range []struct{ no, id string }{{"K-1", "wms:7781"}, {"K-1:wms", "7781"}} {
		r := b.adminReply("POST", "/orders/"+c.no+"/events", ordersToken, `{"event":"SHIP","request_id":"`+c.id+`"}`)
		if r.err != nil || r.code != 200 || r.body["outcome"] != "applied" || r.replayed {
			t.Errorf("SHIP %s request %s: %d %v replayed=%v, want applied", c.no, c.id, r.code, r.body, r.replayed)
		}
		if s := b.status(t, c.no); s != "SHIPPED" {
			t.Errorf("%s is %s", c.no, s)
		}
	}
	b.checkInvariants(t)
}

// Admin bodies follow the callback rules: a repeated key or a key that
// matches a field only by case is 400, the error names that one field,
// and nothing is stored.
func TestAdminBodiesStrict(t *testing.T) {
	b := setup(t, options{})
	b.order(t, "S-1", durable.PendingPay, 1999)
	before := b.counts(t)
	for _, c := range []struct{ method, path, body, field string }{
		{"PUT", "/orders/S-new", `{"amount":1,"amount":2,"currency":"CNY"}`, "amount"},
		{"PUT", "/orders/S-new", `{"Amount":88,"currency":"CNY"}`, "Amount"},
		{"PUT", "/orders/S-new", `{"amount":88,"currency":"CNY","CURRENCY":"USD"}`, "CURRENCY"},
		{"PUT", "/orders/S-new", `{"amount":88,"currency":5}`, "currency"},
		{"PUT", "/orders/S-new", `[1]`, "body"},
		{"PATCH", "/orders/S-1", `{"amount":2,"currency":"CNY","amount":3}`, "amount"},
		{"POST", "/orders/S-1/events", `{"event":"CLOSE","event":"SHIP","request_id":"r"}`, "event"},
		{"POST", "/orders/S-1/events", `{"event":"SHIP"}`, "request_id"},
		{"POST", "/orders/S-1/events", `{"event":"ship","request_id":"r"}`, "event"},
		{"POST", "/orders/S-1/events", `{"Event":"CLOSE","request_id":"r"}`, "Event"},
		{"POST", "/review/1/resolve", `{"resolution":"x","by":"a","by":"b"}`, "by"},
		{"POST", "/review/1/resolve", `{"resolution":"x"}`, "by"},
		{"POST", "/review/1/redrive", `{"By":"a"}`, "By"},
	} {
		code, got := b.admin(t, c.method, c.path, adminToken, c.body)
		msg, _ := got["message"].(string)
		if code != 400 || !strings.HasPrefix(msg, c.field+": ") || strings.Count(msg, ":") > 2 && c.field != "body" && !strings.Contains(msg, "case-sensitive") {
			t.Errorf("%s %s %s: %d %q, want 400 naming only %s", c.method, c.path, c.body, code, msg, c.field)
		}
	}
	if after := b.counts(t); after != before {
		t.Errorf("refused bodies stored something: %+v -> %+v", before, after)
	}
	if s := b.status(t, "S-1"); s != "PENDING_PAY" {
		t.Errorf("S-1 is %s", s)
	}
}

// An internal event the order's state forbids is 409 "refused" and stores
// nothing, so the same request_id ships once the order is paid.
func TestRefusedInternalEvents(t *testing.T) {
	b := setup(t, options{})
	b.order(t, "R-1", durable.PendingPay, 1999)
	event := func(e, id string) adminReply {
		t.Helper()
		r := b.adminReply("POST", "/orders/R-1/events", ordersToken, `{"event":"`+e+`","request_id":"`+id+`"}`)
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r
	}
	if r := event("SHIP", "wh-1"); r.code != 409 || r.body["outcome"] != "refused" || r.body["status"] != "PENDING_PAY" || r.body["message"] == nil {
		t.Fatalf("SHIP before payment: %d %v, want 409 refused", r.code, r.body)
	}
	if n := b.count(t, `SELECT count(*) FROM notify_claim WHERE order_no = 'R-1'`); n != 0 {
		t.Fatalf("a refused SHIP stored %d claims", n)
	}
	b.post(t, body("T-r1", "PAY_SUCCESS", "R-1", 1999))
	if r := event("SHIP", "wh-1"); r.code != 200 || r.body["outcome"] != "applied" || r.body["status"] != "SHIPPED" || r.replayed {
		t.Errorf("the same request_id after payment: %d %v, want applied", r.code, r.body)
	}
	if r := event("SHIP", "wh-1"); r.code != 200 || r.body["outcome"] != "applied" || !r.replayed {
		t.Errorf("the same request_id again: %d %v replayed=%v, want the first answer", r.code, r.body, r.replayed)
	}
	if r := event("SHIP", "wh-2"); r.code != 200 || r.body["outcome"] != "skipped" || r.body["status"] != "SHIPPED" {
		t.Errorf("SHIP on SHIPPED: %d %v, want skipped", r.code, r.body)
	}
	if r := event("CLOSE", "wh-3"); r.code != 409 || r.body["outcome"] != "refused" || r.body["status"] != "SHIPPED" {
		t.Errorf("CLOSE on SHIPPED: %d %v, want refused", r.code, r.body)
	}
	b.order(t, "R-2", durable.PendingPay, 1999)
	for i, want := range []string{"applied", "skipped"} {
		r := b.adminReply("POST", "/orders/R-2/events", ordersToken, fmt.Sprintf(`{"event":"CLOSE","request_id":"c-%d"}`, i))
		if r.err != nil || r.code != 200 || r.body["outcome"] != want || r.body["status"] != "CLOSED" {
			t.Errorf("CLOSE %d of R-2: %d %v, want %s", i, r.code, r.body, want)
		}
	}
	if r := b.adminReply("POST", "/orders/R-2/events", ordersToken, `{"event":"SHIP","request_id":"s-1"}`); r.code != 409 || r.body["outcome"] != "refused" {
		t.Errorf("SHIP on CLOSED: %d %v, want refused", r.code, r.body)
	}
	b.checkInvariants(t)
}

// Order events run on the operator pool, under its timeouts: a SHIP
// waiting on the order's row lock is a session of the operator pool, and
// outlives the callbacks' budget.
func TestOrderEventsUseOperatorPool(t *testing.T) {
	const budget = 100 * time.Millisecond
	b := setup(t, options{budget: budget})
	b.order(t, "OP-1", durable.Paid, 1999)
	release := b.lockOrder(t, "OP-1")
	reply := b.adminAsync("POST", "/orders/OP-1/events", ordersToken, `{"event":"SHIP","request_id":"op-1"}`)
	durabletest.WaitLockWaiters(t, b.db, 1, "%notifyedge_transition%")
	var app string
	if err := b.db.QueryRow(t.Context(), `SELECT application_name FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%notifyedge_transition%'`).Scan(&app); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(app, "-ops") {
		t.Errorf("the waiting SHIP runs as %q, want the operator pool's session (-ops)", app)
	}
	// Held past three times the callbacks' budget, by the server's clock:
	// the operator pool's lock_timeout is seconds, so the SHIP still waits.
	wait.For(t, "the SHIP waiting on the row lock for three budgets", func() (bool, string) {
		n := b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
			AND query LIKE '%notifyedge_transition%' AND clock_timestamp() - query_start > $1::interval`, (3 * budget).String())
		return n > 0, "not waiting that long (or no longer waiting)"
	})
	release()
	if r := <-reply; r.err != nil || r.code != 200 || r.body["outcome"] != "applied" {
		t.Errorf("SHIP after the lock was released: %d %v %v", r.code, r.body, r.err)
	}
}

// Concurrent re-drives of one row answer as if one came after the other:
// one applies and resolves it, the rest find it resolved (409).
func TestConcurrentRedrives(t *testing.T) {
	b := setup(t, options{})
	b.order(t, "CR-1", durable.PendingPay, 1999)
	if r := b.post(t, body("T-cr1", "PAY_SUCCESS", "CR-1", 2999)); r.status != 422 {
		t.Fatalf("mismatch: %+v", r)
	}
	id := b.reviewID(t, "acme:T-cr1:PAY_SUCCESS", "AMOUNT_MISMATCH")
	b.admin(t, "PATCH", "/orders/CR-1", ordersToken, `{"amount":2999,"currency":"CNY"}`)
	const n = 6
	replies := make([]<-chan adminReply, n)
	for i := range n {
		replies[i] = b.adminAsync("POST", fmt.Sprintf("/review/%d/redrive", id), adminToken, fmt.Sprintf(`{"by":"ops-%d"}`, i))
	}
	codes := map[int]int{}
	for _, ch := range replies {
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		codes[r.code]++
		if r.code == 200 && (r.body["outcome"] != "applied" || r.replayed) {
			t.Errorf("the re-drive that resolved the row: %v replayed=%v, want applied", r.body, r.replayed)
		}
	}
	if codes[200] != 1 || codes[409] != n-1 {
		t.Errorf("answers %v, want one 200 and %d 409", codes, n-1)
	}
	if k := b.count(t, `SELECT count(*) FROM outbox WHERE order_no = 'CR-1' AND topic = 'ORDER_PAID'`); k != 1 {
		t.Errorf("ORDER_PAID rows %d", k)
	}
	b.checkInvariants(t)
}

// The Bearer scheme's name is case-insensitive.
func TestBearerSchemeAnyCase(t *testing.T) {
	b := setup(t, options{})
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		req, _ := http.NewRequest("GET", b.adminURL+"/review", nil)
		req.Header.Set("Authorization", scheme+" "+adminToken)
		resp, err := b.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("scheme %q: %d, want 200", scheme, resp.StatusCode)
		}
	}
	if code, _ := b.admin(t, "GET", "/review", "", ""); code != 401 {
		t.Errorf("no token: %d", code)
	}
}

// GET /orders/{no} answers the newest rows of each list, not all of them.
func TestOrderHistoryLimited(t *testing.T) {
	b := setup(t, options{})
	b.order(t, "H-1", durable.Paid, 1999)
	const claims = 150
	if _, err := b.db.Exec(t.Context(), `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json)
		SELECT 'acme:H' || g || ':PAY_CLOSED', 'H-1', repeat('a', 64), 'DONE', '{"http":200,"code":"SUCCESS","outcome":"skipped","status":"PAID"}'
		FROM generate_series(1, $1::int) g`, claims); err != nil {
		t.Fatal(err)
	}
	code, got := b.admin(t, "GET", "/orders/H-1", ordersToken, "")
	list, _ := got["claims"].([]any)
	if code != 200 || len(list) != durable.DefaultHistoryLimit || got["truncated"] != true {
		t.Fatalf("GET: %d, %d claims, truncated %v; want %d and truncated", code, len(list), got["truncated"], durable.DefaultHistoryLimit)
	}
	if last := list[len(list)-1].(map[string]any)["biz_key"]; last != fmt.Sprintf("acme:H%d:PAY_CLOSED", claims) {
		t.Errorf("the last claim is %v, want the newest", last)
	}
	code, got = b.admin(t, "GET", "/orders/H-1?limit=1000", ordersToken, "")
	if list, _ := got["claims"].([]any); code != 200 || len(list) != claims || got["truncated"] != nil {
		t.Errorf("GET ?limit=1000: %d, %d claims, truncated %v", code, len(list), got["truncated"])
	}
	for _, bad := range []string{"0", "1001", "x"} {
		if code, _ := b.admin(t, "GET", "/orders/H-1?limit="+bad, ordersToken, ""); code != 400 {
			t.Errorf("limit=%s: %d, want 400", bad, code)
		}
	}
}
