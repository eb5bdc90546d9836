package edge_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/edge"
)

// benchEdge serves the edge over an in-memory listener (no sockets) in
// front of a real Postgres with fsync on, and returns a client for it.
func benchEdge(b *testing.B) (*fasthttp.Client, string) {
	b.Helper()
	dbURL := durabletest.NewDatabase(b)
	store, err := durable.New(context.Background(), durable.Config{URL: dbURL, MaxConns: 40, MinConns: 40})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(store.Close)
	acme, _ := edge.NewGeneric(edge.GenericConfig{Name: "acme", Secrets: []string{testSecret}})
	srv, err := edge.New(edge.Config{Channels: []edge.Channel{acme}, Authority: store, Budget: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	ln := fasthttputil.NewInmemoryListener()
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Shutdown(context.Background()) })
	return &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }, MaxConnsPerHost: 512}, dbURL
}

// signedRequests prepares n signed requests for orders B-0.. of one run.
func signedRequests(b *testing.B, dbURL string, n int) [][]string {
	b.Helper()
	orders := make([]durabletest.Order, n)
	reqs := make([][]string, n)
	now := time.Now().Unix()
	for i := range n {
		no := fmt.Sprintf("B-%d", i)
		orders[i] = durabletest.Order{No: no, Status: "PENDING_PAY", Amount: 1999, Currency: "CNY"}
		p := body("TX"+no, "PAY_SUCCESS", no, 1999)
		id := fmt.Sprintf("msg_%d", i)
		sig, _ := edge.SignWebhook(testSecret, id, now, []byte(p))
		reqs[i] = []string{p, id, fmt.Sprint(now), sig}
	}
	if err := durabletest.SeedOrders(context.Background(), dbURL, orders); err != nil {
		b.Fatal(err)
	}
	return reqs
}

// send delivers one prepared request.
func send(c *fasthttp.Client, req *fasthttp.Request, resp *fasthttp.Response, r []string) error {
	req.Reset()
	req.SetRequestURI("http://edge/notify/acme")
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.Header.Set("webhook-id", r[1])
	req.Header.Set("webhook-timestamp", r[2])
	req.Header.Set("webhook-signature", r[3])
	req.SetBodyString(r[0])
	if err := c.Do(req, resp); err != nil {
		return err
	}
	if resp.StatusCode() != 200 {
		return fmt.Errorf("%d %s", resp.StatusCode(), resp.Body())
	}
	return nil
}

func runHandler(b *testing.B, c *fasthttp.Client, reqs [][]string) {
	var next atomic.Int64
	var failed atomic.Bool
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		for pb.Next() && !failed.Load() {
			if err := send(c, req, resp, reqs[int(next.Add(1)-1)%len(reqs)]); err != nil && !failed.Swap(true) {
				b.Error(err)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// BenchmarkApplied: first deliveries through the whole handler (Postgres).
func BenchmarkApplied(b *testing.B) {
	c, dbURL := benchEdge(b)
	runHandler(b, c, signedRequests(b, dbURL, b.N))
}

// BenchmarkReplay: duplicates through the whole handler, answered by
// Postgres (the cache is off).
func BenchmarkReplay(b *testing.B) {
	c, dbURL := benchEdge(b)
	reqs := signedRequests(b, dbURL, 1000)
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	for _, r := range reqs { // apply each once: from here on, all are duplicates
		if err := send(c, req, resp, r); err != nil {
			b.Fatal(err)
		}
	}
	runHandler(b, c, reqs)
}
