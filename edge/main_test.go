package edge_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/admin"
	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/edgetest"
	"github.com/notifyedge/notifyedge/edge/readiness"
)

func TestMain(m *testing.M) { durabletest.Main(m) }

const (
	testSecret  = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	otherSecret = "whsec_c2VjcmV0LW9mLWFub3RoZXItY2hhbm5lbA=="
	adminToken  = "admin-token-for-tests"
	ordersToken = "orders-token-for-tests"
)

// bundle is one test's running edge: a real listener and admin listener on
// loopback over its own database.
type bundle struct {
	url, adminURL string
	dbURL         string
	redis         *claimcachetest.Server
	cache         *claimcache.Cache
	queries       *queryCounter
	store         *durable.Store
	db            *pgxpool.Pool
	server        *edge.Server
	client        *http.Client
}

type options struct {
	budget   time.Duration
	maxBody  int
	secrets  []string
	noTokens bool
	// cache starts a redis-server of the test's own and puts the claim
	// cache in front of Postgres.
	cache      bool
	pendingTTL time.Duration
	// cacheTimeout is the cache client's per-call timeout (default 25 ms,
	// as edged runs: fault tests rely on it), and when set also the
	// cache's WaitBudget for a turn in its pipeline (default 50 ms). A
	// test about where answers come from, not about a slow Redis, sets a
	// generous one: on a loaded machine 25 or 50 ms is sometimes missed,
	// and the call rightly goes to Postgres.
	cacheTimeout time.Duration
	wrapCache    func(edge.Cache) edge.Cache
	// localEntries, with cache, turns on the per-node table of done
	// entries; epoch puts the database's cache epoch in the keys and serves
	// POST /cache/epoch, as edged runs.
	localEntries int
	epoch        bool
	// watermark, with epoch, keeps the cache's watermark of the database's
	// position and moves the epoch on for a database behind it, as edged
	// runs.
	watermark bool
	// dbURL shares another bundle's database (two nodes).
	dbURL string
	// redisURL, with cache, is where the cache client connects (a proxy in
	// front of the test's redis-server).
	redisURL string
	redis    *claimcachetest.Server
	// cluster puts the claim cache on this Redis Cluster instead.
	cluster *claimcachetest.Cluster
	// channels are configured beside acme.
	channels []channel.Channel
	// server are the public listener's connection settings (zero: the
	// defaults); logger receives both listeners' logs (nil: the default).
	server edge.Config
	logger *slog.Logger
	// dbMaxConns caps the callback pool (0: durable's default).
	dbMaxConns int32
	// reviews wraps the admin's review queue (fault injection).
	reviews func(admin.ReviewQueue) admin.ReviewQueue
}

func setup(t testing.TB, o options) *bundle {
	t.Helper()
	ctx := context.Background()
	dbURL := o.dbURL
	if dbURL == "" {
		dbURL = durabletest.NewDatabase(t)
	}
	if o.budget == 0 {
		o.budget = 2 * time.Second // correctness storms must not flake on a loaded machine
	}
	queries := &queryCounter{}
	store, err := durable.New(ctx, durable.Config{URL: dbURL, MinConns: 2, MaxConns: o.dbMaxConns, StatementTimeout: o.budget, Tracer: queries, GroupCommit: durabletest.GroupCommit()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if o.secrets == nil {
		o.secrets = []string{testSecret}
	}
	acme, err := channel.NewGeneric(channel.GenericConfig{Name: "acme", Secrets: o.secrets})
	if err != nil {
		t.Fatal(err)
	}
	channels := append([]channel.Channel{acme}, o.channels...)
	names := make([]string, len(channels))
	for i, c := range channels {
		names[i] = c.Name()
	}
	metrics := edge.NewMetrics(names)
	metrics.RegisterBacklog(store)
	var cache *claimcache.Cache
	var ecache edge.Cache
	redisSrv := o.redis
	redisState := func() string { return "off" }
	if o.cluster != nil {
		o.redisURL = o.cluster.URL()
	}
	if o.cache || redisSrv != nil || o.cluster != nil {
		if redisSrv == nil && o.cluster == nil {
			if redisSrv, err = claimcachetest.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(redisSrv.Stop)
		}
		url := o.redisURL
		if url == "" {
			url = redisSrv.URL()
		}
		client, err := claimcache.NewClient(url, cmp.Or(o.cacheTimeout, 25*time.Millisecond), 128)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		ccfg := claimcache.Config{
			Client: client, PendingTTL: cmp.Or(o.pendingTTL, o.budget), WaitBudget: cmp.Or(o.cacheTimeout, 50*time.Millisecond),
			BreakerCooldown: 200 * time.Millisecond,
			LocalEntries:    o.localEntries,
			OnError:         func(error) { metrics.CacheErrors.Inc() },
			OnBreaker: func(node string, open bool) {
				metrics.BreakerOpen.WithLabelValues(node).Set(map[bool]float64{true: 1, false: 0}[open])
			},
		}
		if o.epoch {
			ccfg.Epoch = store.CacheEpoch
		}
		if o.epoch && o.watermark {
			ccfg.Position = store.CachePosition
			ccfg.OnBehind = func(ctx context.Context, epoch string, _, _ uint64) (string, error) {
				return store.BumpCacheEpochFrom(ctx, epoch)
			}
		}
		cache, err = claimcache.New(ccfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cache.Close)
		ecache, redisState = cache, cache.State
		if o.wrapCache != nil {
			ecache = o.wrapCache(cache)
		}
	}
	sc := o.server
	sc.Channels, sc.Authority, sc.Cache, sc.Budget, sc.MaxBody, sc.Metrics, sc.Logger = channels, store, ecache, o.budget, o.maxBody, metrics, o.logger
	srv, err := edge.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	token := adminToken
	if o.noTokens {
		token = ""
	}
	var reviews admin.ReviewQueue = store
	if o.reviews != nil {
		reviews = o.reviews(store)
	}
	otoken := ordersToken
	if o.noTokens {
		otoken = ""
	}
	var bumper admin.EpochBumper
	if o.epoch {
		bumper = store
	}
	checker := readiness.New(readiness.Config{Postgres: store.Ping, Redis: redisState})
	rctx, stopReadiness := context.WithCancel(context.Background())
	readinessDone := make(chan struct{})
	go func() { defer close(readinessDone); checker.Run(rctx) }()
	t.Cleanup(func() { stopReadiness(); <-readinessDone })
	admin, err := admin.New(admin.Config{Token: token, OrdersToken: otoken, Metrics: metrics,
		Deps:     admin.Deps{Orders: store, Redrive: srv, Reviews: reviews, CacheEpoch: bumper},
		Draining: srv.Draining, Readiness: checker, Logger: o.logger})
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	aln := listen(t)
	go srv.Serve(ln)
	go admin.Serve(aln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		admin.Shutdown(ctx)
	})
	return &bundle{
		url: "http://" + ln.Addr().String(), adminURL: "http://" + aln.Addr().String(),
		dbURL: dbURL, store: store, db: db, server: srv, redis: redisSrv, cache: cache, queries: queries,
		// A channel keeps its connections under the per-address cap, and
		// drops an idle one well before the server's idle timeout: a POST
		// sent on a connection the server is closing fails with EOF, and
		// a POST is not retried by the transport.
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 128, MaxConnsPerHost: 128,
			IdleConnTimeout: cmp.Or(o.server.IdleTimeout, 5*time.Second) / 2}},
	}
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func (b *bundle) order(t testing.TB, no string, status durable.State, amount int64) {
	t.Helper()
	if err := pgtemp.SeedOrders(context.Background(), b.dbURL, []pgtemp.Order{{No: no, Status: string(status), Amount: amount, Currency: "CNY"}}); err != nil {
		t.Fatal(err)
	}
}

// body is a generic channel body.
func body(txn, event, orderNo string, amount int64) string {
	return fmt.Sprintf(`{"channel_txn_id":%q,"event_type":%q,"order_no":%q,"amount":%d,"currency":"CNY"}`, txn, event, orderNo, amount)
}

// reply is an answer as the channel sees it.
type reply struct {
	status   int
	body     string
	replayed bool
	ctype    string
}

// signed returns headers signed with secret at ts for body.
func signed(t testing.TB, secret string, ts time.Time, payload string) http.Header {
	t.Helper()
	return signedID(t, secret, fmt.Sprintf("msg_%d", time.Now().UnixNano()), ts, payload)
}

// signedID is signed with a chosen webhook-id.
func signedID(t testing.TB, secret, id string, ts time.Time, payload string) http.Header {
	t.Helper()
	sig, err := channel.SignWebhook(secret, id, ts.Unix(), []byte(payload))
	if err != nil {
		t.Errorf("sign: %v", err) // not Fatal: storms sign from spawned goroutines
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", fmt.Sprint(ts.Unix()))
	h.Set("webhook-signature", sig)
	return h
}

// send is safe to call from spawned goroutines: a transport failure is
// reported with t.Errorf (t.Fatal there would hang the test instead of
// failing it) and answered as status 0, which every caller's checks refuse.
func (b *bundle) send(t testing.TB, method, path string, h http.Header, payload string) reply {
	t.Helper()
	req, err := http.NewRequest(method, b.url+path, strings.NewReader(payload))
	if err != nil {
		t.Errorf("%s %s: %v", method, path, err)
		return reply{body: err.Error()}
	}
	req.Header = h
	resp, err := b.client.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, path, err)
		return reply{body: err.Error()}
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, string(got), resp.Header.Get("Idempotent-Replayed") == "true", resp.Header.Get("Content-Type")}
}

// post delivers payload to channel acme, correctly signed now.
func (b *bundle) post(t testing.TB, payload string) reply {
	t.Helper()
	return b.send(t, http.MethodPost, "/notify/acme", signed(t, testSecret, time.Now(), payload), payload)
}

// postAsync posts from a goroutine of its own and hands the reply over
// on the returned channel (send reports failures with t.Errorf there).
func (b *bundle) postAsync(t testing.TB, payload string) <-chan reply {
	r := make(chan reply, 1)
	go func() { r <- b.post(t, payload) }()
	return r
}

// counts is how many rows each table holds: "stores nothing" is "counts
// unchanged".
type counts struct{ claims, orders, outbox, reviews int }

func (b *bundle) counts(t testing.TB) counts {
	t.Helper()
	var c counts
	err := b.db.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM notify_claim), (SELECT count(*) FROM biz_order),
		(SELECT count(*) FROM outbox), (SELECT count(*) FROM notify_review)`).Scan(&c.claims, &c.orders, &c.outbox, &c.reviews)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (b *bundle) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	return durabletest.Count(t, b.db, sql, args...)
}

func (b *bundle) status(t testing.TB, orderNo string) string {
	t.Helper()
	return durabletest.Status(t, b.db, orderNo)
}

// lockOrder holds the order's row lock until release (durabletest.LockOrder).
func (b *bundle) lockOrder(t testing.TB, orderNo string) (release func()) {
	t.Helper()
	return durabletest.LockOrder(t, b.db, orderNo)
}

// admin sends an admin request with the given bearer token ("" for none).
func (b *bundle) admin(t testing.TB, method, path, token, payload string) (int, map[string]any) {
	t.Helper()
	r := b.adminReply(method, path, token, payload)
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.code, r.body
}

// adminReply is one admin answer: status, decoded JSON body, whether it
// was a replay, or what went wrong sending it.
type adminReply struct {
	code     int
	body     map[string]any
	replayed bool
	err      error
}

// adminReply sends an admin request and reports failures in the reply,
// so that goroutines may send one (never t.Fatal off the test's own).
func (b *bundle) adminReply(method, path, token, payload string) adminReply {
	req, err := http.NewRequest(method, b.adminURL+path, strings.NewReader(payload))
	if err != nil {
		return adminReply{err: err}
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return adminReply{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return adminReply{err: err}
	}
	r := adminReply{code: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	if len(bytes.TrimSpace(raw)) > 0 && raw[0] == '{' {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			return adminReply{err: fmt.Errorf("admin %s: %w: %s", path, err, raw)}
		}
	}
	return r
}

// adminAsync sends an admin request from a goroutine of its own and hands
// the reply over on the returned channel.
func (b *bundle) adminAsync(method, path, token, payload string) <-chan adminReply {
	r := make(chan adminReply, 1)
	go func() { r <- b.adminReply(method, path, token, payload) }()
	return r
}

// metric returns the value of one sample line of /metrics (0 if absent).
func (b *bundle) metric(t testing.TB, sample string) float64 {
	t.Helper()
	v, _ := edgetest.Value(edgetest.Scrape(t, b.client, b.adminURL+"/metrics"), sample)
	return v
}

// queryCounter is a pgx tracer that counts the queries a pool sends that
// read or write claims (the relay's wake-up NOTIFY is not one).
type queryCounter struct{ n atomic.Int64 }

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "notify_claim") || strings.Contains(d.SQL, "notifyedge_process") {
		q.n.Add(1)
	}
	return ctx
}

func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func strconvFormat(f float64) string { return fmt.Sprintf("%.0f", f) }
