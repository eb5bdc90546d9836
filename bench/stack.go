package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/redisstream"
)

// Secret is the bench channel's signing secret.
const Secret = "whsec_YmVuY2gtc2VjcmV0LW5vdGlmeWVkZ2UtMjAyNg=="

// Channel is the bench channel's name.
const Channel = "bench"

// Stack is a running notifyedge: Postgres, Redis (cache and stream), the
// edge on loopback listeners, the outbox relay and the reference shipper.
// The edge, and the relay with the shipper, run as processes of their own
// (see part.go), so that their CPU is told apart from the bench's.
type Stack struct {
	URL string // http://host:port of the edge
	// URLNoCache is the same edge flow over the same Postgres with the
	// cache off; URLNetHTTP the cached flow behind net/http.
	URLNoCache, URLNetHTTP string
	// URLAlone is the cached edge over a store without group commit: every
	// delivery a transaction of its own.
	URLAlone string
	// AdminURL is the edge's admin listener: /metrics has the cached
	// edge's outcome counts.
	AdminURL string
	DBURL    string
	DB       *pgxpool.Pool
	Store    *durable.Store
	Redis    *claimcachetest.Server
	// StreamRedis is the outbox stream's own redis-server
	// (StackConfig.StreamRedis), nil when the stream shares the cache's.
	StreamRedis *claimcachetest.Server
	Stream      redis.UniversalClient

	cluster     *pgtemp.Cluster
	edge, relay *part
	stops       []func()
}

// StackConfig configures StartStack.
type StackConfig struct {
	// Budget is the edge's latency budget (default 2s: correctness first).
	Budget time.Duration
	// NoCache runs the edge without Redis in front.
	NoCache bool
	// Durable runs Postgres with fsync on (for figures).
	Durable bool
	// Log receives the logs of the edge and relay processes (default
	// discarded).
	Log io.Writer
	// PostgresSettings are extra "name=value" server settings.
	PostgresSettings []string
	// StreamRedis puts the outbox stream on a redis-server of its own, as
	// a deployment whose cache Redis does not persist must: Redis's CPU is
	// then the claim cache's alone. Off, the stream shares the cache's
	// Redis (which persists), as builds before this option always ran.
	StreamRedis bool
}

// StartStack starts everything on this machine's loopback.
func StartStack(ctx context.Context, cfg StackConfig) (*Stack, error) {
	if _, ok := os.LookupEnv(partEnv); ok {
		// A re-executed part whose main did not call ChildMain first: it
		// would start stacks, and parts, of its own, recursively.
		return nil, errors.New("bench: StartStack in a stack's part process: call bench.ChildMain first in main and TestMain")
	}
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
	if s.cluster, err = pgtemp.Start(ctx, pgtemp.Options{Durable: cfg.Durable, Settings: cfg.PostgresSettings}); err != nil {
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
	streamURL := s.Redis.URL()
	if cfg.StreamRedis {
		if s.StreamRedis, err = claimcachetest.Start("--appendonly", "yes"); err != nil {
			return nil, err
		}
		s.stops = append(s.stops, s.StreamRedis.Stop)
		streamURL = s.StreamRedis.URL()
	}
	if s.Stream, err = redisstream.NewClient(streamURL); err != nil {
		return nil, err
	}
	s.stops = append(s.stops, func() { s.Stream.Close() })
	spec := partSpec{Role: roleEdge, DBURL: s.DBURL, RedisURL: s.Redis.URL(), Budget: cfg.Budget, NoCache: cfg.NoCache}
	if s.edge, err = startPart(ctx, spec, cfg.Log); err != nil {
		return nil, err
	}
	s.stops = append(s.stops, s.edge.stop)
	s.URL, s.URLNoCache, s.URLNetHTTP, s.AdminURL = s.edge.ready.URL, s.edge.ready.URLNoCache, s.edge.ready.URLNetHTTP, s.edge.ready.AdminURL
	s.URLAlone = s.edge.ready.URLAlone
	// The relay and the reference shipper, as a deployment runs them.
	spec.Role = roleRelay
	spec.RedisURL = streamURL
	if s.relay, err = startPart(ctx, spec, cfg.Log); err != nil {
		return nil, err
	}
	s.stops = append(s.stops, s.relay.stop)
	ok = true
	return s, nil
}

// PostgresLog is the path of the stack's Postgres server log.
func (s *Stack) PostgresLog() string { return filepath.Join(s.cluster.Dir(), "postgres.log") }

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

// count runs a count query.
func count(ctx context.Context, db *pgxpool.Pool, sql string, args ...any) (int, error) {
	var n int
	if err := db.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("%s: %w", sql, err)
	}
	return n, nil
}
