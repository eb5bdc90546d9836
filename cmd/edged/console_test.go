package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/durable/durabletest"
)

const (
	consoleAdmin  = "console-admin-token"
	consoleOrders = "console-orders-token"
	// Markup in what callbacks carry: an order number (printable ASCII, no
	// spaces) and a free field of the body. Were any of it taken as markup,
	// window.pwned would be set.
	xssImgOrder    = `C-XSS-IMG`
	xssScriptOrder = `<script>window.pwned='script'</script>`
	xssNote        = `<img src=x onerror="window.pwned='img'"><b>bold</b> ` + "\u202egnp.exe"
)

// browser starts a headless Chromium for the test; it fails, naming the
// install command, when there is none.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is missing: run 'make deps' (or 'sudo apt-get install chromium')")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(cancelCtx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(cancelTimeout)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// do runs browser steps, failing the test with what was being done.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression in the page and decodes its value.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// js is a step that evaluates expr for its effect.
func js(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Evaluate[any](expr)(ctx, tg)
		return err
	})
}

// poll is a step that waits, 30 s at most, until expr is truthy in the
// page.
func poll(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[any](expr, chromedp.WithPollingTimeout(30*time.Second))(ctx, tg)
		return err
	})
}

// text is the text of the element sel selects.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return v
}

// screenshot writes the page to $NOTIFYEDGE_SCREENSHOTS/name.png when that
// is set (the README's pictures come from here).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("NOTIFYEDGE_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// consoleNode starts edged with both tokens and the generic channel acme,
// and records review rows through real callbacks: unknown orders, two of
// them named with markup that would run script if the page took it as
// markup.
func consoleNode(t *testing.T) (*Main, *pgxpool.Pool) {
	t.Helper()
	dbURL := durabletest.NewDatabase(t)
	m := startNode(t, nil, []string{"DATABASE_URL=" + dbURL, "EDGE_SECRET_ACME=" + secret,
		"EDGE_ADMIN_TOKEN=" + consoleAdmin, "EDGE_ORDERS_TOKEN=" + consoleOrders}, io.Discard)
	db, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	for i, order := range []string{"C-LATE-1", "C-LATE-2", xssImgOrder, xssScriptOrder} {
		body := fmt.Sprintf(`{"channel_txn_id":"CT-%d","event_type":"PAY_SUCCESS","order_no":%s,"amount":500,"currency":"CNY","note":%s}`,
			i, strconv.Quote(order), strconv.Quote(xssNote))
		resp, err := testClient.Do(signedPost(m.Addr(), secret, fmt.Sprintf("c-%d", i), body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM notify_review WHERE reason = 'UNKNOWN_ORDER'`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("%d UNKNOWN_ORDER review rows (%v), want 4", n, err)
	}
	return m, db
}

func reviewID(t *testing.T, db *pgxpool.Pool, orderNo string) int64 {
	t.Helper()
	var id int64
	if err := db.QueryRow(context.Background(), `SELECT id FROM notify_review WHERE order_no = $1`, orderNo).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// The console in a real browser: sign in, the queue, a row's body shown as
// text (its markup runs nothing), resolve, re-drive an UNKNOWN_ORDER once
// the order is registered, the order's timeline, the status page; the
// orders token sees the orders only; a form posted from another site
// changes nothing.
func TestConsoleInBrowser(t *testing.T) {
	m, db := consoleNode(t)
	ctx := browser(t)
	base := "http://" + m.AdminAddr() + "/ui/"

	// The page and its files carry the policy; no outside asset.
	resp, err := http.Get(base)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	if strings.Contains(string(page), "http") {
		t.Errorf("the page names an outside address:\n%s", page)
	}

	do(t, ctx, "signed out",
		chromedp.Navigate(base),
		chromedp.WaitVisible(chromedp.CSS(`#token`)))
	if shown := eval[string](t, ctx, `getComputedStyle(document.querySelector('#nav')).display`); shown != "none" {
		t.Errorf("signed out, the nav and Sign out show (display %q)", shown)
	}
	do(t, ctx, "sign in",
		chromedp.Navigate(base),
		chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), consoleAdmin),
		chromedp.Click(chromedp.CSS(`#signin-button`)),
		chromedp.WaitVisible(chromedp.CSS(`#reviews-body tr`)))
	rows := eval[int](t, ctx, `document.querySelectorAll('#reviews-body tr').length`)
	if rows != 4 {
		t.Fatalf("%d rows in the queue, want 4", rows)
	}
	screenshot(t, ctx, "console-reviews")

	// The rows named with markup: shown as text, and nothing ran.
	for _, order := range []string{xssImgOrder, xssScriptOrder} {
		id := reviewID(t, db, order)
		do(t, ctx, "open a row holding markup",
			chromedp.Click(chromedp.CSS(fmt.Sprintf(`#reviews-body tr[data-id="%d"] td:first-child`, id))),
			poll(fmt.Sprintf(`document.querySelector('#review-detail h3') && document.querySelector('#review-detail h3').textContent.startsWith('Review %d:')`, id)))
		raw := text(t, ctx, `#raw-body`)
		if !strings.Contains(raw, order) || !strings.Contains(raw, `<img src=x onerror=`) || !strings.Contains(raw, "<b>bold</b>") {
			t.Errorf("raw body shown as %q, want the markup as text", raw)
		}
		// A character that would reorder the text is shown as itself.
		if strings.ContainsRune(raw, '\u202e') || !strings.Contains(raw, "⟦U+202E⟧gnp.exe") {
			t.Errorf("raw body shown as %q, want U+202E visible", raw)
		}
	}
	pwned := eval[string](t, ctx, `String(window.pwned)`)
	injected := eval[int](t, ctx, `document.querySelectorAll('#main img, #main script, #main b').length`)
	if pwned != "undefined" || injected != 0 {
		t.Fatalf("a callback's markup ran: window.pwned=%s, %d injected elements", pwned, injected)
	}
	screenshot(t, ctx, "console-review-detail")

	// The reason filter.
	do(t, ctx, "filter by reason",
		chromedp.SetValue(chromedp.CSS(`#filter-state`), "all"),
		js(`document.querySelector('#filter-state').dispatchEvent(new Event('change'))`),
		poll(`location.hash.includes('state=all')`),
		chromedp.SetValue(chromedp.CSS(`#filter-reason`), "AMOUNT_MISMATCH"),
		js(`document.querySelector('#filter-reason').dispatchEvent(new Event('change'))`),
		poll(`document.querySelector('#reviews-status') && document.querySelector('#reviews-status').textContent === 'No rows.'`),
		js(`location.hash = '#/reviews?state=all&reason=UNKNOWN_ORDER'`),
		poll(`document.querySelectorAll('#reviews-body tr').length === 4`))
	reasons := eval[[]string](t, ctx, `Array.from(document.querySelectorAll('#reviews-body tr td:nth-child(3)'), td => td.textContent)`)
	if len(reasons) != 4 || slices.ContainsFunc(reasons, func(r string) bool { return r != "UNKNOWN_ORDER" }) {
		t.Errorf("reasons shown %v", reasons)
	}

	// Resolve one row with a note and a name.
	late1 := reviewID(t, db, "C-LATE-1")
	do(t, ctx, "resolve",
		js(`location.hash = '#/reviews?state=open'`),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#reviews-body tr[data-id="%d"] td:first-child`, late1))),
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`#reviews-body tr[data-id="%d"] td:first-child`, late1))),
		chromedp.WaitVisible(chromedp.CSS(`#resolution`)),
		chromedp.SendKeys(chromedp.CSS(`#resolution`), "refunded by hand"),
		chromedp.SendKeys(chromedp.CSS(`#resolved-by`), "ops-alice"),
		chromedp.Click(chromedp.CSS(`#resolve-button`)),
		poll(fmt.Sprintf(`!document.querySelector('#reviews-body tr[data-id="%d"]')`, late1)))
	var resolution, by string
	if err := db.QueryRow(context.Background(), `SELECT resolution, resolved_by FROM notify_review WHERE id = $1`, late1).Scan(&resolution, &by); err != nil ||
		resolution != "refunded by hand" || by != "ops-alice" {
		t.Fatalf("resolved as %q by %q (%v)", resolution, by, err)
	}

	// Re-drive the other after registering its order: applied, PAID.
	if code, body := adminDo(t, consoleOrders, "PUT", "http://"+m.AdminAddr()+"/orders/C-LATE-2", `{"amount":500,"currency":"CNY"}`); code != 201 {
		t.Fatalf("PUT: %d %s", code, body)
	}
	late2 := reviewID(t, db, "C-LATE-2")
	do(t, ctx, "re-drive",
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`#reviews-body tr[data-id="%d"] td:first-child`, late2))),
		chromedp.WaitVisible(chromedp.CSS(`#redrive-button`)),
		chromedp.SendKeys(chromedp.CSS(`#resolved-by`), "ops-bob"),
		chromedp.Click(chromedp.CSS(`#redrive-button`)),
		poll(`document.querySelector('#review-result').textContent !== ''`))
	result := text(t, ctx, `#review-result`)
	if !strings.Contains(result, "applied") || !strings.Contains(result, "PAID") {
		t.Fatalf("re-drive shown as %q", result)
	}

	// The order's timeline.
	do(t, ctx, "order timeline",
		js(`location.hash = '#/order/C-LATE-2'`),
		chromedp.WaitVisible(chromedp.CSS(`#order-claims`)))
	status, claims, events := text(t, ctx, `#order-status`), text(t, ctx, `#order-claims`), text(t, ctx, `#order-events`)
	if status != "PAID" || !strings.Contains(claims, "acme:CT-1:PAY_SUCCESS") || !strings.Contains(events, "ORDER_PAID") {
		t.Fatalf("timeline: status %q, claims %q, events %q", status, claims, events)
	}
	// A PAID order is offered Ship, not Close.
	if n := eval[int](t, ctx, `document.querySelectorAll('#order-close, #order-reconcile').length`); n != 0 {
		t.Errorf("a PAID order is offered Close or Ask (%d buttons)", n)
	}
	do(t, ctx, "ship", chromedp.Click(chromedp.CSS(`#order-ship`)),
		poll(`document.querySelector('#order-result') && document.querySelector('#order-result').textContent.includes('SHIPPED')`))
	screenshot(t, ctx, "console-order")

	// Amounts in the currency's minor units: 1000 JPY is 1000, 1000 KWD
	// fils is 1.000.
	for no, c := range map[string]struct{ body, want string }{
		"C-JPY": {`{"amount":1000,"currency":"JPY"}`, "1000 JPY"},
		"C-KWD": {`{"amount":1000,"currency":"KWD"}`, "1.000 KWD"},
	} {
		if code, body := adminDo(t, consoleOrders, "PUT", "http://"+m.AdminAddr()+"/orders/"+no, c.body); code != 201 {
			t.Fatalf("PUT %s: %d %s", no, code, body)
		}
		do(t, ctx, "order "+no, js(`location.hash = '#/order/`+no+`'`),
			poll(`document.querySelector('#order-title') && document.querySelector('#order-title').textContent === '`+no+`'`))
		if got := text(t, ctx, `#order-amount`); !strings.HasPrefix(got, c.want) {
			t.Errorf("%s shown as %q, want %q", no, got, c.want)
		}
	}
	// A hash typed by hand that does not decode stops nothing.
	do(t, ctx, "a bad hash",
		js(`location.hash = '#/order/%'`),
		chromedp.WaitVisible(chromedp.CSS(`#order-no`)),
		js(`location.hash = '#/order/C-JPY'`),
		poll(`document.querySelector('#order-title') && document.querySelector('#order-title').textContent === 'C-JPY'`))

	// The status page.
	do(t, ctx, "status",
		js(`location.hash = '#/status'`),
		chromedp.WaitVisible(chromedp.CSS(`#outcomes table`)))
	if o := text(t, ctx, `#outcomes`); strings.Contains(o, "last 0.0 min") {
		t.Errorf("the first look at the outcomes claims a window: %q", o)
	}
	ready := text(t, ctx, `#readiness`)
	if !strings.Contains(ready, "postgres") || !strings.Contains(ready, "ok") {
		t.Errorf("readiness shown as %q", ready)
	}
	if chans := text(t, ctx, `#channels`); !strings.Contains(chans, "acme") {
		t.Errorf("channels shown as %q", chans)
	}
	if outcomes := text(t, ctx, `#outcomes`); !strings.Contains(outcomes, "unknown_order") {
		t.Errorf("outcomes shown as %q", outcomes)
	}
	screenshot(t, ctx, "console-status")

	// The Bills page: the runs, then one run with both sides and its
	// items, each linked to its order; an order number holding markup is
	// text.
	for _, q := range []string{
		`INSERT INTO bill_run (channel, bill_date, state, fetched_at, bill_payments, bill_paid, bill_refunds, bill_refunded, bill_fees,
		    ledger_payments, ledger_paid, ledger_refunds, ledger_refunded, matched, channel_only, ledger_only, amount_mismatch, pending)
		 VALUES ('acme', '2026-12-05', 'ok', now(), 4, 7996, 1, 500, 48, 3, 5997, 0, 0, 2, 2, 1, 1, 1),
		        ('acme', '2026-12-04', 'missing', now(), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)`,
		`INSERT INTO bill_item (channel, bill_date, category, kind, trade, refund_id, order_no, bill_amount, ledger_amount, recorded_on, action, detail) VALUES
		 ('acme', '2026-12-05', 'channel_only', 'payment', 'acme:T-LOST', '', 'C-LOST', 1999, NULL, NULL, 'applied', 'PAID'),
		 ('acme', '2026-12-05', 'channel_only', 'refund', 'acme:T-PAID', 'RF-1', 'C-PAID', 500, NULL, NULL, 'applied', 'PAID'),
		 ('acme', '2026-12-05', 'amount_mismatch', 'payment', 'acme:T-DIFF', '', 'C-DIFF', 999, 1999, NULL, 'review', 'BILL_MISMATCH'),
		 ('acme', '2026-12-05', 'ledger_only', 'payment', 'acme:T-GONE', '', '<img src=x onerror=window.pwned=1>', NULL, 1999, '2026-12-04', 'review', 'NOT_IN_BILL')`,
	} {
		if _, err := db.Exec(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
	do(t, ctx, "bills",
		js(`location.hash = '#/bills?from=2026-12-01&to=2026-12-06'`),
		chromedp.WaitVisible(chromedp.CSS(`#bills-body tr`)))
	if runs := eval[int](t, ctx, `document.querySelectorAll('#bills-body tr').length`); runs != 2 {
		t.Errorf("%d runs listed, want 2", runs)
	}
	do(t, ctx, "a bill run",
		chromedp.Click(chromedp.CSS(`#bills-body tr:first-child td:first-child a`)),
		chromedp.WaitVisible(chromedp.CSS(`#bill-items`)))
	sides, items := text(t, ctx, `#bill-sides`), text(t, ctx, `#bill-items`)
	if !strings.Contains(sides, "79.96") || !strings.Contains(sides, "59.97") || !strings.Contains(items, "BILL_MISMATCH") ||
		!strings.Contains(items, "<img src=x onerror=window.pwned=1>") {
		t.Errorf("bill run shown as sides %q, items %q", sides, items)
	}
	if links := eval[int](t, ctx, `document.querySelectorAll('#bill-items a[href^="#/order/"]').length`); links != 4 {
		t.Errorf("%d items linked to their orders, want 4", links)
	}
	if pwned := eval[string](t, ctx, `String(window.pwned)`); pwned != "undefined" {
		t.Fatal("an order number's markup ran on the Bills page")
	}
	screenshot(t, ctx, "console-bills")

	// A form posted from another site reaches the endpoint without the
	// token: 401, and the row stays open.
	target := reviewID(t, db, xssImgOrder)
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<form id=f method=POST action="http://%s/review/%d/resolve" enctype="text/plain">
<input name='{"resolution":"x","by":"evil","pad":"' value='"}'></form><script>document.getElementById('f').submit()</script>`,
			m.AdminAddr(), target)
	}))
	defer evil.Close()
	do(t, ctx, "cross-site form post",
		chromedp.Navigate(evil.URL),
		poll(`location.href.includes('/resolve')`))
	var open int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM notify_review WHERE resolved_at IS NULL`).Scan(&open); err != nil || open != 2 {
		t.Fatalf("%d open rows after the cross-site post (%v), want 2", open, err)
	}

	// The orders token: orders only.
	do(t, ctx, "orders token",
		chromedp.Navigate(base),
		js(`sessionStorage.clear(); location.hash = '#/signin'; location.reload()`),
		chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), consoleOrders),
		chromedp.Click(chromedp.CSS(`#signin-button`)),
		chromedp.WaitVisible(chromedp.CSS(`#order-no`)))
	reviewsHidden := eval[bool](t, ctx, `document.querySelector('#nav-reviews').hidden`)
	if !reviewsHidden {
		t.Error("the orders token is offered the review queue")
	}
}

// A page of 50 reviews over a table of 100,000: the time from asking to
// the rows in the page, as the browser measures it (fetch, JSON, DOM),
// median of 7. The page's target is 200 ms; the bound adds a loaded machine's
// margin; the figure is logged.
func TestConsoleBigQueue(t *testing.T) {
	m, db := consoleNode(t)
	if _, err := db.Exec(context.Background(), `INSERT INTO notify_review (biz_key, order_no, reason, payload_hash, raw_body, created_at)
		SELECT 'acme:BIG-' || g || ':PAY_SUCCESS', 'BIG-' || g, (ARRAY['AMOUNT_MISMATCH','UNKNOWN_ORDER','DUPLICATE_PAYMENT'])[1 + g % 3],
		       repeat('a', 64), '{"channel_txn_id":"BIG-' || g || '","event_type":"PAY_SUCCESS","order_no":"BIG-' || g || '","amount":500,"currency":"CNY"}',
		       now() - g * interval '1 second'
		  FROM generate_series(1, 100000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(context.Background(), `ANALYZE notify_review`); err != nil {
		t.Fatal(err)
	}
	ctx := browser(t)
	do(t, ctx, "sign in",
		chromedp.Navigate("http://"+m.AdminAddr()+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), consoleAdmin),
		chromedp.Click(chromedp.CSS(`#signin-button`)),
		chromedp.WaitVisible(chromedp.CSS(`#reviews-body tr`)))
	var times []float64
	for i, hash := range []string{"state=open", "state=all", "state=open&reason=UNKNOWN_ORDER", "state=all&after=50000", "state=open", "state=all&reason=DUPLICATE_PAYMENT", "state=open&after=99000"} {
		do(t, ctx, "page "+hash,
			js(`delete document.body.dataset.reviewsMs; location.hash = '#/reviews?`+hash+`&n=`+strconv.Itoa(i)+`'`),
			poll(`document.body.dataset.reviewsMs !== undefined`))
		ms := eval[string](t, ctx, `document.body.dataset.reviewsMs`)
		rows := eval[int](t, ctx, `document.querySelectorAll('#reviews-body tr').length`)
		if rows != 50 {
			t.Fatalf("%s: %d rows, want 50", hash, rows)
		}
		v, err := strconv.ParseFloat(ms, 64)
		if err != nil {
			t.Fatal(err)
		}
		times = append(times, v)
	}
	slices.Sort(times)
	t.Logf("a page of 50 reviews of 100,000: median %.1f ms, max %.1f ms (%v)", times[len(times)/2], times[len(times)-1], times)
	if times[len(times)/2] > 2000 {
		t.Errorf("median %.1f ms for a page of 50 reviews", times[len(times)/2])
	}
}

// The admin listener's HTTP edges: /ui redirects by path (never to the
// Host header's site); an order number that decodes to a console path is
// an order number; JSON answers are no-store and nosniff; PATCH refuses
// "channel":null; POST .../reconcile refuses a body.
func TestAdminHTTPEdges(t *testing.T) {
	m, _ := consoleNode(t)
	base := "http://" + m.AdminAddr()
	req, _ := http.NewRequest("GET", base+"/ui", nil)
	req.Host = "evil.example"
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != 301 || loc != "/ui/" {
		t.Errorf("/ui: %d Location %q, want 301 /ui/", resp.StatusCode, loc)
	}
	code, body := adminDo(t, consoleOrders, "GET", base+"/orders/..%2Fui%2F", "")
	if code != 404 || !strings.Contains(body, "no such order") {
		t.Errorf("order ../ui/: %d %.80s, want the orders API's 404", code, body)
	}
	req, _ = http.NewRequest("GET", base+"/review", nil)
	req.Header.Set("Authorization", "Bearer "+consoleAdmin)
	resp, err = testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("/review headers: Cache-Control %q, X-Content-Type-Options %q", resp.Header.Get("Cache-Control"), resp.Header.Get("X-Content-Type-Options"))
	}
	if code, body := adminDo(t, consoleOrders, "PUT", base+"/orders/C-NULL", `{"amount":100,"currency":"CNY","channel":null}`); code != 400 {
		t.Errorf("PUT with channel null: %d %s, want 400", code, body)
	}
	adminDo(t, consoleOrders, "PUT", base+"/orders/C-NULL", `{"amount":100,"currency":"CNY"}`)
	if code, body := adminDo(t, consoleOrders, "PATCH", base+"/orders/C-NULL", `{"amount":100,"currency":"CNY","channel":null}`); code != 400 {
		t.Errorf("PATCH with channel null: %d %s, want 400", code, body)
	}
	if code, body := adminDo(t, consoleOrders, "POST", base+"/orders/C-NULL/reconcile", `{"force":true}`); code != 400 {
		t.Errorf("reconcile with a body: %d %s, want 400", code, body)
	}
}
