package edge_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
)

// Point 1: every row of the answers table, through the real listener:
// status code, body, and what is (not) stored.
func TestAnswersTable(t *testing.T) {
	b := setup(t, options{})
	type row struct {
		name     string
		setup    func(t *testing.T)
		payload  string
		status   int
		body     string
		replayed bool
		// after: the table counts this request must leave (delta from before)
		delta  counts
		review durable.ReviewReason // open review row expected for this delivery's key
	}
	rows := []row{
		{
			name:    "first delivery, legal transition",
			setup:   func(t *testing.T) { b.order(t, "O-1", durable.PendingPay, 1999) },
			payload: body("T-1", "PAY_SUCCESS", "O-1", 1999),
			status:  200, body: `{"code":"SUCCESS","outcome":"applied","status":"PAID"}`,
			delta: counts{claims: 1, outbox: 1},
		},
		{
			name:    "duplicate of a finished delivery",
			payload: body("T-1", "PAY_SUCCESS", "O-1", 1999),
			status:  200, body: `{"code":"SUCCESS","outcome":"applied","status":"PAID"}`, replayed: true,
		},
		{
			name: "duplicate re-serialized: reordered keys, whitespace, an extra field",
			payload: `{ "currency" : "CNY", "amount":1999,
				"order_no":"O-1","event_type":"PAY_SUCCESS", "extra": {"nested":[1,2,{"x":null}]}, "channel_txn_id":"T-1" }`,
			status: 200, body: `{"code":"SUCCESS","outcome":"applied","status":"PAID"}`, replayed: true,
		},
		{
			name:    "duplicate with JSON escapes that decode to the same values",
			payload: `{"channel_txn_id":"T\u002d1","event_type":"PAY_\u0053UCCESS","order_no":"O\u002d1","amount":1999,"currency":"\u0043NY"}`,
			status:  200, body: `{"code":"SUCCESS","outcome":"applied","status":"PAID"}`, replayed: true,
		},
		{
			name:    "stale, out-of-order transition (PAY_CLOSED on PAID)",
			payload: body("T-1c", "PAY_CLOSED", "O-1", 1999),
			status:  200, body: `{"code":"SUCCESS","outcome":"skipped","status":"PAID"}`,
			delta: counts{claims: 1},
		},
		{
			name:    "money moved against a closed order",
			setup:   func(t *testing.T) { b.order(t, "O-2", durable.Closed, 500) },
			payload: body("T-2", "PAY_SUCCESS", "O-2", 500),
			status:  200, body: `{"code":"SUCCESS","outcome":"skipped","status":"CLOSED"}`,
			delta: counts{claims: 1, reviews: 1}, review: durable.ReviewPaidAfterClose,
		},
		{
			name:    "a second payment under a new channel txn id",
			payload: body("T-1b", "PAY_SUCCESS", "O-1", 1999),
			status:  200, body: `{"code":"SUCCESS","outcome":"skipped","status":"PAID"}`,
			delta: counts{claims: 1, reviews: 1}, review: durable.ReviewDuplicatePayment,
		},
		{
			name:    "premature refund",
			setup:   func(t *testing.T) { b.order(t, "O-3", durable.PendingPay, 700) },
			payload: body("R-3", "REFUND_SUCCESS", "O-3", 700),
			status:  409, body: `{"code":"FAIL","outcome":"premature","status":"PENDING_PAY","message":"the event arrived before the payment it depends on; retry later"}`,
		},
		{
			name:    "same key, different digest",
			payload: body("T-1", "PAY_SUCCESS", "O-1", 2000),
			status:  422, body: `{"code":"FAIL","outcome":"conflict","message":"same key, different content: held for review"}`,
			delta: counts{reviews: 1}, review: durable.ReviewPayloadConflict,
		},
		{
			name:    "amount differs from the order",
			setup:   func(t *testing.T) { b.order(t, "O-4", durable.PendingPay, 100) },
			payload: body("T-4", "PAY_SUCCESS", "O-4", 101),
			status:  422, body: `{"code":"FAIL","outcome":"amount_mismatch","message":"amount or currency differs from the order: held for review"}`,
			delta: counts{reviews: 1}, review: durable.ReviewAmountMismatch,
		},
		{
			name:    "unknown order",
			payload: body("T-5", "PAY_SUCCESS", "O-nope", 100),
			status:  404, body: `{"code":"FAIL","outcome":"unknown_order","message":"unknown order: held for review"}`,
			delta: counts{reviews: 1}, review: durable.ReviewUnknownOrder,
		},
		{
			name:    "malformed body",
			payload: `{"channel_txn_id":"T-6","event_type":"PAY_SUCCESS","order_no":"O-1","amount":"1999","currency":"CNY"}`,
			status:  400, body: `{"code":"FAIL","message":"amount: must be a positive integer in minor units, at most 2^53-1"}`,
		},
		{
			name:    "SHIP is never a channel event",
			payload: body("T-7", "SHIP", "O-1", 1999),
			status:  400, body: `{"code":"FAIL","message":"event_type: must be one of PAY_SUCCESS, PAY_CLOSED, REFUND_SUCCESS, REFUND_FAILED, TRADE_CLOSED"}`,
		},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			if r.setup != nil {
				r.setup(t)
			}
			before := b.counts(t)
			got := b.post(t, r.payload)
			if got.status != r.status || got.body != r.body || got.replayed != r.replayed {
				t.Errorf("got %d %s replayed=%v\nwant %d %s replayed=%v", got.status, got.body, got.replayed, r.status, r.body, r.replayed)
			}
			if got.ctype != "application/json" {
				t.Errorf("content-type %q", got.ctype)
			}
			after := b.counts(t)
			want := counts{before.claims + r.delta.claims, before.orders, before.outbox + r.delta.outbox, before.reviews + r.delta.reviews}
			if after != want {
				t.Errorf("table counts %+v, want %+v", after, want)
			}
			if r.review != "" {
				if n := b.count(t, `SELECT count(*) FROM notify_review WHERE reason = $1 AND resolved_at IS NULL`, string(r.review)); n < 1 {
					t.Errorf("no open %s review", r.review)
				}
			}
		})
	}
	if s := b.status(t, "O-1"); s != "PAID" {
		t.Errorf("O-1 is %s, want PAID", s)
	}

	// Requests refused before the body is read store nothing either.
	refusals := []struct {
		name, method, path string
		header             http.Header
		payload            string
		status             int
		body               string
	}{
		{"unknown channel", "POST", "/notify/nosuch", signed(t, testSecret, time.Now(), body("T-9", "PAY_SUCCESS", "O-1", 1)), body("T-9", "PAY_SUCCESS", "O-1", 1),
			404, `{"code":"FAIL","message":"unknown channel"}`},
		{"channel name outside [a-z0-9_]", "POST", "/notify/ACME", signed(t, testSecret, time.Now(), "{}"), "{}",
			404, `{"code":"FAIL","message":"unknown channel"}`},
		{"bad signature", "POST", "/notify/acme", signed(t, otherSecret, time.Now(), body("T-9", "PAY_SUCCESS", "O-1", 1999)), body("T-9", "PAY_SUCCESS", "O-1", 1999),
			401, `{"code":"FAIL","message":"no webhook-signature entry matches"}`},
		{"GET under /notify/", "GET", "/notify/acme", http.Header{}, "",
			405, `{"code":"FAIL","message":"method not allowed: use POST"}`},
		{"unknown path", "POST", "/callback", http.Header{}, "",
			404, `{"code":"FAIL","message":"no such path: POST /notify/{channel}"}`},
		{"wrong content type", "POST", "/notify/acme", func() http.Header {
			h := signed(t, testSecret, time.Now(), body("T-9", "PAY_SUCCESS", "O-1", 1999))
			h.Set("Content-Type", "text/plain")
			return h
		}(), body("T-9", "PAY_SUCCESS", "O-1", 1999), 400, `{"code":"FAIL","message":"content-type: must be application/json"}`},
	}
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) {
			before := b.counts(t)
			got := b.send(t, r.method, r.path, r.header, r.payload)
			if got.status != r.status || got.body != r.body {
				t.Errorf("got %d %s, want %d %s", got.status, got.body, r.status, r.body)
			}
			if after := b.counts(t); after != before {
				t.Errorf("stored something: %+v -> %+v", before, after)
			}
		})
	}

	// The metrics saw each outcome under its label; the unknown channel is
	// "unknown", never the attacker's name.
	for sample, want := range map[string]float64{
		`notifyedge_requests_total{channel="acme",outcome="applied"}`:            1,
		`notifyedge_requests_total{channel="acme",outcome="replayed_db"}`:        3,
		`notifyedge_requests_total{channel="acme",outcome="bad_request"}`:        4,
		`notifyedge_requests_total{channel="acme",outcome="skipped"}`:            3,
		`notifyedge_requests_total{channel="acme",outcome="conflict"}`:           1,
		`notifyedge_requests_total{channel="unknown",outcome="unknown_channel"}`: 2,
		`notifyedge_requests_total{channel="unknown",outcome="bad_request"}`:     1,
		`notifyedge_review_open{reason="PAYLOAD_CONFLICT"}`:                      1,
		`notifyedge_outbox_pending`:                                              1,
	} {
		if got := b.metric(t, sample); got != want {
			t.Errorf("%s = %v, want %v", sample, got, want)
		}
	}
}

// The review endpoints: no, wrong and right token; listing and resolving.
func TestReviewEndpoints(t *testing.T) {
	b := setup(t, options{})
	b.post(t, body("T-u1", "PAY_SUCCESS", "O-u1", 100)) // unknown order: one review row
	b.post(t, body("T-u2", "PAY_SUCCESS", "O-u2", 100))

	for _, tok := range []string{"", "wrong-token", adminToken + "x"} {
		if code, _ := b.admin(t, "GET", "/review", tok, ""); code != 401 {
			t.Errorf("GET /review with token %q: %d, want 401", tok, code)
		}
		if code, _ := b.admin(t, "POST", "/review/1/resolve", tok, `{"resolution":"x","by":"y"}`); code != 401 {
			t.Errorf("POST resolve with token %q: %d, want 401", tok, code)
		}
	}
	code, page := b.admin(t, "GET", "/review?limit=1", adminToken, "")
	items, _ := page["items"].([]any)
	if code != 200 || len(items) != 1 {
		t.Fatalf("GET /review: %d %v", code, page)
	}
	newest := items[0].(map[string]any)
	if newest["biz_key"] != "acme:T-u2:PAY_SUCCESS" || newest["reason"] != "UNKNOWN_ORDER" || newest["resolved_at"] != nil ||
		!strings.Contains(newest["raw_body"].(string), `"O-u2"`) {
		t.Errorf("newest review %v", newest)
	}
	next := page["next_after_id"]
	code, page = b.admin(t, "GET", "/review?limit=1&after_id="+jsonNumber(next), adminToken, "")
	items, _ = page["items"].([]any)
	if code != 200 || len(items) != 1 || items[0].(map[string]any)["biz_key"] != "acme:T-u1:PAY_SUCCESS" {
		t.Fatalf("second page: %d %v", code, page)
	}
	id := jsonNumber(items[0].(map[string]any)["id"])
	if code, row := b.admin(t, "POST", "/review/"+id+"/resolve", adminToken, `{"resolution":"order created upstream","by":"ops@example"}`); code != 200 ||
		row["resolution"] != "order created upstream" || row["resolved_by"] != "ops@example" || row["resolved_at"] == nil {
		t.Errorf("resolve: %d %v", code, row)
	}
	if code, _ := b.admin(t, "POST", "/review/"+id+"/resolve", adminToken, `{"resolution":"again","by":"ops"}`); code != 409 {
		t.Errorf("resolve twice: %d, want 409", code)
	}
	if code, _ := b.admin(t, "POST", "/review/999999/resolve", adminToken, `{"resolution":"x","by":"y"}`); code != 404 {
		t.Errorf("resolve unknown id: %d, want 404", code)
	}
	if code, _ := b.admin(t, "POST", "/review/"+id+"/resolve", adminToken, `{"resolution":""}`); code != 400 {
		t.Errorf("resolve without by: %d, want 400", code)
	}
	if code, page := b.admin(t, "GET", "/review?state=resolved", adminToken, ""); code != 200 || len(page["items"].([]any)) != 1 {
		t.Errorf("resolved: %d %v", code, page)
	}
	if code, page := b.admin(t, "GET", "/review?state=all", adminToken, ""); code != 200 || len(page["items"].([]any)) != 2 || page["next_after_id"] != nil {
		t.Errorf("all: %d %v", code, page)
	}
	if code, _ := b.admin(t, "GET", "/review?state=bogus", adminToken, ""); code != 400 {
		t.Errorf("bad state: %d, want 400", code)
	}

	// No token configured: the review endpoints refuse everyone.
	b2 := setup(t, options{noTokens: true})
	if code, _ := b2.admin(t, "GET", "/review", adminToken, ""); code != 401 {
		t.Errorf("no token configured: %d, want 401", code)
	}
}

func TestHealthAndReadiness(t *testing.T) {
	b := setup(t, options{})
	if code, _ := b.admin(t, "GET", "/healthz", "", ""); code != 200 {
		t.Errorf("healthz %d", code)
	}
	code, ready := b.admin(t, "GET", "/readyz", "", "")
	if code != 200 || ready["postgres"] != "ok" || ready["redis"] != "off" || ready["relay"] != "off" {
		t.Errorf("readyz %d %v", code, ready)
	}
	b.server.Drain()
	if code, ready := b.admin(t, "GET", "/readyz", "", ""); code != 503 {
		t.Errorf("readyz while draining: %d %v, want 503", code, ready)
	}
}

func jsonNumber(v any) string {
	f, _ := v.(float64)
	return strings.TrimSuffix(strings.TrimSuffix(strconvFormat(f), ".0"), ".")
}
