package edge

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge/channel"
)

// Config configures a Server. Zero fields take the defaults noted.
type Config struct {
	// Channels are the configured channels (at least one).
	Channels []channel.Channel
	// Authority decides deliveries. nil: none yet (SetAuthority swaps it in
	// once the database answers; until then every delivery that needs it
	// is 503).
	Authority Authority
	// Cache answers hot duplicates (nil: off, Postgres answers everything).
	Cache Cache
	// Budget is the latency budget from request read to response written
	// (default 200ms).
	Budget time.Duration
	// MaxBody is the largest accepted body in bytes (default 64 KiB).
	MaxBody int
	// Metrics (default NewMetrics of the channel names).
	Metrics *Metrics
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// ReadTimeout and WriteTimeout bound slow clients (defaults 5s, 5s);
	// IdleTimeout closes a keep-alive connection that sends nothing
	// (default 5s: channels open a connection per burst of callbacks, and
	// an idle connection is a slot an attacker holds for free).
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// Concurrency caps the connections open at once (default 4096).
	Concurrency int
	// MaxConnsPerIP caps the connections open at once from one client
	// address (default 256, negative: no cap), so that one client cannot
	// take every slot. Behind a proxy every connection comes from the
	// proxy: set it to no cap there and limit per source at the proxy.
	MaxConnsPerIP int
	// Tracer, when set, gives every routed callback a server span
	// ("notify <channel>", a child of the traceparent it carries) with
	// children for the claim and the decision (nil: no tracing, and no
	// tracing branch taken on any path).
	Tracer trace.Tracer
}

// Server is the public callback endpoint.
type Server struct {
	channels      atomic.Pointer[map[string]channel.Channel] // swapped whole by SetChannels
	spanNames     atomic.Pointer[map[string]string]          // the channels' server span names, with them
	authority     atomic.Pointer[Authority]                  // nil until SetAuthority
	cache         Cache
	budget        time.Duration
	durableBudget time.Duration // the durable step's deadline
	maxBody       int
	metrics       *Metrics
	log           *slog.Logger
	httpLog       *httpLog // rejections and fasthttp's own lines, rate-limited
	fast          *fasthttp.Server
	draining      atomic.Bool
	maxConns      int
	maxConnsPerIP int
	cleanup       *cacheCleanup // nil without a cache
	tracer        trace.Tracer  // nil: tracing off
}

// SetChannels replaces the channel set at once (a credentials reload): a
// request reads the set once, so it sees the old one or the new one, never
// a mix; requests in flight finish with the set they started with.
func (s *Server) SetChannels(chs []channel.Channel) error {
	set := make(map[string]channel.Channel, len(chs))
	for _, ch := range chs {
		if _, dup := set[ch.Name()]; dup {
			return fmt.Errorf("edge: channel %s configured twice", ch.Name())
		}
		set[ch.Name()] = ch
	}
	names := make(map[string]string, len(set))
	for name := range set {
		names[name] = "notify " + name
	}
	s.spanNames.Store(&names)
	s.channels.Store(&set)
	return nil
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if len(cfg.Channels) == 0 {
		return nil, errors.New("edge: no channel configured")
	}
	s := &Server{
		cache:    cfg.Cache,
		budget:   cmp.Or(cfg.Budget, 200*time.Millisecond),
		maxBody:  cmp.Or(cfg.MaxBody, 64<<10),
		log:      cmp.Or(cfg.Logger, slog.Default()),
		maxConns: cmp.Or(cfg.Concurrency, 4096),
		tracer:   cfg.Tracer,
	}
	s.maxConnsPerIP = max(cmp.Or(cfg.MaxConnsPerIP, 256), 0)
	names := make([]string, 0, len(cfg.Channels))
	for _, ch := range cfg.Channels {
		names = append(names, ch.Name())
	}
	if cfg.Authority != nil {
		s.SetAuthority(cfg.Authority)
	}
	if err := s.SetChannels(cfg.Channels); err != nil {
		return nil, err
	}
	s.metrics = cfg.Metrics
	if s.metrics == nil {
		s.metrics = NewMetrics(names)
	}
	s.httpLog = newHTTPLog(s.log, s.metrics.LogsDropped)
	if s.cache != nil {
		s.cleanup = newCacheCleanup(s.cache, s.tracer)
	}
	margin := min(s.budget/10, 20*time.Millisecond)
	s.durableBudget = s.budget - margin
	s.fast = &fasthttp.Server{
		Handler:            s.HandleFastHTTP,
		ErrorHandler:       s.handleFastError,
		MaxRequestBodySize: s.maxBody,
		ReadTimeout:        cmp.Or(cfg.ReadTimeout, 5*time.Second),
		WriteTimeout:       cmp.Or(cfg.WriteTimeout, 5*time.Second),
		IdleTimeout:        cmp.Or(cfg.IdleTimeout, 5*time.Second),
		// The connection caps are the listener's (Serve): fasthttp's own
		// refusals are plain text. Its cap stays above ours, never reached.
		Concurrency:                   s.maxConns + 1,
		SecureErrorLogMessage:         true,
		NoDefaultServerHeader:         true,
		NoDefaultContentType:          true,
		DisablePreParseMultipartForm:  true,
		DisableHeaderNamesNormalizing: false,
		CloseOnShutdown:               true,
		Logger:                        s.httpLog,
	}
	return s, nil
}

// Serve answers callbacks on ln until Shutdown, within the connection caps.
func (s *Server) Serve(ln net.Listener) error {
	refused := func(reason string) { s.metrics.ConnsRefused.WithLabelValues(reason).Inc() }
	return s.fast.Serve(newConnLimiter(ln, s.maxConns, s.maxConnsPerIP, refused))
}

// Drain marks the server as draining: /readyz answers 503 from now on, so a
// load balancer stops sending before the listener closes.
func (s *Server) Drain() { s.draining.Store(true) }

// Draining reports whether Drain was called.
func (s *Server) Draining() bool { return s.draining.Load() }

// Shutdown drains, stops accepting, and waits for in-flight requests until
// ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.Drain()
	err := s.fast.ShutdownWithContext(ctx)
	if s.cleanup != nil {
		s.cleanup.close(ctx) // after the last answer: nothing enqueues any more
	}
	return err
}

// HeaderReplayed marks an answer that replays a stored first answer.
const HeaderReplayed = "Idempotent-Replayed"

var (
	notifyPrefix   = []byte("/notify/")
	headerReplayed = HeaderReplayed
	valueTrue      = []byte("true")
	// A 503 (Postgres unreachable, the budget spent) says when to come
	// back: a failover takes seconds.
	headerRetryAfter = []byte("Retry-After")
	valueRetryAfter  = []byte("5")
	methodNotPost    = "method not allowed: use POST"
	noSuchPath       = "no such path: POST /notify/{channel}"
	headerAllow      = "Allow"
	valuePost        = []byte("POST")
)

// HandleFastHTTP is the fasthttp handler of the public endpoint.
func (s *Server) HandleFastHTTP(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	x := getExchange()
	defer putExchange(x)
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("panic in handler", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			x.channel = nil
			s.fail(x, OutcomeInternal, "", "")
			s.write(ctx, x)
			s.finish(start, x)
		}
	}()
	if s.route(x, ctx.Path(), ctx.IsPost()) {
		x.req.ContentType = ctx.Request.Header.ContentType()
		x.req.Body = ctx.PostBody()
		x.req.Header = &ctx.Request.Header
		s.traced(start, x)
	} else if x.verdict.HTTP == http.StatusMethodNotAllowed {
		ctx.Response.Header.SetBytesV(headerAllow, valuePost)
	}
	s.write(ctx, x)
	s.finish(start, x)
}

// traced is decide within the request's server span when the server has a
// tracer; without one, decide alone.
func (s *Server) traced(start time.Time, x *exchange) {
	if s.tracer == nil {
		s.decide(start, x)
		return
	}
	s.startTrace(start, x)
	defer s.endTrace(x)
	s.decide(start, x)
}

// route applies the rules both transports share: a POST under /notify/
// goes on (x.req.Channel set, true); any other path is 404 and any other
// method under /notify/ is 405 (the caller adds Allow), both counted as
// bad_request.
func (s *Server) route(x *exchange, path []byte, post bool) bool {
	channel, ok := bytes.CutPrefix(path, notifyPrefix)
	if !ok {
		s.fail(x, OutcomeBadRequest, "", noSuchPath)
		x.verdict.HTTP = http.StatusNotFound
		return false
	}
	x.req.Channel = channel // also the metrics label: unconfigured names count as "unknown"
	if !post {
		s.fail(x, OutcomeBadRequest, "", methodNotPost)
		x.verdict.HTTP = http.StatusMethodNotAllowed
		return false
	}
	return true
}

// write copies the answer into the response (fasthttp owns the copy).
func (s *Server) write(ctx *fasthttp.RequestCtx, x *exchange) {
	ctx.SetStatusCode(x.verdict.HTTP)
	if x.ctype != "" {
		ctx.SetContentType(x.ctype)
	}
	if x.replayed {
		ctx.Response.Header.SetBytesV(headerReplayed, valueTrue)
	}
	if x.verdict.HTTP == http.StatusServiceUnavailable {
		ctx.Response.Header.SetBytesKV(headerRetryAfter, valueRetryAfter)
	}
	ctx.SetBody(x.body)
}

// handleFastError answers what fasthttp refused before the handler: a body
// over MaxBody (413, where fasthttp's default says 400), a read timeout, a
// malformed request.
func (s *Server) handleFastError(ctx *fasthttp.RequestCtx, err error) {
	start := time.Now()
	x := getExchange()
	defer putExchange(x)
	if path := ctx.Path(); bytes.HasPrefix(path, notifyPrefix) {
		x.req.Channel = path[len(notifyPrefix):] // for the metrics label only
	}
	code, msg := fastErrorAnswer(err, s.maxBody)
	o := OutcomeBadRequest
	if code == http.StatusRequestEntityTooLarge {
		o = OutcomeTooLarge
	}
	s.fail(x, o, "", msg)
	x.verdict.HTTP = code
	s.write(ctx, x)
	s.finish(start, x)
}

// SetAuthority swaps in the authority, whole, as SetChannels swaps the
// channel set: a process may open its listeners before the database
// answers and hand the authority over once it does.
func (s *Server) SetAuthority(a Authority) { s.authority.Store(&a) }

// errNoAuthority answers a delivery that arrived before SetAuthority.
var errNoAuthority = errors.New("edge: no authority yet: the database is not ready")

// auth returns the authority, or a stand-in that answers errNoAuthority.
func (s *Server) auth() Authority {
	if a := s.authority.Load(); a != nil {
		return *a
	}
	return authorityNotYet{}
}

// authorityNotYet is the authority before SetAuthority.
type authorityNotYet struct{}

func (authorityNotYet) Process(context.Context, durable.Notification) (durable.Result, error) {
	return durable.Result{}, errNoAuthority
}

func (authorityNotYet) RecordReview(context.Context, durable.Notification, durable.ReviewReason) error {
	return errNoAuthority
}

// FastErrorAnswer maps what fasthttp refused before a handler (of any of
// the process's listeners, whose largest body is maxBody) to a status and a
// message that holds none of the request's bytes.
func FastErrorAnswer(err error, maxBody int) (int, string) { return fastErrorAnswer(err, maxBody) }

// fastErrorAnswer maps what fasthttp refused before a handler to a status
// and a message that holds none of the request's bytes.
func fastErrorAnswer(err error, maxBody int) (int, string) {
	var netErr net.Error
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", maxBody)
	case errors.As(err, &small):
		return http.StatusRequestHeaderFieldsTooLarge, "request headers too large"
	case errors.As(err, &netErr) && netErr.Timeout():
		return http.StatusRequestTimeout, "request read timed out"
	}
	return http.StatusBadRequest, "malformed HTTP request"
}

// ServeHTTP is the same flow behind net/http, for comparison and for users
// who mount notifyedge in an existing net/http server.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	x := getExchange()
	defer putExchange(x)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.maxBody)))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		s.fail(x, OutcomeTooLarge, "", fmt.Sprintf("body larger than %d bytes", s.maxBody))
	case err != nil:
		s.fail(x, OutcomeBadRequest, "", "body could not be read")
	case s.route(x, []byte(r.URL.Path), r.Method == http.MethodPost):
		x.req.ContentType = []byte(r.Header.Get("Content-Type"))
		x.req.Body = body
		x.req.Header = httpHeader(r.Header)
		s.traced(start, x)
	case x.verdict.HTTP == http.StatusMethodNotAllowed:
		w.Header().Set(headerAllow, http.MethodPost)
	}
	if x.ctype != "" {
		w.Header().Set("Content-Type", x.ctype)
	}
	if x.replayed {
		w.Header().Set(headerReplayed, "true")
	}
	if x.verdict.HTTP == http.StatusServiceUnavailable {
		w.Header().Set(string(headerRetryAfter), string(valueRetryAfter))
	}
	w.WriteHeader(x.verdict.HTTP)
	_, _ = w.Write(x.body)
	s.finish(start, x)
}

// httpHeader adapts net/http headers to channel.HeaderReader.
type httpHeader http.Header

func (h httpHeader) Peek(name string) []byte { return []byte(http.Header(h).Get(name)) }

func (h httpHeader) PeekAll(name string) [][]byte {
	vs := http.Header(h).Values(name)
	out := make([][]byte, len(vs))
	for i, v := range vs {
		out[i] = []byte(v)
	}
	return out
}
