package edge_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/channel"
)

// benchEdge serves the edge over an in-memory listener (no sockets) in
// front of a real Postgres with fsync on (and, with cache, a real
// redis-server), and returns a client for it.
func benchEdge(b *testing.B, opts ...benchOpt) (*fasthttp.Client, string) {
	c, dbURL, _ := benchEdgeCounted(b, opts...)
	return c, dbURL
}

type benchOpt int

const withCache benchOpt = 1

func benchEdgeCounted(b *testing.B, opts ...benchOpt) (*fasthttp.Client, string, *queryCounter) {
	b.Helper()
	dbURL := durabletest.NewDatabase(b)
	queries := &queryCounter{}
	store, err := durable.New(context.Background(), durable.Config{URL: dbURL, MaxConns: 40, MinConns: 40, Tracer: queries})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(store.Close)
	var cache edge.Cache
	for _, o := range opts {
		if o == withCache {
			srv, err := claimcachetest.Start()
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(srv.Stop)
			client, err := claimcache.NewClient(srv.URL(), 25*time.Millisecond, 128)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { client.Close() })
			cc, err := claimcache.New(claimcache.Config{Client: client, PendingTTL: 5 * time.Second, LocalEntries: 100_000})
			if err != nil {
				b.Fatal(err)
			}
			cache = cc
		}
	}
	acme, _ := channel.NewGeneric(channel.GenericConfig{Name: "acme", Secrets: []string{testSecret}})
	srv, err := edge.New(edge.Config{Channels: []channel.Channel{acme}, Authority: store, Cache: cache, Budget: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	ln := fasthttputil.NewInmemoryListener()
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Shutdown(context.Background()) })
	return &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }, MaxConnsPerHost: 512}, dbURL, queries
}

// signedRequests prepares n signed requests for orders B-0.. of one run.
func signedRequests(b *testing.B, dbURL string, n int) [][]string {
	return signedRequestsFrom(b, dbURL, "B", n)
}

var benchRun atomic.Int64

func signedRequestsFrom(b *testing.B, dbURL, prefix string, n int) [][]string {
	b.Helper()
	orders := make([]pgtemp.Order, n)
	reqs := make([][]string, n)
	now := time.Now().Unix()
	for i := range n {
		no := fmt.Sprintf("%s%d-%d", prefix, benchRun.Add(1), i)
		orders[i] = pgtemp.Order{No: no, Status: "PENDING_PAY", Amount: 1999, Currency: "CNY"}
		p := body("TX"+no, "PAY_SUCCESS", no, 1999)
		id := fmt.Sprintf("msg_%d", i)
		sig, _ := channel.SignWebhook(testSecret, id, now, []byte(p))
		reqs[i] = []string{p, id, fmt.Sprint(now), sig}
	}
	if err := pgtemp.SeedOrders(context.Background(), dbURL, orders); err != nil {
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

// applyAll delivers each request once.
func applyAll(b *testing.B, c *fasthttp.Client, reqs [][]string) {
	b.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	for _, r := range reqs {
		if err := send(c, req, resp, r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHotDuplicate: duplicates of 1,000 applied keys through the
// handler, answered by Redis (cache=on) or by Postgres (cache=off), with
// the Postgres queries each one cost.
func BenchmarkHotDuplicate(b *testing.B) {
	for _, mode := range []string{"on", "off"} {
		b.Run("cache="+mode, func(b *testing.B) {
			var opts []benchOpt
			if mode == "on" {
				opts = append(opts, withCache)
			}
			c, dbURL, queries := benchEdgeCounted(b, opts...)
			reqs := signedRequests(b, dbURL, 1000)
			applyAll(b, c, reqs)
			before := queries.n.Load()
			runHandler(b, c, reqs)
			b.ReportMetric(float64(queries.n.Load()-before)/float64(b.N), "pg-claim-queries/op")
		})
	}
}

// BenchmarkFirstDeliveryUnderStorm: first deliveries by 16 workers while 16
// more send duplicates of applied keys, ten for every first delivery: the
// cache's real job is shielding Postgres. storm=none is the baseline.
func BenchmarkFirstDeliveryUnderStorm(b *testing.B) {
	for _, mode := range []string{"none", "cache=on", "cache=off"} {
		b.Run("storm="+mode, func(b *testing.B) {
			var opts []benchOpt
			if mode == "cache=on" {
				opts = append(opts, withCache)
			}
			c, dbURL := benchEdge(b, opts...)
			dups := signedRequestsFrom(b, dbURL, "D", 1000)
			applyAll(b, c, dups)
			firsts := signedRequestsFrom(b, dbURL, "F", b.N)
			var firstsSent, dupsSent atomic.Int64
			stop := make(chan struct{})
			var storm sync.WaitGroup
			if mode != "none" {
				for w := range 16 {
					storm.Add(1)
					go func() {
						defer storm.Done()
						req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
						for i := w; ; i++ {
							select {
							case <-stop:
								return
							default:
							}
							if dupsSent.Load() >= 10*(firstsSent.Load()+1) {
								time.Sleep(100 * time.Microsecond)
								continue
							}
							dupsSent.Add(1)
							if err := send(c, req, resp, dups[i%len(dups)]); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
			}
			var next atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
					for {
						i := int(next.Add(1) - 1)
						if i >= b.N {
							return
						}
						if err := send(c, req, resp, firsts[i]); err != nil {
							b.Error(err)
							return
						}
						firstsSent.Add(1)
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			close(stop)
			storm.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "first/s")
			b.ReportMetric(float64(dupsSent.Load())/float64(b.N), "dups/first")
		})
	}
}

// BenchmarkCacheEntryBytes measures what a done entry costs a real Redis:
// MEMORY USAGE of one entry, and used_memory grown per entry over 100,000.
func BenchmarkCacheEntryBytes(b *testing.B) {
	srv, err := claimcachetest.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	client, _ := claimcache.NewClient(srv.URL(), time.Second, 8)
	defer client.Close()
	cache, _ := claimcache.New(claimcache.Config{Client: client})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	used := func() int64 {
		info, _ := rdb.InfoMap(ctx, "memory").Result()
		n, _ := strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
		return n
	}
	// A generic answer as the edge stores it, under a realistic key.
	answer := append([]byte{0, 200, 16}, "application/json"...)
	answer = append(answer, `{"code":"SUCCESS","outcome":"applied","status":"PAID"}`...)
	const n = 100000
	b.ResetTimer()
	for range b.N {
		rdb.FlushAll(ctx) // our own server
		base := used()
		for i := range n {
			key := fmt.Appendf(nil, "acme:42000012342026120%08d:PAY_SUCCESS", i)
			var d claimcache.Digest
			d[0], d[1] = byte(i), byte(i>>8)
			if err := cache.CompleteMany(ctx, []claimcache.Completion{{Key: key, Digest: d, Response: answer}}); err != nil {
				b.Fatal(err)
			}
		}
		per := float64(used()-base) / n
		one, _ := rdb.MemoryUsage(ctx, "ne:{acme:4200001234202612000000001:PAY_SUCCESS}").Result()
		b.ReportMetric(float64(one), "memory-usage-B/entry")
		b.ReportMetric(per, "used-memory-B/entry")
		b.ReportMetric(per*1e6/(1<<20), "MiB/1M-entries")
	}
}
