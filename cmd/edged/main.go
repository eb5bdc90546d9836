// Command edged runs notifyedge: the public callback endpoint and the admin
// listener, over Postgres (DATABASE_URL), or over a throwaway local Postgres
// with -dev.
//
//	edged [flags]            serve (see -h, and the README's configuration table)
//	edged -dev               serve on throwaway local state, print a ready curl
//	edged sign [flags]       print the Standard Webhooks headers for a body
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/admin"
	"github.com/notifyedge/notifyedge/edge/reconcile"
	"github.com/notifyedge/notifyedge/edge/reconcile/bills"
	"github.com/notifyedge/notifyedge/edge/tracing"
	"github.com/notifyedge/notifyedge/edge/tracing/instrument"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "sign" {
		os.Exit(runSign(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "secret" {
		os.Exit(runSecret(os.Args[2:], os.Stdout, os.Stderr))
	}
	cfg, err := ParseConfig(os.Args[1:], os.Environ())
	if errors.Is(err, errHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "edged:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	m := NewMain(cfg)
	// One log stream: go-redis logs through a process-wide logger, which
	// would otherwise write plain text between edged's JSON lines.
	redis.SetLogger(newRedisLogger(m.Logger))
	if err := m.Run(ctx); err != nil {
		m.Close()
		fmt.Fprintln(os.Stderr, "edged:", err)
		os.Exit(1)
	}
	select {
	case <-ctx.Done():
	case err := <-m.Failed():
		m.Logger.Error("listener failed", "error", err)
	}
	stop()
	if err := m.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "edged:", err)
		os.Exit(1)
	}
}

// Main is one edged process: wiring, start-up and shutdown. End-to-end
// tests run it in-process.
type Main struct {
	Config Config
	// Env is the environment a credential reload reads the channel
	// variables from (nil: the process's, as at start).
	Env []string
	// Stdout receives the dev-mode banner (the ready curl); logs go to Logger.
	Stdout io.Writer
	Logger *slog.Logger

	cluster *pgtemp.Cluster
	// ready is the store once Postgres answers, for what runs before it
	// does (the cache's epoch reads); store is the same, for Run and Close.
	ready   atomic.Pointer[durable.Store]
	mini    *miniredis.Miniredis
	redis   redis.UniversalClient
	cache   *claimcache.Cache
	store   *durable.Store
	server  *edge.Server
	admin   *admin.Server
	ln      net.Listener
	adminLn net.Listener
	failed  chan error
	dev     devState

	relayState  atomic.Value // "off", "standby", "running", "degraded"
	relayDetail atomic.Value // why the relay is degraded, else ""
	stopRelay   context.CancelFunc
	relayDone   chan struct{}
	relayClient redis.UniversalClient

	stopRetention context.CancelFunc // retention runs on every node
	retentionDone chan struct{}

	stopReadiness context.CancelFunc // the probes /readyz reports
	readinessDone chan struct{}

	tracing *tracing.Provider // nil: tracing off

	qmu              sync.Mutex // reconciler, reconcileMetrics, queriers, billRunner, billMetrics
	queriers         map[string]reconcile.Querier
	reconciler       *reconcile.Reconciler
	reconcileMetrics *reconcileMetrics
	reconcileState   atomic.Value // "off" until started, then "standby" or "leader"
	stopReconcile    context.CancelFunc
	reconcileDone    chan struct{}
	billRunner       *bills.Runner
	billMetrics      *billMetrics
	billsState       atomic.Value // "off" until started, then "standby" or "leader"
	stopBills        context.CancelFunc
	billsDone        chan struct{}
}

// Compile-time checks that the concrete parts satisfy edge's interfaces.
var (
	_ edge.Authority    = (*durable.Store)(nil)
	_ admin.ReviewQueue = (*durable.Store)(nil)
	_ edge.Backlog      = (*durable.Store)(nil)
	_ edge.Cache        = (*claimcache.Cache)(nil)
	_ admin.OrderStore  = (*durable.Store)(nil)
	_ admin.EpochBumper = (*durable.Store)(nil)
	_ admin.Redriver    = (*edge.Server)(nil)
)

// NewMain returns a Main for cfg, logging JSON to stderr.
func NewMain(cfg Config) *Main {
	return &Main{
		Config: cfg,
		Stdout: os.Stdout,
		Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil)),
		failed: make(chan error, 2),
	}
}

// Run starts everything and returns once both listeners accept. The admin
// listener comes first, so that health, readiness ("starting") and metrics
// answer while edged waits for Postgres (connect, migrate, warm-up, with
// back-off, up to Config.StartTimeout); the public listener opens only once
// edged can decide: nothing answers SUCCESS before Postgres is there.
func (m *Main) Run(ctx context.Context) error {
	cfg := &m.Config
	if cfg.Dev {
		if err := m.startDev(ctx); err != nil {
			return err
		}
	}
	if cfg.DatabaseURL == "" {
		return errors.New("DATABASE_URL is required")
	}
	target, err := parseDatabaseURL(cfg.DatabaseURL)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(cfg.Channels))
	for _, cc := range cfg.Channels {
		names = append(names, cc.Name)
	}
	metrics := edge.NewMetrics(names)
	creds, err := newCredentials(m, metrics.Registry)
	if err != nil {
		return err
	}
	channels, queriers, err := creds.build(cfg.Channels)
	if err != nil {
		return err
	}
	if cfg.Tracing {
		// The SDK reads its own variables (endpoint, sampler, headers,
		// service name) from the process's environment.
		if m.tracing, err = tracing.Setup(ctx, "edged", os.Getenv); err != nil {
			return err
		}
	}
	var cache edge.Cache
	redisState := func() string { return "off" }
	if cfg.RedisURL != "" {
		if err := m.openCache(metrics); err != nil {
			return err
		}
		cache, redisState = m.cache, m.cache.State
	}
	// The authority and the admin's stores are swapped in whole once
	// Postgres answers; the public listener opens only after that.
	m.server, err = edge.New(edge.Config{
		Channels: channels,
		Cache:    cache,
		Budget:   cfg.Budget,
		MaxBody:  cfg.MaxBody,
		Metrics:  metrics,
		// 0 in the configuration means no cap; edge's zero is its default.
		MaxConnsPerIP: cmp.Or(cfg.MaxConnsPerIP, -1),
		IdleTimeout:   cfg.IdleTimeout,
		Logger:        m.Logger,
		Tracer:        m.tracing.Tracer("github.com/notifyedge/notifyedge/edge"),
	})
	if err != nil {
		return err
	}
	m.relayState.Store("off")
	m.relayDetail.Store("")
	checker := m.startReadiness(redisState)
	m.admin, err = admin.New(admin.Config{
		Token:       cfg.AdminToken,
		OrdersToken: cfg.OrdersToken,
		Metrics:     metrics,
		Draining:    m.server.Draining,
		Readiness:   checker,
		RelayState:  func() string { return m.relayState.Load().(string) },
		RelayDetail: func() string { return m.relayDetail.Load().(string) },
		Channels:    names,
		Reload:      creds.Reload,
		Logger:      m.Logger,
	})
	if err != nil {
		return err
	}
	creds.onSIGHUP(ctx)
	if m.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		return fmt.Errorf("admin listen: %w", err)
	}
	go func() { m.failed <- m.admin.Serve(m.adminLn) }()

	metrics.Starting.Set(1)
	// The server gives up a little before the budget, even when the client
	// cannot tell it to (statement_timeout, lock_timeout).
	serverTimeout := cfg.Budget * 9 / 10
	store, err := waitForPostgres(ctx, m.Logger, cfg.DatabaseURL, target, cfg.StartTimeout, func(actx context.Context) (*durable.Store, error) {
		return durable.New(actx, durable.Config{URL: cfg.DatabaseURL, StatementTimeout: serverTimeout, LockTimeout: serverTimeout,
			GroupCommit: cfg.GroupCommit, Tracer: instrument.Postgres(m.tracing)})
	})
	if err != nil {
		return err
	}
	m.store = store
	if cfg.Dev {
		if err := m.seedDev(ctx); err != nil {
			return err
		}
	}
	m.ready.Store(store)
	m.server.SetAuthority(store)
	metrics.RegisterBacklog(store)
	metrics.RegisterGroupCommit(store)
	m.reconcileState.Store("off")
	if err := m.startReconcile(metrics, queriers); err != nil {
		return err
	}
	m.billsState.Store("off")
	if err := m.startBills(metrics); err != nil {
		return err
	}
	if m.cache != nil {
		// Until the cache knows the database's epoch it answers nothing:
		// read it now, not at its next tick (a failure is logged).
		_ = m.cache.RefreshEpoch(ctx)
	}
	// Readiness from now on reports the database that just answered, not
	// the probes' last round, which ran before it did.
	checker.Probe(ctx)
	if err := m.admin.Attach(admin.Deps{Orders: store, Redrive: m.server, Reviews: store, CacheEpoch: store,
		Reconcile: adminReconciler{m.reconciler}, Bills: adminBills{r: m.billRunner, store: store, zone: cfg.BillsZone}}); err != nil {
		return err
	}
	metrics.Starting.Set(0)
	if cfg.StreamURL != "" && cfg.Relay {
		if err := m.startRelay(ctx, metrics); err != nil {
			return err
		}
	}
	if err := m.startRetention(metrics); err != nil {
		return err
	}
	if m.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	go func() { m.failed <- m.server.Serve(m.ln) }()
	m.Logger.Info("edged listening", "listen", m.ln.Addr().String(), "admin", m.adminLn.Addr().String(),
		"channels", names, "budget", cfg.Budget.String(), "cache", redisState(), "relay", m.relayState.Load())
	if cfg.Dev {
		m.printDevBanner()
	}
	return nil
}

// openCache connects the claim cache to REDIS_URL. Each Redis call is
// bounded well inside the budget; the pending TTL is the budget itself (no
// legitimate owner takes longer).
func (m *Main) openCache(metrics *edge.Metrics) error {
	cfg := m.Config
	callTimeout := min(25*time.Millisecond, cfg.Budget/8)
	client, err := claimcache.NewClient(cfg.RedisURL, callTimeout, 128)
	if err != nil {
		return err
	}
	m.redis = client
	// The cache's client is not instrumented (instrument.Redis): its
	// claims and lookups go out through a pipe shared by every callback,
	// in no callback's context, so their spans could join no trace, and
	// the hooks would run on every call with tracing on. The claim and
	// cache complete spans time its work.
	watch, err := newEpochWatch(metrics.Registry, m.Logger)
	if err != nil {
		return err
	}
	m.cache, err = claimcache.New(claimcache.Config{
		Client:     client,
		PendingTTL: cfg.Budget,
		ResultTTL:  cfg.ResultTTL,
		WaitBudget: cfg.Budget / 4,
		// Hot duplicates of the last 100k results skip the Redis round trip
		// (about 35 MB): the profile's biggest cost.
		LocalEntries: 100_000,
		// The epoch of the database the entries mirror is in every key: a
		// restored or promoted database, or one an operator repaired and
		// bumped the epoch of, is never answered for by entries of its past.
		Epoch:   m.cacheEpoch,
		OnEpoch: watch.seen,
		// A database restored from a snapshot or a base backup keeps the
		// epoch; behind the watermark of what the entries hold, it gets a
		// new one.
		Position: m.cachePosition,
		OnBehind: func(ctx context.Context, epoch string, pos, mark uint64) (string, error) {
			s := m.ready.Load()
			if s == nil {
				return "", errStarting
			}
			next, err := s.BumpCacheEpochFrom(ctx, epoch)
			if err != nil {
				return "", err
			}
			watch.restored(epoch, next, pos, mark)
			return next, nil
		},
		OnError: func(err error) {
			if !logEpochError(m.Logger, err) {
				metrics.CacheErrors.Inc()
			}
		},
		OnBreaker: func(node string, open bool) {
			if open {
				metrics.BreakerOpen.WithLabelValues(node).Set(1)
				m.Logger.Warn("cache breaker open: Postgres answers its keys until Redis is back", "node", node)
			} else {
				metrics.BreakerOpen.WithLabelValues(node).Set(0)
				m.Logger.Info("cache breaker closed", "node", node)
			}
		},
	})
	return err
}

// Addr returns the public listener's address (after Run).
func (m *Main) Addr() string { return m.ln.Addr().String() }

// AdminAddr returns the admin listener's address (after Run).
func (m *Main) AdminAddr() string { return m.adminLn.Addr().String() }

// Failed delivers a listener's error if one stops serving on its own.
func (m *Main) Failed() <-chan error { return m.failed }

// Close drains and stops: /readyz turns 503 at once while the public
// listener keeps serving for Config.DrainDelay (load balancers notice and
// stop routing here first), then the listener stops accepting, in-flight
// requests get up to Config.Drain, then the pool closes and a dev cluster is
// removed.
func (m *Main) Close() error {
	var errs []error
	if m.server != nil && m.ln != nil && m.Config.DrainDelay > 0 {
		m.server.Drain()
		m.Logger.Info("draining: readiness off, still serving", "delay", m.Config.DrainDelay.String())
		time.Sleep(m.Config.DrainDelay)
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.Config.Drain)
	defer cancel()
	if m.server != nil {
		m.Logger.Info("draining: listener closed, finishing in-flight requests", "deadline", m.Config.Drain.String())
		if err := m.server.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("drain: %w", err))
		}
	} else if m.ln != nil {
		m.ln.Close()
	}
	if m.admin != nil {
		actx, acancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := m.admin.Shutdown(actx); err != nil {
			errs = append(errs, fmt.Errorf("admin shutdown: %w", err))
		}
		acancel()
	} else if m.adminLn != nil {
		m.adminLn.Close()
	}
	if m.stopRetention != nil {
		m.stopRetention()
		<-m.retentionDone
	}
	if m.stopReadiness != nil {
		m.stopReadiness()
		<-m.readinessDone
	}
	if m.stopReconcile != nil {
		m.stopReconcile()
		<-m.reconcileDone
	}
	if m.stopBills != nil {
		m.stopBills()
		<-m.billsDone
	}
	if m.stopRelay != nil {
		m.stopRelay()
		<-m.relayDone
		m.relayClient.Close()
	}
	if m.store != nil {
		m.store.Close()
	}
	if m.cache != nil {
		m.cache.Close() // stops the epoch reads
	}
	if m.redis != nil {
		m.redis.Close()
	}
	if m.mini != nil {
		m.mini.Close()
	}
	tctx, tcancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := m.tracing.Shutdown(tctx); err != nil {
		errs = append(errs, err)
	}
	tcancel()
	if m.cluster != nil {
		if err := m.cluster.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("remove dev postgres: %w", err))
		}
	}
	return errors.Join(errs...)
}
