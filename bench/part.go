package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/durable/shipping"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/admin"
	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/readiness"
	"github.com/notifyedge/notifyedge/edge/tracing"
	"github.com/notifyedge/notifyedge/edge/tracing/instrument"
)

// The stack's parts whose CPU the bench reports run as processes of their
// own, apart from the load generator: the edge (its three servers and its
// admin listener) in one, the outbox relay and the reference shipper in
// another. /proc accounts CPU per process, so in one process the edge's
// time and the generator's could not be told apart.
//
// The bench re-executes its own binary (os.Executable) with partEnv set;
// ChildMain, called first by cmd/edgebench's main and by bench's TestMain,
// then serves that part instead of running the bench. Re-executing rather
// than building and starting edged needs no Go toolchain, source tree or
// build step at run time, behaves the same under `go run` and `go test`,
// and keeps the edge wired exactly as the bench wired it in process before
// (the bench channel, the cache-off and net/http twins over one store), so
// figures stay comparable with earlier runs. edged's own wiring is covered
// by its tests and can be benched with -target.

// partEnv carries a part's JSON partSpec to the re-executed binary.
const partEnv = "NOTIFYEDGE_BENCH_PART"

// The parts.
const (
	roleEdge  = "edge"
	roleRelay = "relay"
)

// partSpec is what a part needs to know.
type partSpec struct {
	Role     string        `json:"role"`
	DBURL    string        `json:"db_url"`
	RedisURL string        `json:"redis_url"`
	Budget   time.Duration `json:"budget"`
	// NoCache runs the edge's main server without Redis in front.
	NoCache bool `json:"no_cache,omitempty"`
}

// partReady is a part's one line on stdout: its addresses once it serves,
// or why it could not start.
type partReady struct {
	URL        string `json:"url,omitempty"`
	URLNoCache string `json:"url_no_cache,omitempty"`
	URLNetHTTP string `json:"url_net_http,omitempty"`
	URLAlone   string `json:"url_alone,omitempty"`
	AdminURL   string `json:"admin_url,omitempty"`
	Error      string `json:"error,omitempty"`
}

// ChildMain returns at once, unless the bench started this process as one
// of its stack's parts: then it serves that part until its stdin closes
// (the bench stopping it, or dying) and exits. Call it first thing in main
// and in TestMain of any binary that starts a Stack.
func ChildMain() {
	raw, ok := os.LookupEnv(partEnv)
	if !ok {
		return
	}
	os.Exit(servePart(raw, os.Stdin, os.Stdout, os.Stderr))
}

// servePart runs one part: it reports readiness on out, serves until in
// ends, then stops. It returns the exit code.
func servePart(raw string, in io.Reader, out, logs io.Writer) int {
	// Ctrl-C reaches the whole foreground process group: the bench decides
	// when its parts stop (by closing stdin), so that an interrupted run
	// still shuts down in order.
	signal.Ignore(os.Interrupt)
	report := func(r partReady) { json.NewEncoder(out).Encode(r) }
	var spec partSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		report(partReady{Error: fmt.Sprintf("bench part: %s: %v", partEnv, err)})
		return 2
	}
	ctx := context.Background()
	var stops []func()
	stopAll := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	var ready partReady
	var err error
	switch spec.Role {
	case roleEdge:
		ready, err = serveEdge(ctx, spec, slog.New(slog.NewJSONHandler(logs, nil)), &stops)
	case roleRelay:
		err = serveRelay(ctx, spec, &stops)
	default:
		err = fmt.Errorf("unknown role %q", spec.Role)
	}
	if err != nil {
		stopAll()
		report(partReady{Error: fmt.Sprintf("bench part %s: %v", spec.Role, err)})
		return 1
	}
	if path := os.Getenv(profileEnv[spec.Role]); path != "" {
		stop, err := startCPUProfile(path)
		if err != nil {
			stopAll()
			report(partReady{Error: fmt.Sprintf("bench part %s: %v", spec.Role, err)})
			return 1
		}
		stops = append(stops, stop)
	}
	report(ready)
	io.Copy(io.Discard, in) // until the bench closes our stdin
	stopAll()
	return 0
}

// EdgeProfileEnv, when set to a file path, makes the edge process write a
// CPU profile of everything it serves there (go tool pprof reads it with
// the edgebench binary): where a request's edge microseconds go.
const EdgeProfileEnv = "NOTIFYEDGE_BENCH_EDGE_CPUPROFILE"

// RelayProfileEnv is EdgeProfileEnv for the process of the outbox relay
// and the reference shipper.
const RelayProfileEnv = "NOTIFYEDGE_BENCH_RELAY_CPUPROFILE"

// profileEnv names, per part role, the variable that asks for its profile.
var profileEnv = map[string]string{roleEdge: EdgeProfileEnv, roleRelay: RelayProfileEnv}

// startCPUProfile profiles this process into path until the returned stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// serveEdge starts the edge's servers on loopback ports: the cached edge,
// its cache-off twin and the cached flow behind net/http, over one store
// with group commit (edged's default), the cached edge over a store that
// decides every delivery alone, and the admin listener (/metrics: the
// outcome counts).
func serveEdge(ctx context.Context, spec partSpec, logger *slog.Logger, stops *[]func()) (partReady, error) {
	var r partReady
	// The edge's sessions carry a name of their own, so that the Postgres
	// CPU they cost is told apart from the relay's and the shipper's.
	url := withApplicationName(spec.DBURL, edgeApplication)
	// Spans are exported as edged exports them, queries included: only
	// when the bench set the SDK's variables (Config.Traces).
	tp, err := tracing.Setup(ctx, "edge", os.Getenv)
	if err != nil {
		return r, err
	}
	*stops = append(*stops, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tp.Shutdown(sctx)
	})
	store, err := durable.New(ctx, durable.Config{URL: url, StatementTimeout: spec.Budget, GroupCommit: true,
		Tracer: instrument.Postgres(tp)})
	if err != nil {
		return r, fmt.Errorf("postgres: %w", err)
	}
	*stops = append(*stops, store.Close)
	alone, err := durable.New(ctx, durable.Config{URL: url, StatementTimeout: spec.Budget, NoMigrate: true,
		Tracer: instrument.Postgres(tp)})
	if err != nil {
		return r, fmt.Errorf("postgres: %w", err)
	}
	*stops = append(*stops, alone.Close)
	var cache edge.Cache
	if !spec.NoCache {
		client, err := claimcache.NewClient(spec.RedisURL, 25*time.Millisecond, 128)
		if err != nil {
			return r, fmt.Errorf("redis: %w", err)
		}
		*stops = append(*stops, func() { client.Close() })
		// The epoch as edged reads it: its keys, and their size, are edged's.
		// The watermark as edged keeps it: a position read per completion batch.
		if cache, err = claimcache.New(claimcache.Config{Client: client, PendingTTL: spec.Budget, LocalEntries: 100_000, Epoch: store.CacheEpoch,
			Position: store.CachePosition, OnBehind: func(ctx context.Context, epoch string, _, _ uint64) (string, error) {
				return store.BumpCacheEpochFrom(ctx, epoch)
			}}); err != nil {
			return r, fmt.Errorf("cache: %w", err)
		}
	}
	ch, err := channel.NewGeneric(channel.GenericConfig{Name: Channel, Secrets: []string{Secret}})
	if err != nil {
		return r, err
	}
	tracer := tp.Tracer("github.com/notifyedge/notifyedge/edge")
	metrics := edge.NewMetrics([]string{Channel})
	metrics.RegisterGroupCommit(store) // the group-commit store's only: the other decides alone
	// The load generator is one address standing for many channels, as a
	// proxy in front would be: no per-address connection cap.
	server, err := edge.New(edge.Config{Channels: []channel.Channel{ch}, Authority: store, Cache: cache,
		Budget: spec.Budget, Logger: logger, Metrics: metrics, MaxConnsPerIP: -1, Tracer: tracer})
	if err != nil {
		return r, err
	}
	if r.URL, err = serveLoopback(stops, server.Serve, server.Shutdown); err != nil {
		return r, err
	}
	noCache, err := edge.New(edge.Config{Channels: []channel.Channel{ch}, Authority: store, Budget: spec.Budget, Logger: logger,
		MaxConnsPerIP: -1, Tracer: tracer})
	if err != nil {
		return r, err
	}
	if r.URLNoCache, err = serveLoopback(stops, noCache.Serve, noCache.Shutdown); err != nil {
		return r, err
	}
	oneByOne, err := edge.New(edge.Config{Channels: []channel.Channel{ch}, Authority: alone, Cache: cache,
		Budget: spec.Budget, Logger: logger, MaxConnsPerIP: -1, Tracer: tracer})
	if err != nil {
		return r, err
	}
	if r.URLAlone, err = serveLoopback(stops, oneByOne.Serve, oneByOne.Shutdown); err != nil {
		return r, err
	}
	hs := &http.Server{Handler: server}
	if r.URLNetHTTP, err = serveLoopback(stops, hs.Serve, hs.Shutdown); err != nil {
		return r, err
	}
	checker := readiness.New(readiness.Config{Postgres: store.Ping})
	rctx, stopReadiness := context.WithCancel(context.Background())
	readinessDone := make(chan struct{})
	go func() { defer close(readinessDone); checker.Run(rctx) }()
	*stops = append(*stops, func() { stopReadiness(); <-readinessDone })
	admin, err := admin.New(admin.Config{Deps: admin.Deps{Reviews: store}, Metrics: metrics, Logger: logger, Readiness: checker})
	if err != nil {
		return r, err
	}
	if r.AdminURL, err = serveLoopback(stops, admin.Serve, admin.Shutdown); err != nil {
		return r, err
	}
	return r, nil
}

// edgeApplication is the application_name of the edge part's sessions,
// shipApplication the reference shipper's, relayApplication the outbox
// relay's connection (its name is the relay's own).
const (
	edgeApplication  = "notifyedge-bench-edge"
	shipApplication  = "notifyedge-bench-shipper"
	relayApplication = durable.RelayApplication
)

// withApplicationName sets application_name in a postgres:// URL.
func withApplicationName(dbURL, name string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return dbURL // durable.New reports it
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// serveRelay runs the outbox relay and the reference shipper, as a
// deployment runs them: each over a Store of its own (the shipper is a
// process of its own there), the shipper's sessions named so that their
// Postgres CPU is told apart.
func serveRelay(ctx context.Context, spec partSpec, stops *[]func()) error {
	store, err := durable.New(ctx, durable.Config{URL: spec.DBURL, StatementTimeout: spec.Budget})
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	*stops = append(*stops, store.Close)
	shipStore, err := durable.New(ctx, durable.Config{URL: spec.DBURL, Application: shipApplication,
		StatementTimeout: spec.Budget, MaxConns: 8, MinConns: 2, NoMigrate: true})
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	*stops = append(*stops, shipStore.Close)
	stream, err := redisstream.NewClient(spec.RedisURL)
	if err != nil {
		return fmt.Errorf("redis stream: %w", err)
	}
	*stops = append(*stops, func() { stream.Close() })
	rctx, cancel := context.WithCancel(context.Background())
	relayDone, shipDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(relayDone)
		store.RunRelay(rctx, durable.RelayConfig{Publisher: redisstream.NewPublisher(stream, "", 0), Poll: 200 * time.Millisecond})
	}()
	go func() {
		defer close(shipDone)
		redisstream.RunConsumer(rctx, redisstream.ConsumerConfig{Client: stream, Group: "shipper", Name: "shipper-1",
			Block: 100 * time.Millisecond, ClaimIdle: 5 * time.Second, HandleBatch: shipping.OnPaidBatch(shipStore, "shipper", nil)})
	}()
	*stops = append(*stops, func() { cancel(); <-relayDone; <-shipDone })
	return nil
}

// serveLoopback serves on a fresh loopback port until the part stops, and
// returns the http:// base URL.
func serveLoopback(stops *[]func(), serve func(net.Listener) error, shutdown func(context.Context) error) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("listen: %w", err)
	}
	go serve(ln)
	*stops = append(*stops, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shutdown(sctx)
	})
	return "http://" + ln.Addr().String(), nil
}

// part is a running part, seen from the bench.
type part struct {
	ready  partReady
	cmd    *exec.Cmd
	stdin  *os.File // closing it stops the part
	exited chan struct{}
}

// startPart re-executes this binary as the part spec describes and returns
// once it serves. Its logs (stderr) go to logs.
func startPart(ctx context.Context, spec partSpec, logs io.Writer) (*part, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench: part %s: %w", spec.Role, err)
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("bench: part %s: %w", spec.Role, err)
	}
	// Pipes of our own rather than cmd's: Wait, running from the start,
	// would close cmd's pipes under a reader that has not finished.
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("bench: part %s: %w", spec.Role, err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, fmt.Errorf("bench: part %s: %w", spec.Role, err)
	}
	tail := &tailWriter{max: 4 << 10}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), partEnv+"="+string(raw))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, io.MultiWriter(logs, tail)
	// Killed with us, as the throwaway Postgres and redis-server are.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &part{cmd: cmd, stdin: inW, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig follows the thread that forked the child, and Go may
		// retire idle threads: keep this one for the child's life.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(p.exited)
			return
		}
		started <- nil
		cmd.Wait()
		close(p.exited)
	}()
	err = <-started
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("bench: start part %s: %w", spec.Role, err)
	}
	line := make(chan []byte, 1)
	go func() {
		defer outR.Close()
		br := bufio.NewReader(outR)
		b, _ := br.ReadBytes('\n')
		line <- b
		// Read on until the part exits: a Go program writing to a closed
		// stdout dies of SIGPIPE.
		io.Copy(io.Discard, br)
	}()
	fail := func(err error) (*part, error) {
		p.stop()
		if t := tail.String(); t != "" {
			err = fmt.Errorf("%w; its stderr ends: %s", err, t)
		}
		return nil, fmt.Errorf("bench: part %s: %w", spec.Role, err)
	}
	select {
	case b := <-line:
		if err := json.Unmarshal(b, &p.ready); err != nil {
			return fail(fmt.Errorf("no readiness line (%q): %w", b, err))
		}
		if p.ready.Error != "" {
			return fail(errors.New(p.ready.Error))
		}
		return p, nil
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-time.After(60 * time.Second):
		return fail(errors.New("not ready within 60 s"))
	}
}

// pid is the part's process id.
func (p *part) pid() int { return p.cmd.Process.Pid }

// stop closes the part's stdin, which stops it, and waits for it to exit
// (killing it after 10 s).
func (p *part) stop() {
	p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (w *tailWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, b...)
	if len(w.b) > w.max {
		w.b = append(w.b[:0], w.b[len(w.b)-w.max:]...)
	}
	return len(b), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}
