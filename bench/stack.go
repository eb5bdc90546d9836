package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/edge"
)

// Secret is the bench channel's signing secret.
const Secret = "whsec_YmVuY2gtc2VjcmV0LW5vdGlmeWVkZ2UtMjAyNg=="

// Channel is the bench channel's name.
const Channel = "bench"

// Stack is a running notifyedge: Postgres, Redis (cache and stream), the
// edge on a loopback listener, the outbox relay and the reference shipper.
type Stack struct {
	URL string // http://host:port of the edge
	// URLNoCache is the same edge flow over the same Postgres with the
	// cache off; URLNetHTTP the cached flow behind net/http.
	URLNoCache, URLNetHTTP string
	// Metrics are the cached edge's (outcome counts come from here).
	Metrics *edge.Metrics
	DBURL   string
	DB      *pgxpool.Pool
	Store   *durable.Store
	Redis   *claimcachetest.Server
	Stream  redis.UniversalClient

	cluster *durabletest.Cluster
	server  *edge.Server
	stops   []func()
}

// StackConfig configures StartStack.
type StackConfig struct {
	// Budget is the edge's latency budget (default 2s: correctness first).
	Budget time.Duration
	// NoCache runs the edge without Redis in front.
	NoCache bool
	// Durable runs Postgres with fsync on (for figures).
	Durable bool
	// Log receives the edge's logs (default discarded).
	Log io.Writer
}

// StartStack starts everything on this machine's loopback.
func StartStack(ctx context.Context, cfg StackConfig) (*Stack, error) {
	if cfg.Budget == 0 {
		cfg.Budget = 2 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	s := &Stack{}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	var err error
	if s.cluster, err = durabletest.Start(ctx, durabletest.Options{Durable: cfg.Durable}); err != nil {
		return nil, err
	}
	s.DBURL = s.cluster.URL("postgres")
	if s.Store, err = durable.New(ctx, durable.Config{URL: s.DBURL, StatementTimeout: cfg.Budget}); err != nil {
		return nil, err
	}
	s.stops = append(s.stops, s.Store.Close)
	if s.DB, err = pgxpool.New(ctx, s.DBURL); err != nil {
		return nil, err
	}
	s.stops = append(s.stops, s.DB.Close)
	if s.Redis, err = claimcachetest.Start("--appendonly", "yes"); err != nil {
		return nil, err
	}
	s.stops = append(s.stops, s.Redis.Stop)
	if s.Stream, err = redisstream.NewClient(s.Redis.URL()); err != nil {
		return nil, err
	}
	s.stops = append(s.stops, func() { s.Stream.Close() })
	var cache edge.Cache
	if !cfg.NoCache {
		client, err := claimcache.NewClient(s.Redis.URL(), 25*time.Millisecond, 128)
		if err != nil {
			return nil, err
		}
		s.stops = append(s.stops, func() { client.Close() })
		if cache, err = claimcache.New(claimcache.Config{Client: client, PendingTTL: cfg.Budget, LocalEntries: 100_000}); err != nil {
			return nil, err
		}
	}
	ch, err := edge.NewGeneric(edge.GenericConfig{Name: Channel, Secrets: []string{Secret}})
	if err != nil {
		return nil, err
	}
	logger := slog.New(slog.NewJSONHandler(cfg.Log, nil))
	s.Metrics = edge.NewMetrics([]string{Channel})
	s.server, err = edge.New(edge.Config{Channels: []edge.Channel{ch}, Authority: s.Store, Cache: cache,
		Budget: cfg.Budget, Logger: logger, Metrics: s.Metrics})
	if err != nil {
		return nil, err
	}
	if s.URL, err = s.serve(s.server); err != nil {
		return nil, err
	}
	noCache, err := edge.New(edge.Config{Channels: []edge.Channel{ch}, Authority: s.Store, Budget: cfg.Budget, Logger: logger})
	if err != nil {
		return nil, err
	}
	if s.URLNoCache, err = s.serve(noCache); err != nil {
		return nil, err
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	hs := &http.Server{Handler: s.server}
	go hs.Serve(hl)
	s.stops = append(s.stops, func() { hs.Close() })
	s.URLNetHTTP = "http://" + hl.Addr().String()
	// The relay and the reference shipper, as a deployment runs them.
	rctx, cancel := context.WithCancel(context.Background())
	relayDone, shipDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(relayDone)
		s.Store.RunRelay(rctx, durable.RelayConfig{Publisher: redisstream.NewPublisher(s.Stream, "", 0), Poll: 200 * time.Millisecond})
	}()
	go func() {
		defer close(shipDone)
		redisstream.RunConsumer(rctx, redisstream.ConsumerConfig{Client: s.Stream, Group: "shipper", Name: "shipper-1",
			Block: 100 * time.Millisecond, ClaimIdle: 5 * time.Second, Handle: redisstream.ShipOnPaid(s.Store, "shipper", nil)})
	}()
	s.stops = append(s.stops, func() { cancel(); <-relayDone; <-shipDone })
	ok = true
	return s, nil
}

// serve runs srv on a loopback port until Close.
func (s *Stack) serve(srv *edge.Server) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go srv.Serve(ln)
	s.stops = append(s.stops, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	})
	return "http://" + ln.Addr().String(), nil
}

// Close stops everything StartStack started, newest first.
func (s *Stack) Close() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
	s.stops = nil
	if s.cluster != nil {
		s.cluster.Stop()
	}
}

// seedPending inserts n PENDING_PAY orders of amount fen, named by
// nameFormat (one %d, the index), into the database at dbURL.
func seedPending(ctx context.Context, dbURL, nameFormat string, n int, amount int64) ([]durabletest.Order, error) {
	orders := make([]durabletest.Order, n)
	for i := range orders {
		orders[i] = durabletest.Order{No: fmt.Sprintf(nameFormat, i), Status: "PENDING_PAY", Amount: amount, Currency: "CNY"}
	}
	return orders, durabletest.SeedOrders(ctx, dbURL, orders)
}

// count runs a count query.
func count(ctx context.Context, db *pgxpool.Pool, sql string, args ...any) (int, error) {
	var n int
	if err := db.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("%s: %w", sql, err)
	}
	return n, nil
}
