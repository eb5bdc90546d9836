package admin

import (
	"cmp"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/admin/console"
	"github.com/notifyedge/notifyedge/edge/readiness"
)

// ReviewQueue is the review queue the admin endpoints serve.
// *durable.Store satisfies it.
type ReviewQueue interface {
	Reviews(ctx context.Context, q durable.ReviewQuery) ([]durable.Review, error)
	Review(ctx context.Context, id int64) (durable.Review, error)
	ResolveReview(ctx context.Context, id int64, resolution, by string) (durable.Review, error)
	ResolveRedriven(ctx context.Context, id int64, resolution, by string, replayed bool) (bool, error)
}

// Readiness holds the last result of the probes /readyz reports: it
// answers at once, whatever Postgres and Redis do. *readiness.Checker
// satisfies it.
type Readiness interface {
	State() readiness.State
}

// Config configures the admin listener.
type Config struct {
	// Token is EDGE_ADMIN_TOKEN: it opens every endpoint but /metrics,
	// /healthz and /readyz, which need none; empty refuses them all.
	Token string
	// OrdersToken is EDGE_ORDERS_TOKEN: it opens /orders only (order
	// systems must not read review bodies); empty: only Token opens it.
	OrdersToken string
	// Deps, when Reviews and Postgres are set, are attached at once;
	// otherwise the listener starts without them (see Attach).
	Deps
	// Metrics are served on /metrics (required).
	Metrics *edge.Metrics
	// Draining reports a drain in progress: /readyz then answers 503.
	Draining func() bool
	// Readiness is what /readyz reports of Postgres and Redis (required).
	Readiness Readiness
	// RelayState reports "running"/"degraded"/"standby"/"off" for /readyz
	// (nil: "off").
	RelayState func() string
	// RelayDetail says why the relay is "degraded" ("" otherwise): /readyz
	// shows it as relay_detail.
	RelayDetail func() string
	// Channels are the names of the configured channels: PUT /orders
	// refuses any other (nil: any name).
	Channels []string
	// Reload re-reads the credentials for POST /reload (nil: that endpoint
	// is not served). Its error, if any, names the variable and the reason.
	Reload func(ctx context.Context) error
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// Deps are what the admin listener asks of Postgres and of the public
// listener: they exist once Postgres answers. *durable.Store is every
// store; *edge.Server is the Redriver.
type Deps struct {
	// Orders serves /orders; Redrive decides review rows again; CacheEpoch
	// serves POST /cache/epoch (nil: those endpoints are 404).
	Orders     OrderStore
	Redrive    Redriver
	CacheEpoch EpochBumper
	// Reconcile serves POST /orders/{order_no}/reconcile (nil: 404, as
	// with reconciliation off).
	Reconcile Reconciler
	// Bills serves /bills (nil: 404).
	Bills BillBook
	// Reviews serves /review (required).
	Reviews ReviewQueue
}

// Server is the admin listener: /metrics, /healthz, /readyz, the review
// queue, the orders API, the cache epoch and reload.
type Server struct {
	cfg Config
	// deps are swapped in whole once Postgres answers (nil until then:
	// /readyz says "starting" and what needs Postgres answers 503).
	deps    atomic.Pointer[Deps]
	log     *slog.Logger
	httpLog fasthttp.Logger
	metrics fasthttp.RequestHandler
	fast    *fasthttp.Server
}

// New returns the admin listener for cfg: serving, with cfg.Deps attached
// if they are set, or starting until Attach.
func New(cfg Config) (*Server, error) {
	if cfg.Metrics == nil || cfg.Readiness == nil {
		return nil, errors.New("admin: Metrics and Readiness are required")
	}
	a := &Server{cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default())}
	if cfg.Reviews != nil {
		if err := a.Attach(cfg.Deps); err != nil {
			return nil, err
		}
	}
	a.httpLog = edge.NewHTTPLogger(a.log, cfg.Metrics.LogsDropped)
	a.metrics = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(cfg.Metrics.Registry, promhttp.HandlerOpts{}))
	a.fast = &fasthttp.Server{
		Handler:               a.handle,
		ErrorHandler:          a.handleFastError,
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          30 * time.Second,
		IdleTimeout:           60 * time.Second,
		MaxRequestBodySize:    adminMaxBody,
		SecureErrorLogMessage: true,
		NoDefaultServerHeader: true,
		Logger:                a.httpLog,
	}
	return a, nil
}

// Attach swaps in the dependencies that exist once Postgres answers, all at
// once: until then the listener serves health, readiness ("starting") and
// metrics, and answers 503 where Postgres is needed.
func (a *Server) Attach(d Deps) error {
	if d.Reviews == nil {
		return errors.New("admin: Reviews is required")
	}
	a.deps.Store(&d)
	return nil
}

// starting answers what needs Postgres before Attach.
func starting(ctx *fasthttp.RequestCtx) {
	jsonError(ctx, http.StatusServiceUnavailable, "starting: Postgres is not ready yet; retry")
}

// Serve serves the admin endpoints on ln until Shutdown.
func (a *Server) Serve(ln net.Listener) error { return a.fast.Serve(ln) }

// Shutdown stops the admin listener.
func (a *Server) Shutdown(ctx context.Context) error { return a.fast.ShutdownWithContext(ctx) }

// adminMaxBody bounds an admin request's body.
const adminMaxBody = 64 << 10

// bearerToken returns the credentials of an Authorization header of the
// Bearer scheme; the scheme's name is case-insensitive (RFC 9110 11.1).
func bearerToken(h []byte) ([]byte, bool) {
	const scheme = "bearer "
	if len(h) < len(scheme) || !strings.EqualFold(string(h[:len(scheme)]), scheme) {
		return nil, false
	}
	return h[len(scheme):], true
}

// handle serves one admin request. A panic is answered 500 and logged once
// with its stack: the public listener shares the process, and one bad
// request on the admin side must never take it down.
func (a *Server) handle(ctx *fasthttp.RequestCtx) {
	defer func() {
		if p := recover(); p != nil {
			a.log.Error("panic in admin handler", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			ctx.Response.Reset()
			jsonError(ctx, http.StatusInternalServerError, "internal error")
		}
	}()
	if console.Owns(ctx.Request.URI().PathOriginal()) {
		console.Serve(ctx)
		return
	}
	r := parseAdminRoute(ctx.Method(), ctx.Request.URI().PathOriginal())
	if r.ep == epNone {
		jsonError(ctx, http.StatusNotFound, "no such admin endpoint")
		return
	}
	if r.allowed != "" {
		ctx.Response.Header.Set("Allow", r.allowed)
		jsonError(ctx, http.StatusMethodNotAllowed, "method not allowed: use "+r.allowed)
		return
	}
	d := a.deps.Load()
	switch r.ep {
	case epMetrics:
		a.metrics(ctx)
	case epHealthz:
		ctx.SetContentType("text/plain")
		ctx.SetBodyString("ok\n")
	case epReadyz:
		a.readyz(ctx, d)
	case epReload:
		switch {
		case a.cfg.Reload == nil:
			jsonError(ctx, http.StatusNotFound, "no such admin endpoint")
		case a.authorized(ctx):
			a.reload(ctx)
		}
	case epOrder, epOrderEvents, epOrderRecon:
		switch {
		case d != nil && (d.Orders == nil || r.ep == epOrderRecon && d.Reconcile == nil):
			jsonError(ctx, http.StatusNotFound, "no such admin endpoint")
		case !a.authorized(ctx, a.cfg.OrdersToken):
		case d == nil:
			starting(ctx)
		case r.ep == epOrder:
			a.orders(ctx, d, r.orderNo)
		case r.ep == epOrderRecon:
			a.reconcile(ctx, d, r.orderNo)
		default:
			a.orderEvent(ctx, d, r.orderNo)
		}
	default:
		a.operator(ctx, d, r)
	}
}

// operator serves the endpoints that take the admin token only.
func (a *Server) operator(ctx *fasthttp.RequestCtx, d *Deps, r adminRoute) {
	switch {
	case d != nil && (r.ep == epReviewRedrive && d.Redrive == nil || r.ep == epCacheEpoch && d.CacheEpoch == nil ||
		(r.ep == epBills || r.ep == epBillRun) && d.Bills == nil):
		jsonError(ctx, http.StatusNotFound, "no such admin endpoint")
		return
	case !a.authorized(ctx):
		return
	case d == nil:
		starting(ctx)
		return
	}
	switch r.ep {
	case epReviews:
		a.listReviews(ctx, d)
	case epReviewResolve:
		a.resolve(ctx, d, r.id)
	case epReviewRedrive:
		a.redrive(ctx, d, r.id)
	case epCacheEpoch:
		a.bumpEpoch(ctx, d)
	case epBills:
		a.bills(ctx, d)
	case epBillRun:
		a.billRun(ctx, d, r.channel, r.date)
	default:
		jsonError(ctx, http.StatusNotFound, "no such admin endpoint")
	}
}

// handleFastError answers what fasthttp refused before the handler, in
// the same JSON as every other admin answer.
func (a *Server) handleFastError(ctx *fasthttp.RequestCtx, err error) {
	code, msg := edge.FastErrorAnswer(err, adminMaxBody)
	jsonError(ctx, code, msg)
}

// readyz answers from the probes' last result (Config.Readiness), never
// waiting for Postgres or Redis: 200 while Postgres answers, or while
// every node lost it ("outage":"shared": leaving rotation would refuse
// what the cache still answers); 503 while starting, draining, or when
// this node alone lost it, or cannot tell.
func (a *Server) readyz(ctx *fasthttp.RequestCtx, d *Deps) {
	st := a.cfg.Readiness.State()
	body := struct {
		Postgres    string `json:"postgres"`
		Outage      string `json:"outage,omitempty"`
		Redis       string `json:"redis"`
		Relay       string `json:"relay"`
		RelayDetail string `json:"relay_detail,omitempty"`
		Draining    bool   `json:"draining,omitempty"`
	}{Postgres: st.Postgres, Outage: st.Outage, Redis: st.Redis, Relay: "off"}
	if a.cfg.RelayState != nil {
		body.Relay = a.cfg.RelayState()
	}
	if a.cfg.RelayDetail != nil {
		body.RelayDetail = a.cfg.RelayDetail()
	}
	code := http.StatusOK
	if !st.Ready() {
		code = http.StatusServiceUnavailable
	}
	if d == nil {
		body.Postgres, body.Outage, code = "starting", "", http.StatusServiceUnavailable
	}
	if a.cfg.Draining != nil && a.cfg.Draining() {
		body.Draining, code = true, http.StatusServiceUnavailable
	}
	writeJSON(ctx, code, body)
}

// authorized checks the bearer token in constant time against the admin
// token and any extra tokens the endpoint also takes; a token that is not
// configured (empty) opens nothing, so with none configured it refuses
// everyone.
func (a *Server) authorized(ctx *fasthttp.RequestCtx, extra ...string) bool {
	got, ok := bearerToken(ctx.Request.Header.Peek("Authorization"))
	if ok {
		for _, tok := range append([]string{a.cfg.Token}, extra...) {
			if tok != "" && subtle.ConstantTimeCompare(got, []byte(tok)) == 1 {
				return true
			}
		}
	}
	ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="notifyedge-admin"`)
	jsonError(ctx, http.StatusUnauthorized, "missing or wrong bearer token")
	return false
}

// reviewJSON is one review row as the admin API shapes it.
type reviewJSON struct {
	ID          int64      `json:"id"`
	BizKey      string     `json:"biz_key"`
	OrderNo     string     `json:"order_no"`
	Reason      string     `json:"reason"`
	PayloadHash string     `json:"payload_hash"`
	RawBody     string     `json:"raw_body"`
	CreatedAt   time.Time  `json:"created_at"`
	ResolvedAt  *time.Time `json:"resolved_at"`
	Resolution  *string    `json:"resolution"`
	ResolvedBy  *string    `json:"resolved_by"`
}

func toReviewJSON(r durable.Review) reviewJSON {
	out := reviewJSON{ID: r.ID, BizKey: r.BizKey, OrderNo: r.OrderNo, Reason: string(r.Reason),
		PayloadHash: r.PayloadHash, RawBody: r.RawBody, CreatedAt: r.CreatedAt.UTC(),
		Resolution: r.Resolution, ResolvedBy: r.ResolvedBy}
	if r.ResolvedAt != nil {
		t := r.ResolvedAt.UTC()
		out.ResolvedAt = &t
	}
	return out
}

func (a *Server) listReviews(ctx *fasthttp.RequestCtx, d *Deps) {
	args := ctx.QueryArgs()
	q := durable.ReviewQuery{State: durable.ReviewState(cmp.Or(string(args.Peek("state")), "open"))}
	switch q.State {
	case durable.ReviewOpen, durable.ReviewResolved, durable.ReviewAll:
	default:
		jsonError(ctx, http.StatusBadRequest, "state: must be open, resolved or all")
		return
	}
	if v := args.Peek("reason"); len(v) > 0 {
		q.Reason = durable.ReviewReason(v)
		if !slices.Contains(durable.ReviewReasons, q.Reason) {
			jsonError(ctx, http.StatusBadRequest, "reason: not a review reason")
			return
		}
	}
	var err error
	if v := args.Peek("limit"); len(v) > 0 {
		if q.Limit, err = strconv.Atoi(string(v)); err != nil || q.Limit < 1 || q.Limit > 1000 {
			jsonError(ctx, http.StatusBadRequest, "limit: must be 1 to 1000")
			return
		}
	}
	if v := args.Peek("after_id"); len(v) > 0 {
		if q.AfterID, err = strconv.ParseInt(string(v), 10, 64); err != nil || q.AfterID < 1 {
			jsonError(ctx, http.StatusBadRequest, "after_id: must be a positive id")
			return
		}
	}
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := d.Reviews.Reviews(rctx, q)
	if err != nil {
		a.log.Error("list reviews", "error", err)
		jsonError(ctx, http.StatusServiceUnavailable, "review queue unavailable")
		return
	}
	page := struct {
		Items       []reviewJSON `json:"items"`
		NextAfterID *int64       `json:"next_after_id"`
	}{Items: make([]reviewJSON, 0, len(rows))}
	for _, r := range rows {
		page.Items = append(page.Items, toReviewJSON(r))
	}
	if limit := cmp.Or(q.Limit, 50); len(rows) == limit {
		last := rows[len(rows)-1].ID
		page.NextAfterID = &last
	}
	writeJSON(ctx, http.StatusOK, page)
}

func (a *Server) resolve(ctx *fasthttp.RequestCtx, d *Deps, id int64) {
	var req struct {
		Resolution string `json:"resolution"`
		By         string `json:"by"`
	}
	if err := decodeStrict(ctx.PostBody(), &req); err != nil {
		jsonError(ctx, http.StatusBadRequest, err.Error())
		return
	}
	if err := requiredText("resolution", req.Resolution); err != nil {
		jsonError(ctx, http.StatusBadRequest, err.Error())
		return
	}
	if err := requiredText("by", req.By); err != nil {
		jsonError(ctx, http.StatusBadRequest, err.Error())
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := d.Reviews.ResolveReview(rctx, id, req.Resolution, req.By)
	switch {
	case errors.Is(err, durable.ErrReviewNotFound):
		jsonError(ctx, http.StatusNotFound, "no such review")
	case errors.Is(err, durable.ErrReviewResolved):
		jsonError(ctx, http.StatusConflict, "review already resolved")
	case err != nil:
		a.log.Error("resolve review", "id", id, "error", err)
		jsonError(ctx, http.StatusServiceUnavailable, "review queue unavailable")
	default:
		a.log.Info("review resolved", "id", r.ID, "biz_key", r.BizKey, "reason", string(r.Reason),
			"resolution", req.Resolution, "by", req.By)
		writeJSON(ctx, http.StatusOK, toReviewJSON(r))
	}
}

func writeJSON(ctx *fasthttp.RequestCtx, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic("BUG: marshal admin response: " + err.Error())
	}
	ctx.SetStatusCode(code)
	ctx.SetContentType("application/json")
	// Answers hold raw callback bodies and order data: never kept by a
	// cache, never taken for another type.
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.Response.Header.Set("X-Content-Type-Options", "nosniff")
	ctx.SetBody(append(b, '\n'))
}

func jsonError(ctx *fasthttp.RequestCtx, code int, msg string) {
	writeJSON(ctx, code, struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{"FAIL", msg})
}

// reload re-reads the credentials: 200 {"result":"ok"}, or 500 with the
// reason and the old set still in force.
func (a *Server) reload(ctx *fasthttp.RequestCtx) {
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx.SetContentType("application/json")
	if err := a.cfg.Reload(rctx); err != nil {
		ctx.SetStatusCode(http.StatusInternalServerError)
		body, _ := json.Marshal(map[string]string{"result": "error", "message": err.Error()})
		ctx.SetBody(body)
		return
	}
	ctx.SetBodyString(`{"result":"ok"}`)
}
