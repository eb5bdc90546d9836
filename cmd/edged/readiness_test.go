package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// pgProxy creates a migrated database on the shared cluster and puts an
// in-process toxiproxy in front of the cluster's TCP port: it returns the
// proxy, the database's URL through it and its URL direct.
func pgProxy(t *testing.T) (p *toxiproxy.Proxy, via, direct string) {
	t.Helper()
	c := durabletest.Shared(t)
	name := durabletest.CreateDatabase(t, true)
	p = newProxy(t, c.TCPAddr())
	return p, pgtemp.TCPURL(p.Listen, name), pgtemp.TCPURL(c.TCPAddr(), name)
}

// newProxy starts an in-process toxiproxy in front of upstream.
func newProxy(t *testing.T, upstream string) *toxiproxy.Proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "postgres", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// cut holds every byte bound for Postgres through p, on the connections
// already open and on new ones: a ping then waits for its timeout.
func cut(t *testing.T, p *toxiproxy.Proxy) {
	t.Helper()
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(
		`{"name":"cut","type":"timeout","stream":"upstream","attributes":{"timeout":0}}`)); err != nil {
		t.Fatal(err)
	}
}

// mend lets the bytes through p again.
func mend(t *testing.T, p *toxiproxy.Proxy) {
	t.Helper()
	if err := p.Toxics.RemoveToxic(context.Background(), "cut"); err != nil {
		t.Fatal(err)
	}
}

// readyzOf reads a node's /readyz: its status and body.
func readyzOf(t *testing.T, m *Main) (int, map[string]any) {
	t.Helper()
	resp, err := testClient.Get("http://" + m.AdminAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// payOrder is the signed body of a payment of order no.
func payOrder(no string) string {
	return fmt.Sprintf(`{"channel_txn_id":"T-%s","event_type":"PAY_SUCCESS","order_no":%q,"amount":5,"currency":"CNY"}`, no, no)
}

// sendTo posts body to node m under webhook-id id: its status, Retry-After
// and whether it was a replay.
func sendTo(t *testing.T, m *Main, id, body string) (status int, retryAfter string, replayed bool) {
	t.Helper()
	resp, err := testClient.Do(signedPost(m.Addr(), secret, id, body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("Idempotent-Replayed") == "true"
}

// Two nodes sharing the cache's Redis. When only one of them loses
// Postgres, it leaves rotation ("outage":"node", 503) and the other stays.
// When both lose it, both stay in rotation ("outage":"shared", 200): a
// duplicate of a payment already applied gets its stored answer from the
// cache, a first delivery the node's own 503 with Retry-After. Postgres
// back, both are "ok".
func TestReadinessSharedOutageAgainstNodeOwn(t *testing.T) {
	rs := persistentRedis(t)
	proxyA, viaA, dbURL := pgProxy(t)
	c := durabletest.Shared(t)
	proxyB := newProxy(t, c.TCPAddr())
	viaB := strings.Replace(viaA, proxyA.Listen, proxyB.Listen, 1)
	if err := pgtemp.SeedOrders(context.Background(), dbURL, []pgtemp.Order{
		{No: "O-r1", Status: "PENDING_PAY", Amount: 5, Currency: "CNY"},
		{No: "O-r2", Status: "PENDING_PAY", Amount: 5, Currency: "CNY"},
	}); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	env := []string{"REDIS_URL=" + rs.URL(), "EDGE_SECRET_ACME=" + secret}
	a := runMain(t, quiet, append(env, "DATABASE_URL="+viaA)...)
	b := runMain(t, quiet, append(env, "DATABASE_URL="+viaB)...)
	if status, _, _ := sendTo(t, a, "m1", payOrder("O-r1")); status != 200 {
		t.Fatalf("first delivery: %d", status)
	}

	// Node a alone loses Postgres.
	cut(t, proxyA)
	wait.For(t, "node a out of rotation, node b in", func() (bool, string) {
		codeA, bodyA := readyzOf(t, a)
		codeB, bodyB := readyzOf(t, b)
		return codeA == 503 && bodyA["postgres"] == "down" && bodyA["outage"] == "node" &&
			codeB == 200 && bodyB["postgres"] == "ok", fmt.Sprint("a: ", codeA, bodyA, " b: ", codeB, bodyB)
	})

	// Both lose it.
	cut(t, proxyB)
	wait.For(t, "both nodes in rotation through the shared outage", func() (bool, string) {
		codeA, bodyA := readyzOf(t, a)
		codeB, bodyB := readyzOf(t, b)
		return codeA == 200 && bodyA["outage"] == "shared" && codeB == 200 && bodyB["outage"] == "shared",
			fmt.Sprint("a: ", codeA, bodyA, " b: ", codeB, bodyB)
	})
	for _, n := range []*Main{a, b} {
		if status, _, replayed := sendTo(t, n, "m2", payOrder("O-r1")); status != 200 || !replayed {
			t.Errorf("a duplicate of an applied payment through the outage: %d, replayed %v; want 200 from the cache", status, replayed)
		}
	}
	if status, retry, _ := sendTo(t, b, "m3", payOrder("O-r2")); status != 503 || retry == "" {
		t.Errorf("a first delivery through the outage: %d, Retry-After %q; want 503 with Retry-After", status, retry)
	}

	// Postgres back.
	mend(t, proxyA)
	mend(t, proxyB)
	wait.For(t, "both nodes ok again", func() (bool, string) {
		codeA, bodyA := readyzOf(t, a)
		codeB, bodyB := readyzOf(t, b)
		return codeA == 200 && bodyA["postgres"] == "ok" && codeB == 200 && bodyB["postgres"] == "ok",
			fmt.Sprint("a: ", codeA, bodyA, " b: ", codeB, bodyB)
	})
	if status, _, _ := sendTo(t, b, "m4", payOrder("O-r2")); status != 200 {
		t.Errorf("the first delivery retried after the outage: %d", status)
	}
}

// /readyz answers at once while Postgres does not answer at all (every
// byte to it held: a ping would wait for its timeout): it reads the
// probes' last result. 100 ms is the bound load balancers are set up
// with; the test allows 500 ms on a loaded machine, still half of the
// ping's timeout it would otherwise wait for.
func TestReadyzAnswersAtOnceWhilePostgresHangs(t *testing.T) {
	proxy, via, _ := pgProxy(t)
	m := runMain(t, slog.New(slog.NewTextHandler(io.Discard, nil)), "DATABASE_URL="+via, "EDGE_SECRET_ACME="+secret)
	cut(t, proxy)
	t.Cleanup(func() { mend(t, proxy) }) // before edged closes: it closes its pools
	wait.For(t, "readyz to report Postgres down", func() (bool, string) {
		code, body := readyzOf(t, m)
		return code == 503 && body["postgres"] == "down", fmt.Sprint(code, body)
	})
	for i := range 10 {
		start := time.Now()
		readyzOf(t, m)
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Errorf("readyz %d took %v while Postgres hangs", i, took)
		}
	}
}
