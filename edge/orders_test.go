package edge_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge/channel"
)

// The orders API: registration, correction, history and internal events,
// with its tokens.
func TestOrdersAPI(t *testing.T) {
	b := setup(t, options{})
	// Order numbers may hold "/", "?", "#" and "%": percent-encoded in the
	// path, routed on the raw path and decoded once. (A space is routed the
	// same way, then refused by the order number rule, 0x21-0x7E: no
	// callback could ever name such an order.)
	path := "/orders/" + url.PathEscape("A/B?C#D%E")
	if code, got := b.admin(t, "PUT", "/orders/"+url.PathEscape("A B"), ordersToken, `{"amount":1,"currency":"CNY"}`); code != 400 || !strings.Contains(fmt.Sprint(got["message"]), "order_no") {
		t.Errorf("PUT an order number with a space: %d %v, want 400 from the order number rule", code, got)
	}

	// Tokens: none or a wrong one is 401; the orders token opens /orders
	// but never /review.
	for _, tok := range []string{"", "wrong"} {
		if code, _ := b.admin(t, "GET", path, tok, ""); code != 401 {
			t.Errorf("GET %s with token %q: %d, want 401", path, tok, code)
		}
	}
	if code, _ := b.admin(t, "GET", "/review", ordersToken, ""); code != 401 {
		t.Errorf("the orders token on /review: %d, want 401", code)
	}
	if code, _ := b.admin(t, "POST", "/review/1/redrive", ordersToken, `{"by":"x"}`); code != 401 {
		t.Errorf("the orders token on /review/1/redrive: %d, want 401", code)
	}

	// PUT: 201 new, 200 the same again, 409 another amount, 400 bad fields.
	code, got := b.admin(t, "PUT", path, ordersToken, `{"amount":1999,"currency":"CNY"}`)
	if code != 201 || got["order_no"] != "A/B?C#D%E" || got["status"] != "PENDING_PAY" || got["amount"] != float64(1999) {
		t.Fatalf("PUT new: %d %v", code, got)
	}
	if code, got := b.admin(t, "PUT", path, adminToken, `{"amount":1999,"currency":"CNY"}`); code != 200 || got["order_no"] != "A/B?C#D%E" {
		t.Errorf("PUT the same order again (admin token): %d %v", code, got)
	}
	if code, got := b.admin(t, "PUT", path, ordersToken, `{"amount":2999,"currency":"CNY"}`); code != 409 || got["amount"] != float64(1999) {
		t.Errorf("PUT another amount: %d %v, want 409 with the order as it is", code, got)
	}
	for _, body := range []string{`{"amount":19.99,"currency":"CNY"}`, `{"amount":"1999","currency":"CNY"}`, `{"amount":0,"currency":"CNY"}`,
		`{"amount":1999,"currency":"cny"}`, `{"amount":1999}`, `{"amount":1999,"currency":"CNY","x":1}`, `{"amount":1999,"currency":"CNY"} x`} {
		if code, _ := b.admin(t, "PUT", "/orders/O-bad", ordersToken, body); code != 400 {
			t.Errorf("PUT %s: %d, want 400", body, code)
		}
	}
	if code, _ := b.admin(t, "PUT", "/orders/"+strings.Repeat("x", 65), ordersToken, `{"amount":1,"currency":"CNY"}`); code != 400 {
		t.Errorf("PUT a 65-byte order number: %d, want 400", code)
	}
	if code, _ := b.admin(t, "GET", "/orders/O-bad", ordersToken, ""); code != 404 {
		t.Errorf("a refused PUT stored an order: %d", code)
	}

	// PATCH corrects a pending order; 404 unknown; 409 once paid.
	if code, got := b.admin(t, "PATCH", path, ordersToken, `{"amount":2999,"currency":"CNY"}`); code != 200 || got["amount"] != float64(2999) {
		t.Errorf("PATCH pending: %d %v", code, got)
	}
	if code, _ := b.admin(t, "PATCH", "/orders/O-none", ordersToken, `{"amount":1,"currency":"CNY"}`); code != 404 {
		t.Errorf("PATCH unknown: %d, want 404", code)
	}
	if r := b.post(t, body("T-api", "PAY_SUCCESS", "A/B?C#D%E", 2999)); r.status != 200 {
		t.Fatalf("payment: %+v", r)
	}
	if code, _ := b.admin(t, "PATCH", path, ordersToken, `{"amount":1,"currency":"CNY"}`); code != 409 {
		t.Errorf("PATCH a paid order: %d, want 409", code)
	}

	// GET: what happened to this order.
	code, got = b.admin(t, "GET", path, ordersToken, "")
	if code != 200 || got["status"] != "PAID" || got["paid_by"] != "acme:T-api" {
		t.Fatalf("GET: %d %v", code, got)
	}
	claims, _ := got["claims"].([]any)
	events, _ := got["events"].([]any)
	if len(claims) != 1 || claims[0].(map[string]any)["outcome"] != "applied" || len(events) != 1 || events[0].(map[string]any)["topic"] != "ORDER_PAID" {
		t.Errorf("GET history: claims %v events %v", claims, events)
	} else if id, _ := events[0].(map[string]any)["event_id"].(string); len(id) != 36 {
		t.Errorf("GET history: event %v, want its event_id", events[0])
	}
	if code, _ := b.admin(t, "GET", "/orders/O-none", ordersToken, ""); code != 404 {
		t.Errorf("GET unknown: %d", code)
	}

	// Internal events: SHIP applied once per request id, replayed, 409 for
	// the same id with another event, 404 unknown, 400 bad.
	ship := `{"event":"SHIP","request_id":"wms-1"}`
	if code, got := b.admin(t, "POST", path+"/events", ordersToken, ship); code != 200 || got["outcome"] != "applied" || got["status"] != "SHIPPED" {
		t.Fatalf("SHIP: %d %v", code, got)
	}
	if code, got := b.admin(t, "POST", path+"/events", ordersToken, ship); code != 200 || got["outcome"] != "applied" || got["status"] != "SHIPPED" {
		t.Errorf("SHIP again with the same request id: %d %v, want the first answer", code, got)
	}
	if code, got := b.admin(t, "POST", path+"/events", ordersToken, `{"event":"SHIP","request_id":"wms-2"}`); code != 200 || got["outcome"] != "skipped" {
		t.Errorf("SHIP with another request id: %d %v, want skipped", code, got)
	}
	if code, _ := b.admin(t, "POST", path+"/events", ordersToken, `{"event":"CLOSE","request_id":"wms-1"}`); code != 409 {
		t.Errorf("the same request id with another event: %d, want 409", code)
	}
	if code, _ := b.admin(t, "POST", "/orders/O-none/events", ordersToken, ship); code != 404 {
		t.Errorf("event on an unknown order: %d, want 404", code)
	}
	for _, bad := range []string{`{"event":"PAY_SUCCESS","request_id":"r"}`, `{"event":"SHIP"}`, `{"event":"SHIP","request_id":""}`} {
		if code, _ := b.admin(t, "POST", path+"/events", ordersToken, bad); code != 400 {
			t.Errorf("event %s: %d, want 400", bad, code)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE order_no = $1 AND topic = 'ORDER_SHIPPED'`, "A/B?C#D%E"); n != 1 {
		t.Errorf("ORDER_SHIPPED rows %d, want 1", n)
	}
	b.checkInvariants(t)
}

// The incident with the shipping done through the orders API: the order
// is paid, shipped by the merchant's system, and a stale "unpaid, closed"
// snapshot afterwards is acknowledged and skipped.
func TestIncidentThroughOrdersAPI(t *testing.T) {
	b := setup(t, options{})
	if code, _ := b.admin(t, "PUT", "/orders/O-inc", ordersToken, `{"amount":1999,"currency":"CNY"}`); code != 201 {
		t.Fatal(code)
	}
	b.post(t, body("T-inc", "PAY_SUCCESS", "O-inc", 1999))
	if code, got := b.admin(t, "POST", "/orders/O-inc/events", ordersToken, `{"event":"SHIP","request_id":"comp-1"}`); code != 200 || got["outcome"] != "applied" {
		t.Fatalf("SHIP: %d %v", code, got)
	}
	if r := b.post(t, body("T-inc", "PAY_CLOSED", "O-inc", 1999)); r.status != 200 || r.body != `{"code":"SUCCESS","outcome":"skipped","status":"SHIPPED"}` {
		t.Errorf("stale snapshot after the API shipped: %d %s", r.status, r.body)
	}
	if r := b.post(t, body("T-inc", "PAY_SUCCESS", "O-inc", 1999)); r.status != 200 || !r.replayed {
		t.Errorf("the payment again: %+v", r)
	}
	for topic, want := range map[string]int{"ORDER_PAID": 1, "ORDER_SHIPPED": 1, "ORDER_CLOSED": 0} {
		if n := b.count(t, `SELECT count(*) FROM outbox WHERE order_no = 'O-inc' AND topic = $1`, topic); n != want {
			t.Errorf("%s rows %d, want %d", topic, n, want)
		}
	}
	b.checkInvariants(t)
}

// reviewID returns the id of the open review row of reason for biz_key.
func (b *bundle) reviewID(t *testing.T, bizKey, reason string) int64 {
	t.Helper()
	var id int64
	if err := b.db.QueryRow(t.Context(), `SELECT id FROM notify_review WHERE biz_key = $1 AND reason = $2 AND resolved_at IS NULL`,
		bizKey, reason).Scan(&id); err != nil {
		t.Fatalf("open %s row of %s: %v", reason, bizKey, err)
	}
	return id
}

// Re-drive: a held delivery decided again once its cause is fixed, for the
// generic channel, WeChat Pay (stored decrypted) and Alipay; every answer.
func TestRedrive(t *testing.T) {
	wx, _ := wechatSigner(t)
	ali, _ := alipaySigner()
	b := setup(t, options{channels: []channel.Channel{wechatChannel(t, wx), alipayChannel(t, ali)}})
	redrive := func(id int64, body string) (int, map[string]any) {
		return b.admin(t, "POST", fmt.Sprintf("/review/%d/redrive", id), adminToken, body)
	}

	// AMOUNT_MISMATCH, fixed by PATCH, re-driven: applied, the row resolved
	// by the operator.
	b.order(t, "RD-1", durable.PendingPay, 1999)
	if r := b.post(t, body("T-rd1", "PAY_SUCCESS", "RD-1", 2999)); r.status != 422 {
		t.Fatalf("mismatch: %+v", r)
	}
	id := b.reviewID(t, "acme:T-rd1:PAY_SUCCESS", "AMOUNT_MISMATCH")
	if code, got := redrive(id, `{"by":"ops-alice"}`); code != 200 || got["http"] != float64(422) || got["outcome"] != "amount_mismatch" {
		t.Errorf("re-drive before the fix: %d %v, want the 422 answer and the row left open", code, got)
	}
	b.admin(t, "PATCH", "/orders/RD-1", ordersToken, `{"amount":2999,"currency":"CNY"}`)
	code, got := redrive(id, `{"by":"ops-alice"}`)
	if code != 200 || got["http"] != float64(200) || got["code"] != "SUCCESS" || got["outcome"] != "applied" || got["status"] != "PAID" {
		t.Fatalf("re-drive after the PATCH: %d %v", code, got)
	}
	var by *string
	b.db.QueryRow(t.Context(), `SELECT resolved_by FROM notify_review WHERE id = $1`, id).Scan(&by)
	if by == nil || *by != "ops-alice" {
		t.Errorf("resolved_by %v, want ops-alice", by)
	}
	var via string
	b.db.QueryRow(t.Context(), `SELECT payload->>'via' FROM outbox WHERE order_no = 'RD-1' AND topic = 'ORDER_PAID'`).Scan(&via)
	if via != durable.ViaRedrive {
		t.Errorf("the re-driven payment's event says via %q, want %q", via, durable.ViaRedrive)
	}
	if code, _ := redrive(id, `{"by":"ops-alice"}`); code != 409 {
		t.Errorf("re-drive of a resolved row: %d, want 409", code)
	}
	if r := b.post(t, body("T-rd1", "PAY_SUCCESS", "RD-1", 2999)); r.status != 200 || !r.replayed {
		t.Errorf("the channel's late retry after the re-drive: %+v, want a replay", r)
	}

	// Answers: 404 unknown id, 400 without by, 409 a reason not re-drivable.
	if code, _ := redrive(999999, `{"by":"x"}`); code != 404 {
		t.Errorf("unknown id: %d", code)
	}
	if code, _ := redrive(id, `{}`); code != 400 {
		t.Errorf("without by: %d", code)
	}
	b.post(t, body("T-rd9", "PAY_SUCCESS", "RD-1", 2999)) // a second payment: DUPLICATE_PAYMENT
	if code, _ := redrive(b.reviewID(t, "acme:T-rd9:PAY_SUCCESS", "DUPLICATE_PAYMENT"), `{"by":"x"}`); code != 409 {
		t.Errorf("re-drive of a DUPLICATE_PAYMENT row: %d, want 409", code)
	}

	// WeChat Pay, UNKNOWN_ORDER: the row holds the decrypted resource; the
	// re-drive days later needs no fresh signature.
	h, wbody, err := wx.Notify("TRANSACTION.SUCCESS", wxTransaction("4200007001", "RD-WX", 1999), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if r := b.sendWx(t, h, wbody); r.status != 404 {
		t.Fatalf("WeChat payment for an unknown order: %+v", r)
	}
	b.admin(t, "PUT", "/orders/RD-WX", ordersToken, `{"amount":1999,"currency":"CNY"}`)
	if code, got := redrive(b.reviewID(t, "wx:4200007001:PAY_SUCCESS", "UNKNOWN_ORDER"), `{"by":"ops-bob"}`); code != 200 || got["outcome"] != "applied" {
		t.Errorf("WeChat re-drive: %d %v", code, got)
	}

	// Alipay, UNKNOWN_ORDER.
	if r := b.sendAli(t, ali, aliParams("2026120399001", "RD-ALI", "19.99", "TRADE_SUCCESS")); r.status != 404 {
		t.Fatalf("Alipay payment for an unknown order: %+v", r)
	}
	b.admin(t, "PUT", "/orders/RD-ALI", ordersToken, `{"amount":1999,"currency":"CNY"}`)
	if code, got := redrive(b.reviewID(t, "ali:2026120399001:PAY_SUCCESS", "UNKNOWN_ORDER"), `{"by":"ops-bob"}`); code != 200 || got["outcome"] != "applied" {
		t.Errorf("Alipay re-drive: %d %v", code, got)
	}
	for _, no := range []string{"RD-1", "RD-WX", "RD-ALI"} {
		if s := b.status(t, no); s != "PAID" {
			t.Errorf("%s is %s after the re-drive", no, s)
		}
	}
	b.checkInvariants(t)
}
