package edge_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge"
)

// proxy puts an in-process toxiproxy in front of upstream.
func proxy(t *testing.T, name, upstream string) *toxiproxy.Proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

func addLatency(t *testing.T, p *toxiproxy.Proxy, ms int) {
	t.Helper()
	for _, stream := range []string{"downstream", "upstream"} {
		_, err := p.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(
			`{"name":"slow_%s","type":"latency","stream":%q,"attributes":{"latency":%d}}`, stream, stream, ms)))
		if err != nil {
			t.Fatal(err)
		}
	}
}

func removeLatency(t *testing.T, p *toxiproxy.Proxy) {
	t.Helper()
	for _, stream := range []string{"downstream", "upstream"} {
		if err := p.Toxics.RemoveToxic(context.Background(), "slow_"+stream); err != nil {
			t.Fatal(err)
		}
	}
}

// Redis slow (2 s a round trip, far past the 25 ms call timeout): every
// duplicate is still answered right, and by Postgres, so none waited for
// Redis (that answer would have been the cache's), and the breaker stops
// paying the timeout; once Redis is fast again, the cache answers again.
func TestRedisSlow(t *testing.T) {
	rs, err := claimcachetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	px := proxy(t, "redis", rs.Addr())
	b := setup(t, options{budget: 500 * time.Millisecond, redis: rs, redisURL: "redis://" + px.Listen + "/0"})
	payloads := b.seedPaid(t, "RS", 20)
	want := `{"code":"SUCCESS","outcome":"applied","status":"PAID"}`
	addLatency(t, px, 1000)
	for round := range 3 {
		for _, p := range payloads {
			if r := b.post(t, p); r.status != 200 || r.body != want || !r.replayed {
				t.Fatalf("round %d: %+v", round, r)
			}
		}
	}
	if b.metric(t, `notifyedge_cache_breaker_open{node=""}`) != 1 || b.metric(t, `notifyedge_cache_errors_total`) == 0 {
		t.Error("the breaker did not open on a slow Redis")
	}
	if got := b.metric(t, `notifyedge_requests_total{channel="acme",outcome="replayed_db"}`); got != 60 {
		t.Errorf("replayed_db = %v, want 60", got)
	}
	removeLatency(t, px)
	// The breaker closes once its cooldown passed and a probe succeeded:
	// deliver until the cache answers again.
	wait.For(t, "the cache answering again once Redis was fast", func() (bool, string) {
		if b.metric(t, `notifyedge_requests_total{channel="acme",outcome="replayed_cache"}`) > 0 {
			return true, ""
		}
		b.post(t, payloads[0])
		return false, "no replayed_cache answer yet"
	})
}

// Postgres slow past the budget (3 s each way, budget 200 ms): the answer
// is 503 at the budget, long before Postgres could have answered; whatever
// committed is correct, and the retry once Postgres is fast again gets
// SUCCESS with exactly one outbox row.
func TestPostgresSlowPastBudget(t *testing.T) {
	c := durabletest.Shared(t)
	name := durabletest.CreateDatabase(t, true)
	px := proxy(t, "postgres", c.TCPAddr())
	b := setup(t, options{budget: 200 * time.Millisecond, dbURL: pgtemp.TCPURL(px.Listen, name)})
	b.order(t, "O-slow", durable.PendingPay, 1999)
	payload := body("T-slow", "PAY_SUCCESS", "O-slow", 1999)
	addLatency(t, px, postgresStall)
	start := time.Now()
	r := b.post(t, payload)
	if d := time.Since(start); r.status != 503 || d >= postgresAnswers {
		t.Errorf("slow Postgres: %d %s after %v, want 503 before Postgres could answer (%v)", r.status, r.body, d, postgresAnswers)
	}
	removeLatency(t, px)
	// The pool replaces the connections it closed.
	var retry reply
	wait.For(t, "a retry answered once Postgres is fast", func() (bool, string) {
		retry = b.post(t, payload)
		return retry.status == 200, fmt.Sprintf("%+v", retry)
	})
	if retry.body != `{"code":"SUCCESS","outcome":"applied","status":"PAID"}` {
		t.Fatalf("retry: %+v", retry)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE order_no = 'O-slow'`); n != 1 {
		t.Errorf("outbox rows %d, want 1", n)
	}
}

// postgresStall is the latency (ms, each way) that makes Postgres slower
// than any budget; postgresAnswers is the soonest it can answer a
// statement, so an answer before it was cut off by the budget: a property
// of the answer, not a margin for a busy machine.
const (
	postgresStall   = 3000
	postgresAnswers = 2 * postgresStall * time.Millisecond
)

// hangingCleanup is a cache whose Complete and Abort hang until release
// closes, as a Redis that stalls right after answering the claim would.
// running counts the calls hanging now, entered every call that began.
type hangingCleanup struct {
	edge.Cache
	release          chan struct{}
	running, entered *atomic.Int64
}

func newHangingCleanup(c edge.Cache) hangingCleanup {
	return hangingCleanup{c, make(chan struct{}), new(atomic.Int64), new(atomic.Int64)}
}

func (h hangingCleanup) hangUntilReleased() {
	h.entered.Add(1)
	h.running.Add(1)
	defer h.running.Add(-1)
	<-h.release
}

func (h hangingCleanup) CompleteMany(ctx context.Context, cs []claimcache.Completion) error {
	h.hangUntilReleased()
	return h.Cache.CompleteMany(ctx, cs)
}

func (h hangingCleanup) Abort(ctx context.Context, key []byte, d claimcache.Digest, tok claimcache.Token) error {
	h.hangUntilReleased()
	return h.Cache.Abort(ctx, key, d, tok)
}

// waitEntered waits until n cleanup calls began (they run after the answer).
func (h hangingCleanup) waitEntered(t *testing.T, n int64) {
	t.Helper()
	wait.For(t, fmt.Sprintf("%d cache cleanups begun", n), func() (bool, string) {
		return h.entered.Load() >= n, fmt.Sprintf("%d begun", h.entered.Load())
	})
}

// The answer is written at the hard stop whatever the cache is doing: the
// cache's Abort (after a 503) and Complete (after a SUCCESS) run after the
// answer, so a Redis that hangs at that moment delays nothing.
func TestCacheCleanupAfterTheAnswer(t *testing.T) {
	c := durabletest.Shared(t)
	name := durabletest.CreateDatabase(t, true)
	px := proxy(t, "postgres", c.TCPAddr())
	var cleanup hangingCleanup
	b := setup(t, options{budget: 200 * time.Millisecond, dbURL: pgtemp.TCPURL(px.Listen, name), cache: true,
		wrapCache: func(c edge.Cache) edge.Cache { cleanup = newHangingCleanup(c); return cleanup }})
	// Let the hanging calls go before the bundle shuts down, and wait for
	// them (cleanups run last-in first-out: this runs before setup's).
	t.Cleanup(func() {
		close(cleanup.release)
		wait.For(t, "the released cache cleanups returned", func() (bool, string) {
			return cleanup.running.Load() == 0, fmt.Sprintf("%d still hanging", cleanup.running.Load())
		})
	})
	// Each answer arrives while its cleanup still hangs: it was written
	// before the cleanup began, whatever the cache is doing.
	b.order(t, "O-fast", durable.PendingPay, 1999)
	if r := b.post(t, body("T-fast", "PAY_SUCCESS", "O-fast", 1999)); r.status != 200 {
		t.Errorf("first delivery with Complete hanging: %d %s, want 200", r.status, r.body)
	}
	cleanup.waitEntered(t, 1)
	b.order(t, "O-slow2", durable.PendingPay, 1999)
	addLatency(t, px, postgresStall)
	start := time.Now()
	r := b.post(t, body("T-slow2", "PAY_SUCCESS", "O-slow2", 1999))
	if d := time.Since(start); r.status != 503 || d >= postgresAnswers {
		t.Errorf("slow Postgres with Abort hanging: %d %s after %v, want 503 before Postgres could answer (%v)", r.status, r.body, d, postgresAnswers)
	}
	cleanup.waitEntered(t, 2)
	removeLatency(t, px)
}
