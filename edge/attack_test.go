package edge_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
)

// Point 2: authenticity. Every refusal is 401 and stores nothing.
func TestSignatures(t *testing.T) {
	b := setup(t, options{})
	b.order(t, "O-s", durable.PendingPay, 1999)
	payload := body("T-s", "PAY_SUCCESS", "O-s", 1999)
	now := time.Now()
	without := func(name string) http.Header {
		h := signed(t, testSecret, now, payload)
		h.Del(name)
		return h
	}
	cases := []struct {
		name    string
		header  http.Header
		payload string
	}{
		{"missing webhook-signature", without("webhook-signature"), payload},
		{"missing webhook-id", without("webhook-id"), payload},
		{"missing webhook-timestamp", without("webhook-timestamp"), payload},
		{"wrong secret", signed(t, otherSecret, now, payload), payload},
		{"tampered body", signed(t, testSecret, now, payload), strings.Replace(payload, "1999", "1998", 1)},
		{"timestamp 6 minutes old", signed(t, testSecret, now.Add(-6*time.Minute), payload), payload},
		{"timestamp 6 minutes ahead", signed(t, testSecret, now.Add(6*time.Minute), payload), payload},
		{"signature of another id", func() http.Header {
			h := signed(t, testSecret, now, payload)
			h.Set("webhook-id", "msg_other")
			return h
		}(), payload},
		{"not a v1 signature", func() http.Header {
			h := signed(t, testSecret, now, payload)
			h.Set("webhook-signature", strings.Replace(h.Get("webhook-signature"), "v1,", "v2,", 1))
			return h
		}(), payload},
		{"garbage signature", func() http.Header {
			h := signed(t, testSecret, now, payload)
			h.Set("webhook-signature", "v1,!!!notbase64 v1, v1,AAAA")
			return h
		}(), payload},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := b.counts(t)
			got := b.send(t, http.MethodPost, "/notify/acme", c.header, c.payload)
			if got.status != 401 || !strings.HasPrefix(got.body, `{"code":"FAIL","message":`) {
				t.Errorf("got %d %s, want 401 FAIL", got.status, got.body)
			}
			if after := b.counts(t); after != before {
				t.Errorf("stored something: %+v -> %+v", before, after)
			}
		})
	}
	t.Run("two signatures, only the second matches", func(t *testing.T) {
		h := signed(t, testSecret, now, payload)
		bad := signed(t, otherSecret, now, payload).Get("webhook-signature")
		h.Set("webhook-signature", bad+" "+h.Get("webhook-signature"))
		if got := b.send(t, http.MethodPost, "/notify/acme", h, payload); got.status != 200 || !strings.Contains(got.body, `"applied"`) {
			t.Errorf("got %d %s, want applied", got.status, got.body)
		}
	})
	t.Run("rotation: either configured secret", func(t *testing.T) {
		r := setup(t, options{secrets: []string{otherSecret, testSecret}})
		r.order(t, "O-rot", durable.PendingPay, 5)
		for i, secret := range []string{testSecret, otherSecret} {
			p := body(fmt.Sprintf("T-rot%d", i), "PAY_CLOSED", "O-rot", 5)
			got := r.send(t, http.MethodPost, "/notify/acme", signed(t, secret, now, p), p)
			if got.status != 200 {
				t.Errorf("secret %d: %d %s", i, got.status, got.body)
			}
		}
	})
}

// Point 3: the digest covers business fields only.
func TestDigestCoversBusinessFieldsOnly(t *testing.T) {
	b := setup(t, options{})
	b.order(t, "O-d", durable.PendingPay, 1999)
	first := b.post(t, body("T-d", "PAY_SUCCESS", "O-d", 1999))
	if first.status != 200 {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	same := []string{
		`{"order_no":"O-d","amount":1999,"currency":"CNY","event_type":"PAY_SUCCESS","channel_txn_id":"T-d"}`,
		"{\n  \"channel_txn_id\": \"T-d\",\n  \"event_type\": \"PAY_SUCCESS\",\n  \"order_no\": \"O-d\",\n  \"amount\": 1999,\n  \"currency\": \"CNY\"\n}\n",
		`{"channel_txn_id":"T-d","event_type":"PAY_SUCCESS","order_no":"O-d","amount":1999,"currency":"CNY","note":"re-sent","attempt":3}`,
	}
	for _, p := range same {
		got := b.post(t, p) // each post has a new webhook-id and timestamp
		if got.status != 200 || got.body != first.body || !got.replayed {
			t.Errorf("%s\n-> %d %s replayed=%v, want replay of %s", p, got.status, got.body, got.replayed, first.body)
		}
	}
	changed := map[string]string{
		"order_no": body("T-d", "PAY_SUCCESS", "O-d2", 1999),
		"amount":   body("T-d", "PAY_SUCCESS", "O-d", 1998),
		"currency": `{"channel_txn_id":"T-d","event_type":"PAY_SUCCESS","order_no":"O-d","amount":1999,"currency":"USD"}`,
	}
	for field, p := range changed {
		if got := b.post(t, p); got.status != 422 || !strings.Contains(got.body, `"conflict"`) {
			t.Errorf("%s changed: %d %s, want 422 conflict", field, got.status, got.body)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM notify_review WHERE reason = 'PAYLOAD_CONFLICT' AND resolved_at IS NULL`); n != 3 {
		t.Errorf("%d open conflict rows, want 3 (one per digest)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox`); n != 1 {
		t.Errorf("outbox rows %d, want 1", n)
	}
}

// Point 4: an oversized body is 413 and stores nothing. The request goes
// over a raw connection that declares the 1 MiB body and reads the answer
// before sending it: the server refuses on Content-Length without reading
// the body, and a client still writing it would see a reset instead.
func TestBodyTooLarge(t *testing.T) {
	b := setup(t, options{})
	b.order(t, "O-big", durable.PendingPay, 1999)
	pad := strings.Repeat("x", 1<<20)
	payload := `{"channel_txn_id":"T-big","event_type":"PAY_SUCCESS","order_no":"O-big","amount":1999,"currency":"CNY","pad":"` + pad + `"}`
	before := b.counts(t)
	conn, err := net.Dial("tcp", strings.TrimPrefix(b.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h := signed(t, testSecret, time.Now(), payload)
	fmt.Fprintf(conn, "POST /notify/acme HTTP/1.1\r\nHost: edge\r\nContent-Length: %d\r\n", len(payload))
	for k := range h {
		fmt.Fprintf(conn, "%s: %s\r\n", k, h.Get(k))
	}
	fmt.Fprint(conn, "\r\n")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || string(got) != `{"code":"FAIL","message":"body larger than 65536 bytes"}` {
		t.Errorf("got %d %s, want 413", resp.StatusCode, got)
	}
	if after := b.counts(t); after != before {
		t.Errorf("stored something: %+v -> %+v", before, after)
	}
	if got := b.metric(t, `notifyedge_requests_total{channel="acme",outcome="too_large"}`); got != 1 {
		t.Errorf("too_large counted %v", got)
	}
}

// Point 4: 500 concurrent first deliveries, 50 orders x 10 copies each.
func TestConcurrentDeliveryStorm(t *testing.T) {
	b := setup(t, options{})
	const orders, copies = 50, 10
	for i := range orders {
		b.order(t, fmt.Sprintf("O-st%02d", i), durable.PendingPay, int64(100+i))
	}
	type answer struct {
		order int
		r     reply
	}
	answers := make(chan answer, orders*copies)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for c := range copies {
		for i := range orders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := body(fmt.Sprintf("T-st%02d", i), "PAY_SUCCESS", fmt.Sprintf("O-st%02d", i), int64(100+i))
				h := signedID(t, testSecret, fmt.Sprintf("msg_%d_%d", i, c), time.Now(), p)
				<-start
				answers <- answer{i, b.send(t, http.MethodPost, "/notify/acme", h, p)}
			}()
		}
	}
	close(start)
	wg.Wait()
	close(answers)
	applied := make([]int, orders)
	bodies := make([]map[string]int, orders)
	for a := range answers {
		if a.r.status != 200 {
			t.Errorf("order %d: %d %s", a.order, a.r.status, a.r.body)
			continue
		}
		if !a.r.replayed {
			applied[a.order]++
		}
		if bodies[a.order] == nil {
			bodies[a.order] = map[string]int{}
		}
		bodies[a.order][a.r.body]++
	}
	for i := range orders {
		if applied[i] != 1 || len(bodies[i]) != 1 {
			t.Errorf("order %d: %d applied, answers %v; want 1 applied and %d identical answers", i, applied[i], bodies[i], copies)
		}
	}
	durabletest.StormPaidOnce(t, b.db, orders)
}

// Point 5: the budget. With the order row locked (for as long as the test
// likes), the delivery answers 503 at the budget, not when the lock goes,
// and the retry after the lock is gone is applied exactly once.
func TestBudgetExceededIs503(t *testing.T) {
	const budget = 200 * time.Millisecond
	b := setup(t, options{budget: budget})
	b.order(t, "O-b", durable.PendingPay, 1999)
	release := b.lockOrder(t, "O-b")
	payload := body("T-b", "PAY_SUCCESS", "O-b", 1999)
	// The first request on a fresh connection must not pay for its dial.
	b.send(t, http.MethodGet, "/healthz-warmup", http.Header{}, "")
	h := signed(t, testSecret, time.Now(), payload)
	// The lock is held until release below, so an answer at all came at
	// the budget, not when the lock went, however busy the machine.
	got := b.send(t, http.MethodPost, "/notify/acme", h, payload)
	if got.status != 503 || !strings.HasPrefix(got.body, `{"code":"FAIL","message":"latency budget exceeded`) {
		t.Errorf("got %d %s, want 503 FAIL", got.status, got.body)
	}
	if n := b.count(t, `SELECT count(*) FROM notify_claim`); n != 0 {
		t.Errorf("claims %d after 503, want 0", n)
	}
	release()
	retry := b.post(t, payload)
	if retry.status != 200 || !strings.Contains(retry.body, `"applied"`) {
		t.Errorf("retry: %d %s, want applied", retry.status, retry.body)
	}
	again := b.post(t, payload)
	if !again.replayed || again.body != retry.body {
		t.Errorf("second retry: %+v, want replay", again)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE order_no = 'O-b'`); n != 1 {
		t.Errorf("outbox rows %d, want 1", n)
	}
	if got := b.metric(t, `notifyedge_requests_total{channel="acme",outcome="unavailable"}`); got != 1 {
		t.Errorf("unavailable counted %v", got)
	}
}
