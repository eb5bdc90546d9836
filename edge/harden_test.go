package edge_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/admin"
	"github.com/notifyedge/notifyedge/edge/edgetest"
)

// rawRequest writes req on a fresh connection from local address from
// ("" for any) to addr and returns the status line and body of the answer.
func rawRequest(t *testing.T, from, addr, req string) (status int, body string) {
	t.Helper()
	c := dialFrom(t, from, addr)
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer to %.40q: %v", req, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// signedRequest is a whole HTTP/1.1 request of payload to channel acme,
// keep-alive.
func signedRequest(t *testing.T, payload string) string {
	h := signed(t, testSecret, time.Now(), payload)
	var b strings.Builder
	fmt.Fprintf(&b, "POST /notify/acme HTTP/1.1\r\nHost: edge\r\nContent-Length: %d\r\n", len(payload))
	for k := range h {
		fmt.Fprintf(&b, "%s: %s\r\n", k, h.Get(k))
	}
	b.WriteString("\r\n" + payload)
	return b.String()
}

func hostPort(url string) string { return strings.TrimPrefix(url, "http://") }

// One client address cannot take every connection: idle connections over
// its cap are refused in the answers' JSON, and callbacks from another
// address (and from the same one once it lets go) are still answered.
func TestPerAddressConnectionCap(t *testing.T) {
	const perIP = 8
	b := setup(t, options{server: edge.Config{MaxConnsPerIP: perIP, IdleTimeout: time.Minute}})
	addr := hostPort(b.url)
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	// Hold perIP connections open from 127.0.0.1, each after one request
	// (keep-alive), as the attack did.
	for range perIP {
		c := dialFrom(t, "127.0.0.1", addr)
		idle = append(idle, c)
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: edge\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// Over the cap: refused, in JSON.
	code, answer := rawRequest(t, "127.0.0.1", addr, signedRequest(t, body("T-cap1", "PAY_SUCCESS", "O-cap1", 1999)))
	if code != http.StatusTooManyRequests || !json.Valid([]byte(answer)) || !strings.Contains(answer, `"code":"FAIL"`) {
		t.Errorf("over the per-address cap: %d %s, want 429 in the answers' JSON", code, answer)
	}
	// Another address still gets in.
	b.order(t, "O-cap2", durable.PendingPay, 1999)
	code, answer = rawRequest(t, "127.0.0.2", addr, signedRequest(t, body("T-cap2", "PAY_SUCCESS", "O-cap2", 1999)))
	if code != 200 || !strings.Contains(answer, `"applied"`) {
		t.Errorf("from another address while one is at its cap: %d %s", code, answer)
	}
	// The capped address once it lets go of one connection.
	idle[0].Close()
	idle = idle[1:]
	b.order(t, "O-cap3", durable.PendingPay, 1999)
	// The server notices the close asynchronously.
	wait.For(t, "a callback from the address once it released a slot", func() (bool, string) {
		code, answer = rawRequest(t, "127.0.0.1", addr, signedRequest(t, body("T-cap3", "PAY_SUCCESS", "O-cap3", 1999)))
		return code == 200, fmt.Sprint(code, " ", answer)
	})
	if got := b.metric(t, `notifyedge_connections_refused_total{reason="per_ip"}`); got < 1 {
		t.Errorf("per_ip refusals counted: %v", got)
	}
}

// A keep-alive connection that sends nothing more is closed after the idle
// timeout, so idle connections free their slots by themselves.
func TestIdleKeepAliveClosed(t *testing.T) {
	b := setup(t, options{server: edge.Config{IdleTimeout: 300 * time.Millisecond}})
	c := dialFrom(t, "", hostPort(b.url))
	defer c.Close()
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: edge\r\n\r\n")
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(wait.Timeout))
	if _, err := r.ReadByte(); err == nil {
		t.Fatal("the server sent more on an idle connection")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("idle keep-alive connection still open after %v (idle timeout 300 ms)", wait.Timeout)
	}
	t.Logf("closed after %v idle", time.Since(start).Round(time.Millisecond))
}

// The total connection cap refuses in the answers' JSON too.
func TestTotalConnectionCapJSON(t *testing.T) {
	b := setup(t, options{server: edge.Config{Concurrency: 2, IdleTimeout: time.Minute}})
	addr := hostPort(b.url)
	for range 2 {
		c := dialFrom(t, "", addr)
		defer c.Close()
		// Answered, so accepted and counted: the connection stays open.
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: edge\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	code, answer := rawRequest(t, "", addr, "GET /healthz HTTP/1.1\r\nHost: edge\r\n\r\n")
	if code != http.StatusServiceUnavailable || !strings.Contains(answer, `"code":"FAIL"`) {
		t.Errorf("over the total cap: %d %s, want 503 in the answers' JSON", code, answer)
	}
}

// No header value reaches the log, however malformed the request, and a
// flood of malformed requests grows the log by a few lines a second.
func TestLogsRedactedAndBounded(t *testing.T) {
	var logs edgetest.Log
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	b := setup(t, options{logger: logger})
	sig := signed(t, testSecret, time.Now(), `{}`).Get("webhook-signature")
	secrets := []string{adminToken, sig}
	requests := []string{
		// A control character inside the header carrying the secret.
		"POST /notify/acme HTTP/1.1\r\nHost: e\r\nAuthorization: Bearer " + adminToken + "\x01\r\nContent-Length: 2\r\n\r\n{}",
		"POST /notify/acme HTTP/1.1\r\nHost: e\r\nwebhook-signature: " + sig + "\x7f\x00\r\nContent-Length: 2\r\n\r\n{}",
		// A header line without a colon, holding the secret.
		"POST /notify/acme HTTP/1.1\r\nHost: e\r\n" + sig + "\r\n\r\n",
		"GET /review HTTP/1.1\r\nHost: e\r\nAuthorization Bearer " + adminToken + "\r\n\r\n",
		// A bad request line.
		"POST /notify/" + adminToken + "\x01 HTTP/1.1\r\nHost: e\r\n\r\n",
	}
	for _, target := range []string{hostPort(b.url), hostPort(b.adminURL)} {
		for _, req := range requests {
			c := dialFrom(t, "", target)
			io.WriteString(c, req)
			io.Copy(io.Discard, c) // until the server closes
			c.Close()
		}
	}
	// The server logs after it closed the connection: wait for the line.
	var out string
	wait.For(t, "the malformed requests logged", func() (bool, string) {
		out = logs.String()
		return strings.Contains(out, "malformed") || strings.Contains(out, "http layer"), out
	})
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("a secret reached the log:\n%s", out)
		}
	}

	// A flood: 3 s of malformed requests from 8 connections at a time.
	before := logs.Len()
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	var sent sync.Map
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for time.Now().Before(stop) {
				c, err := net.Dial("tcp", hostPort(b.url))
				if err != nil {
					continue
				}
				io.WriteString(c, requests[n%len(requests)])
				io.Copy(io.Discard, c)
				c.Close()
				n++
			}
			sent.Store(w, n)
		}()
	}
	wg.Wait()
	total := 0
	sent.Range(func(_, v any) bool { total += v.(int); return true })
	grown := logs.Len() - before
	// 5 lines a second after a burst of 20, each well under 400 bytes.
	if limit := (20 + 5*4) * 400; grown > limit {
		t.Errorf("%d malformed requests in 3 s grew the log by %d bytes, want at most %d", total, grown, limit)
	}
	if total < 100 {
		t.Errorf("only %d malformed requests sent: the flood did not happen", total)
	}
	t.Logf("%d malformed requests in 3 s: log grew %d bytes", total, grown)
}

// Headers over the read buffer are 431, not 400.
func TestHeadersTooLarge(t *testing.T) {
	b := setup(t, options{})
	req := "POST /notify/acme HTTP/1.1\r\nHost: e\r\nX-Big: " + strings.Repeat("a", 16<<10) + "\r\nContent-Length: 2\r\n\r\n{}"
	code, answer := rawRequest(t, "", hostPort(b.url), req)
	if code != http.StatusRequestHeaderFieldsTooLarge || !strings.Contains(answer, `"code":"FAIL"`) {
		t.Errorf("16 KiB header: %d %s, want 431 JSON", code, answer)
	}
}

// A second webhook-signature header is refused, not ignored: which one was
// meant is ambiguous.
func TestRepeatedSignatureHeader(t *testing.T) {
	b := setup(t, options{})
	b.order(t, "O-rep", durable.PendingPay, 1999)
	payload := body("T-rep", "PAY_SUCCESS", "O-rep", 1999)
	h := signed(t, testSecret, time.Now(), payload)
	h.Add("webhook-signature", "v1,AAAA")
	before := b.counts(t)
	r := b.send(t, http.MethodPost, "/notify/acme", h, payload)
	if r.status != http.StatusUnauthorized {
		t.Errorf("two webhook-signature headers: %d %s, want 401", r.status, r.body)
	}
	if after := b.counts(t); after != before {
		t.Errorf("stored something: %+v -> %+v", before, after)
	}
}

// panickingReviews panics on ResolveReview: a handler bug, injected.
type panickingReviews struct{ admin.ReviewQueue }

func (panickingReviews) ResolveReview(context.Context, int64, string, string) (durable.Review, error) {
	panic("injected")
}

// The admin listener survives a panic in a handler and odd paths that once
// crashed it; both listeners keep serving.
func TestAdminSurvives(t *testing.T) {
	var logs edgetest.Log
	b := setup(t, options{logger: slog.New(slog.NewJSONHandler(&logs, nil)),
		reviews: func(q admin.ReviewQueue) admin.ReviewQueue { return panickingReviews{q} }})
	for _, path := range []string{"/review/resolve", "/review//resolve", "/review/0/resolve", "/review/x/resolve",
		"/review/99999999999999999999/resolve", "//review/1/resolve", "/review/1/resolve/"} {
		code, got := b.admin(t, "POST", path, adminToken, `{"resolution":"r","by":"me"}`)
		if code != http.StatusNotFound || got["code"] != "FAIL" {
			t.Errorf("POST %s: %d %v, want 404 JSON", path, code, got)
		}
	}
	code, got := b.admin(t, "POST", "/review/1/resolve", adminToken, `{"resolution":"r","by":"me"}`)
	if code != http.StatusInternalServerError || got["code"] != "FAIL" {
		t.Errorf("a panicking handler: %d %v, want 500 JSON", code, got)
	}
	if n := strings.Count(logs.String(), "panic in admin handler"); n != 1 {
		t.Errorf("the panic was logged %d times, want once", n)
	}
	if code, _ := b.admin(t, "GET", "/healthz", "", ""); code != 200 {
		t.Errorf("admin after the panic: %d", code)
	}
	b.order(t, "O-alive", durable.PendingPay, 1999)
	if r := b.post(t, body("T-alive", "PAY_SUCCESS", "O-alive", 1999)); r.status != 200 {
		t.Errorf("public listener after the admin panic: %d %s", r.status, r.body)
	}
	code, got = b.admin(t, "DELETE", "/review", adminToken, "")
	if code != http.StatusMethodNotAllowed || got["code"] != "FAIL" {
		t.Errorf("DELETE /review: %d %v, want 405 JSON", code, got)
	}
}

// The review API's edges: BIGINT ids, NUL, oversized and trailing bodies.
func TestReviewAPIEdges(t *testing.T) {
	b := setup(t, options{})
	for _, q := range []string{"2147483648", "1099511627776", "9223372036854775807"} {
		if code, got := b.admin(t, "GET", "/review?after_id="+q, adminToken, ""); code != 200 {
			t.Errorf("after_id=%s: %d %v", q, code, got)
		}
	}
	b.order(t, "O-amt", durable.PendingPay, 1999)
	b.post(t, body("T-amt", "PAY_SUCCESS", "O-amt", 1)) // an AMOUNT_MISMATCH row
	_, page := b.admin(t, "GET", "/review", adminToken, "")
	items, _ := page["items"].([]any)
	if len(items) != 1 {
		t.Fatalf("review rows: %v", page)
	}
	id := fmt.Sprint(int64(items[0].(map[string]any)["id"].(float64)))
	path := "/review/" + id + "/resolve"
	for name, c := range map[string]struct {
		body string
		code int
	}{
		"NUL in resolution": {`{"resolution":"a\u0000b","by":"me"}`, 400},
		"trailing data":     {`{"resolution":"r","by":"me"} {"x":1}`, 400},
		"trailing garbage":  {`{"resolution":"r","by":"me"}xyz`, 400},
	} {
		code, got := b.admin(t, "POST", path, adminToken, c.body)
		if code != c.code || got["code"] != "FAIL" {
			t.Errorf("%s: %d %v, want %d JSON", name, code, got, c.code)
		}
	}
	// 1 MiB announced: refused from the headers, before the body is read
	// (a client still writing would see the close as a reset).
	code, answer := rawRequest(t, "", hostPort(b.adminURL), "POST "+path+" HTTP/1.1\r\nHost: e\r\nAuthorization: Bearer "+adminToken+
		"\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n{\"resolution\":\"")
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(answer, `"code":"FAIL"`) {
		t.Errorf("1 MiB body: %d %s, want 413 JSON", code, answer)
	}
	if code, got := b.admin(t, "POST", path, adminToken, `{"resolution":"fixed","by":"me"}`); code != 200 {
		t.Errorf("a clean resolve after the refusals: %d %v", code, got)
	}
}

// Scraping /metrics hard while callbacks run never costs a callback its
// budget: the backlog gauges read through the operator pool, with a count
// that stays cheap at a million unpublished rows.
func TestMetricsScrapesNeverStarveCallbacks(t *testing.T) {
	// What keeps them apart is which pool an operator read runs on, and the
	// test watches that directly (pg_stat_activity, below). Timing is not
	// the property: the budget is one a machine busy with other tests
	// meets, and so is the scrapers' patience with a degraded answer.
	b := setup(t, options{budget: 10 * time.Second, dbMaxConns: 4})
	ctx := context.Background()
	if _, err := b.db.Exec(ctx, `INSERT INTO outbox (topic, order_no, payload)
		SELECT 'ORDER_PAID', 'O-old' || g, '{}'::jsonb FROM generate_series(1, 1000000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(ctx, `ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	const n = 400
	orders := make([]pgtemp.Order, n)
	for i := range orders {
		orders[i] = pgtemp.Order{No: fmt.Sprintf("O-scr%03d", i), Status: "PENDING_PAY", Amount: 1999, Currency: "CNY"}
	}
	if err := pgtemp.SeedOrders(ctx, b.dbURL, orders); err != nil {
		t.Fatal(err)
	}
	// Each scraper records its answered scrapes' end times; callbacks
	// start once every scraper has been answered, and the test asks that
	// every scraper was answered again while the callbacks ran: scrapes and
	// callbacks overlapped, and neither starved the other.
	stop := make(chan struct{})
	const scraperCount = 8
	var scrapeMu sync.Mutex
	scrapeEnds := make([][]time.Time, scraperCount)
	var scrapeFailures, scrapesDegraded atomic.Int64
	var scrapers sync.WaitGroup
	for w := range scraperCount {
		scrapers.Add(1)
		go func() {
			defer scrapers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := b.client.Get(b.adminURL + "/metrics")
				if err != nil {
					scrapeFailures.Add(1)
					continue
				}
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					scrapeFailures.Add(1)
					continue
				}
				// A read past the collector's timeout (a busy machine's
				// Postgres) leaves the gauges out and says so: degraded,
				// not failed. A scrape with neither failed.
				if !bytes.Contains(raw, []byte("notifyedge_outbox_pending ")) {
					if !bytes.Contains(raw, []byte("notifyedge_backlog_scrape_ok 0")) {
						scrapeFailures.Add(1)
					}
					scrapesDegraded.Add(1)
					continue
				}
				scrapeMu.Lock()
				scrapeEnds[w] = append(scrapeEnds[w], time.Now())
				scrapeMu.Unlock()
			}
		}()
	}
	answeredSince := func(since time.Time) (scrapers, scrapes int) {
		scrapeMu.Lock()
		defer scrapeMu.Unlock()
		for _, ends := range scrapeEnds {
			n := 0
			for _, e := range ends {
				if e.After(since) {
					n++
				}
			}
			if n > 0 {
				scrapers++
			}
			scrapes += n
		}
		return scrapers, scrapes
	}
	// Watch what the callback pool's sessions run: never an operator read.
	var onCallbackPool sync.Map
	scrapers.Add(1)
	go func() {
		defer scrapers.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			rows, err := b.db.Query(ctx, `SELECT query FROM pg_stat_activity
				WHERE application_name = 'notifyedge' AND state = 'active'
				  AND (query LIKE '%published_at IS NULL%' OR query LIKE '%notify_review%')`)
			if err != nil {
				continue
			}
			for rows.Next() {
				var q string
				if rows.Scan(&q) == nil {
					onCallbackPool.Store(q, true)
				}
			}
			rows.Close()
		}
	}()
	everyScraperSince := func(since time.Time) func() (bool, string) {
		return func() (bool, string) {
			w, _ := answeredSince(since)
			return w == scraperCount, fmt.Sprintf("%d of %d scrapers answered", w, scraperCount)
		}
	}
	wait.For(t, "every scraper answered before the callbacks", everyScraperSince(time.Time{}))
	callbacksStart := time.Now()
	jobs := make(chan int)
	var mu sync.Mutex
	var failures []string
	var workers sync.WaitGroup
	for range 16 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for i := range jobs {
				r := b.post(t, body(fmt.Sprintf("T-scr%03d", i), "PAY_SUCCESS", fmt.Sprintf("O-scr%03d", i), 1999))
				if r.status != 200 {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%d %s", r.status, r.body))
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	workers.Wait()
	// Every scraper is answered once more after the callbacks ended: a
	// scrape in flight then overlapped them.
	callbacksEnd := time.Now()
	wait.For(t, "every scraper answered after the callbacks", everyScraperSince(callbacksEnd))
	close(stop)
	scrapers.Wait()
	_, total := answeredSince(callbacksStart)
	if len(failures) > 0 {
		t.Errorf("%d of %d callbacks failed while /metrics was scraped, first: %s", len(failures), n, failures[0])
	}
	if bad := scrapeFailures.Load(); bad > 0 {
		t.Errorf("%d scrapes failed, or lacked the backlog gauges without saying so", bad)
	}
	onCallbackPool.Range(func(q, _ any) bool {
		t.Errorf("an operator read ran on the callback pool: %.120s", q)
		return true
	})
	if got := b.metric(t, `notifyedge_outbox_pending_exact`); got != 0 {
		t.Errorf("notifyedge_outbox_pending_exact = %v with a million rows waiting, want 0 (capped)", got)
	}
	t.Logf("%d callbacks, %d scrapes beside them (%d without the gauges in all)", n, total, scrapesDegraded.Load())
}
