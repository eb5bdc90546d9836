package edge_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/admin"
	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/edgetest"
	"github.com/notifyedge/notifyedge/edge/readiness"
)

// authorityFunc is a fake of edge's own Authority interface.
type authorityFunc func(ctx context.Context, n durable.Notification) (durable.Result, error)

func (f authorityFunc) Process(ctx context.Context, n durable.Notification) (durable.Result, error) {
	return f(ctx, n)
}

func (f authorityFunc) RecordReview(context.Context, durable.Notification, durable.ReviewReason) error {
	return nil
}

func TestPanicIs500AndLogged(t *testing.T) {
	acme, _ := channel.NewGeneric(channel.GenericConfig{Name: "acme", Secrets: []string{testSecret}})
	var logs edgetest.Log
	srv, err := edge.New(edge.Config{
		Channels:  []channel.Channel{acme},
		Authority: authorityFunc(func(context.Context, durable.Notification) (durable.Result, error) { panic("boom") }),
		Logger:    slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())
	b := &bundle{url: "http://" + ln.Addr().String(), client: http.DefaultClient}
	got := b.post(t, body("T-p", "PAY_SUCCESS", "O-p", 1))
	if got.status != 500 || got.body != `{"code":"FAIL","message":"internal error; retry"}` {
		t.Errorf("got %d %s", got.status, got.body)
	}
	if !strings.Contains(logs.String(), `"panic":"boom"`) {
		t.Errorf("panic not logged: %s", logs.String())
	}
	// The server still serves after a panic.
	if again := b.post(t, body("T-p", "PAY_SUCCESS", "O-p", 1)); again.status != 500 {
		t.Errorf("after a panic: %d", again.status)
	}
}

// Postgres down, and no cache Redis to ask the other nodes whether they
// lost it too: the node leaves rotation.
func TestReadyzWhenPostgresIsDown(t *testing.T) {
	b := setup(t, options{})
	checker := readiness.New(readiness.Config{Postgres: func(context.Context) error { return errors.New("connection refused") }})
	checker.Probe(context.Background())
	admin, err := admin.New(admin.Config{Metrics: edge.NewMetrics(nil), Deps: admin.Deps{Reviews: b.store}, Readiness: checker})
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	go admin.Serve(ln)
	defer admin.Shutdown(context.Background())
	resp, err := http.Get("http://" + ln.Addr().String() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(raw), `"postgres":"down","outage":"unknown"`) {
		t.Errorf("got %d %s", resp.StatusCode, raw)
	}
}

// A drain lets the request in flight finish: it waits on a row lock the
// test releases only after Shutdown has begun.
func TestShutdownLetsInFlightFinish(t *testing.T) {
	b := setup(t, options{})
	b.order(t, "O-g", durable.PendingPay, 1999)
	ctx := context.Background()
	release := b.lockOrder(t, "O-g")
	answered := b.postAsync(t, body("T-g", "PAY_SUCCESS", "O-g", 1999))
	durabletest.WaitLockWaiters(t, b.db, 1, "%")
	shut := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		shut <- b.server.Shutdown(sctx)
	}()
	wait.For(t, "draining once Shutdown began", func() (bool, string) {
		return b.server.Draining(), "not draining"
	})
	release()
	if got := <-answered; got.status != 200 || !strings.Contains(got.body, `"applied"`) {
		t.Errorf("in-flight request: %d %s", got.status, got.body)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// The net/http adapter runs the same flow: same answers, byte for byte.
func TestNetHTTPAdapterSameAnswers(t *testing.T) {
	b := setup(t, options{})
	b.order(t, "O-h", durable.PendingPay, 1999)
	hs := httptest.NewServer(b.server)
	defer hs.Close()
	nb := &bundle{url: hs.URL, client: hs.Client()}
	first := nb.post(t, body("T-h", "PAY_SUCCESS", "O-h", 1999))
	viaFast := b.post(t, body("T-h", "PAY_SUCCESS", "O-h", 1999))
	if first.status != 200 || first.body != `{"code":"SUCCESS","outcome":"applied","status":"PAID"}` || !viaFast.replayed || viaFast.body != first.body {
		t.Errorf("net/http %+v, then fasthttp %+v", first, viaFast)
	}
	if again := nb.post(t, body("T-h", "PAY_SUCCESS", "O-h", 1999)); !again.replayed || again.body != first.body {
		t.Errorf("net/http replay %+v", again)
	}
	if got := nb.send(t, "GET", "/notify/acme", http.Header{}, ""); got.status != 405 {
		t.Errorf("GET: %d", got.status)
	}
	big := strings.Repeat("x", 70<<10)
	if got := nb.send(t, "POST", "/notify/acme", signed(t, testSecret, time.Now(), big), big); got.status != 413 {
		t.Errorf("too large: %d %s", got.status, got.body)
	}
}

// An admin listener started before Postgres answers: ready "starting", 503
// where Postgres is needed (after the token check), until its dependencies
// are attached whole; then it serves them.
func TestAdminStartingUntilAttached(t *testing.T) {
	b := setup(t, options{})
	a, err := admin.New(admin.Config{Token: adminToken, OrdersToken: ordersToken, Metrics: edge.NewMetrics(nil),
		Readiness: readiness.New(readiness.Config{Postgres: b.store.Ping})})
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	go a.Serve(ln)
	defer a.Shutdown(context.Background())
	b.adminURL = "http://" + ln.Addr().String()
	if code, got := b.admin(t, "GET", "/readyz", "", ""); code != 503 || got["postgres"] != "starting" {
		t.Errorf("readyz before Attach: %d %v", code, got)
	}
	for _, c := range []struct{ method, path, token string }{
		{"GET", "/review", adminToken}, {"GET", "/orders/O-1", ordersToken}, {"POST", "/cache/epoch", adminToken},
	} {
		if code, got := b.admin(t, c.method, c.path, c.token, ""); code != 503 || !strings.Contains(fmt.Sprint(got["message"]), "starting") {
			t.Errorf("%s %s before Attach: %d %v, want 503 starting", c.method, c.path, code, got)
		}
	}
	if code, _ := b.admin(t, "GET", "/review", "", ""); code != 401 {
		t.Errorf("no token before Attach: %d, want 401", code)
	}
	if err := a.Attach(admin.Deps{Orders: b.store, Reviews: b.store}); err != nil {
		t.Fatal(err)
	}
	if code, got := b.admin(t, "GET", "/readyz", "", ""); code != 200 || got["postgres"] != "ok" {
		t.Errorf("readyz after Attach: %d %v", code, got)
	}
	if code, _ := b.admin(t, "GET", "/review", adminToken, ""); code != 200 {
		t.Errorf("review after Attach: %d", code)
	}
	if code, _ := b.admin(t, "POST", "/cache/epoch", adminToken, ""); code != 404 {
		t.Errorf("cache epoch attached without a bumper: %d, want 404", code)
	}
}
