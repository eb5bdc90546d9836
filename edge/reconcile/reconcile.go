// Package reconcile asks the payment channels about orders still
// PENDING_PAY, in case every callback of their payment was lost, and
// decides a paid answer exactly as the trade's callback would be decided:
// the same adapter mapping, key, digest and reviews, through the same
// authority, so that whichever of the two comes second is a replay.
//
// One node asks at a time (a session advisory lock), on a back-off from the
// order's registration until a horizon, at most Rate queries a second per
// channel, on the operator pool: never on the callbacks' connections or
// budget. The channels are asked through their own SDKs (package query);
// nothing here is on the hot path.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/reconcile/query"
)

// Store is what the reconciler reads and writes. *durable.Store satisfies
// it.
type Store interface {
	DueOrders(ctx context.Context, w durable.ReconcileWindow, limit int) ([]durable.DueOrder, error)
	ScheduleReconcile(ctx context.Context, orderNo string, w durable.ReconcileWindow, r durable.Reconciled) error
	ReconcileTarget(ctx context.Context, orderNo string) (durable.DueOrder, durable.State, error)
	RunLeader(ctx context.Context, cfg durable.LeaderConfig, lead func(context.Context) error)
}

// Decider decides a delivery built from a paid answer through the channel's
// adapter and an authority. *edge.Server satisfies it.
type Decider interface {
	DecideStored(ctx context.Context, a edge.Authority, channelName string, body []byte, review bool) (channel.Verdict, edge.Outcome, error)
	// ReviewStored opens a review row for the stored delivery, deciding
	// nothing.
	ReviewStored(ctx context.Context, a edge.Authority, channelName string, body []byte, reason durable.ReviewReason) error
}

// Querier asks one channel about one order. The channels' SDK clients of
// package query satisfy it.
type Querier interface {
	Query(ctx context.Context, orderNo string) (query.Answer, error)
}

// The results of one query, as notifyedge_reconcile_total counts them.
const (
	ResultApplied  = "applied"   // paid, and the decision applied it: a lost callback
	ResultSkipped  = "skipped"   // paid, and the decision applied nothing (the callback had, or a review opened)
	ResultPending  = "pending"   // not paid yet
	ResultClosed   = "closed"    // closed at the channel: not asked again
	ResultRefunded = "refunded"  // paid and refunded at the channel: never applied, a review opened, not asked again
	ResultNotFound = "not_found" // the channel does not know the order
	ResultError    = "error"     // not asked, or the answer failed verification
)

// Results lists every result, for the metric's series.
var Results = []string{ResultApplied, ResultSkipped, ResultPending, ResultClosed, ResultRefunded, ResultNotFound, ResultError}

// DefaultBackoff is the wait after each answered query: about 10m, 30m,
// 1h, 3h, 6h, then every 12h, until the horizon.
var DefaultBackoff = []time.Duration{10 * time.Minute, 30 * time.Minute, time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour}

// Config configures a Reconciler. Zero fields take the defaults noted.
type Config struct {
	Store   Store
	Decider Decider
	// Authority decides on the operator pool (durable.Store.ProcessOps
	// behind edge.Authority): never the callbacks' pool or budget.
	Authority edge.Authority
	// Window: first asked After past registration, never Horizon past it.
	Window durable.ReconcileWindow
	// Rate is the most queries a second per channel (default 10).
	Rate float64
	// ManualRate is the most queries a second per channel that Ask (POST
	// /orders/{order_no}/reconcile) makes, from a budget of its own, so
	// that a burst of them never delays the background's queries (default
	// a tenth of Rate, at least 1). A channel sees at most Rate+ManualRate.
	ManualRate float64
	// Backoff is the wait after each answered query (default
	// DefaultBackoff; the last step repeats).
	Backoff []time.Duration
	// Poll is how often the leader looks for due orders when none were
	// due, and a standby tries for leadership (default 1s).
	Poll time.Duration
	// Batch is how many due orders the leader reads at a time, Workers how
	// many it asks about at once (defaults 64 and 8): the rate limit holds
	// per channel whatever their number.
	Batch, Workers int
	// DecideTimeout bounds one decision (default 5s).
	DecideTimeout time.Duration
	// OnResult counts one query's result (notifyedge_reconcile_total).
	OnResult func(channel, result string)
	// OnState reports "leader" or "standby".
	OnState func(string)
	Logger  *slog.Logger
}

// Reconciler asks the channels about due orders. Its channel set is
// swapped whole (SetQueriers) when the credentials are reloaded.
type Reconciler struct {
	cfg      Config
	queriers atomic.Pointer[map[string]Querier]
	mu       sync.Mutex
	limiters map[string]*rate.Limiter
}

// New returns a Reconciler for cfg.
func New(cfg Config) (*Reconciler, error) {
	if cfg.Store == nil || cfg.Decider == nil || cfg.Authority == nil {
		return nil, errors.New("reconcile: Store, Decider and Authority are required")
	}
	if cfg.Window.After <= 0 || cfg.Window.Horizon <= cfg.Window.After {
		return nil, fmt.Errorf("reconcile: the horizon (%s) must be past the first query (%s)", cfg.Window.Horizon, cfg.Window.After)
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 10
	}
	if cfg.ManualRate <= 0 {
		cfg.ManualRate = max(1, cfg.Rate/10)
	}
	if len(cfg.Backoff) == 0 {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 64
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.DecideTimeout <= 0 {
		cfg.DecideTimeout = 5 * time.Second
	}
	if cfg.OnResult == nil {
		cfg.OnResult = func(string, string) {}
	}
	if cfg.OnState == nil {
		cfg.OnState = func(string) {}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Reconciler{cfg: cfg, limiters: map[string]*rate.Limiter{}}
	r.SetQueriers(nil)
	return r, nil
}

// SetQueriers swaps in the channels that can be asked, by channel name.
func (r *Reconciler) SetQueriers(qs map[string]Querier) {
	m := make(map[string]Querier, len(qs))
	for k, v := range qs {
		m[k] = v
	}
	r.queriers.Store(&m)
}

// Asks reports whether some channel can be asked (has query credentials).
func (r *Reconciler) Asks() bool { return len(*r.queriers.Load()) > 0 }

// limiter returns the channel's rate limiter, the background's or (manual)
// Ask's: one each per channel name, kept across reloads so that a reload
// never resets the rate.
func (r *Reconciler) limiter(ch string, manual bool) *rate.Limiter {
	key, every := ch, r.cfg.Rate
	if manual {
		key, every = "manual "+ch, r.cfg.ManualRate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.limiters[key]
	if !ok {
		l = rate.NewLimiter(rate.Limit(every), 1)
		r.limiters[key] = l
	}
	return l
}

// Report is how asking about one order ended, as POST
// /orders/{order_no}/reconcile answers it.
type Report struct {
	// Channel is the channel whose answer decided (or the last asked).
	Channel string
	// State is that channel's answer: paid, pending, closed, not_found.
	State query.State
	// Outcome is the decision of a paid answer (applied, skipped,
	// replayed, amount_mismatch, ...) or, for the others, the state.
	Outcome string
	// Status is the order's state after a paid answer's decision; when
	// nothing was decided, Ask's report has the state the order is in
	// (the background's has "").
	Status string
	// Result is what notifyedge_reconcile_total counted for that channel.
	Result string
}

// ErrNoQuerier: no channel the order may be asked of has query
// credentials.
var ErrNoQuerier = errors.New("no channel it may be paid through has query credentials")

// errSchedule marks a query whose next time could not be written: the
// order stays due, and the leader waits before it reads the due orders
// again (see lead).
var errSchedule = errors.New("reconcile: the next query's time could not be written")

// ErrNotAsked: every channel asked failed (could not be asked, or its
// answer failed verification); nothing was applied.
var ErrNotAsked = errors.New("the channel could not be asked, or its answer failed verification")

// Ask asks about orderNo now, decides a paid answer and records the query
// for the back-off; durable.ErrUnknownOrder when there is no such order.
// Its report always names the order's state.
func (r *Reconciler) Ask(ctx context.Context, orderNo string) (Report, error) {
	o, state, err := r.cfg.Store.ReconcileTarget(ctx, orderNo)
	if err != nil {
		return Report{}, err
	}
	rep, err := r.ask(ctx, o, true)
	if rep.Status == "" {
		rep.Status = string(state) // nothing decided: as it was
	}
	return rep, err
}

// targets lists the channels to ask about o, sorted by name.
func (r *Reconciler) targets(o durable.DueOrder) []string {
	qs := *r.queriers.Load()
	if o.Channel != "" {
		if _, ok := qs[o.Channel]; ok {
			return []string{o.Channel}
		}
		return nil
	}
	names := make([]string, 0, len(qs))
	for n := range qs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// rank orders the answers when several channels were asked: a payment
// decides, then a refunded one (a review), then a pending order (ask
// again), then the rest.
var rank = map[query.State]int{query.Paid: 5, query.Refunded: 4, query.Pending: 3, query.NotFound: 2, query.Closed: 1}

// ask asks every channel the order may be paid through (within the
// background's rate, or manual's), decides paid answers, and schedules
// the next query.
func (r *Reconciler) ask(ctx context.Context, o durable.DueOrder, manual bool) (Report, error) {
	chans := r.targets(o)
	if len(chans) == 0 {
		// Nothing can ask it now (its channel has no query API, or no
		// credentials yet): looked at again on the back-off, as a pending
		// order, so that a reload that adds the credentials covers it.
		err := r.cfg.Store.ScheduleReconcile(ctx, o.OrderNo, r.cfg.Window, durable.Reconciled{Answered: true, Next: r.step(o.Step)})
		if err != nil {
			err = fmt.Errorf("%w: %w", errSchedule, err)
		}
		if err != nil {
			return Report{}, fmt.Errorf("order %s: %w (and %w)", o.OrderNo, ErrNoQuerier, err)
		}
		return Report{}, fmt.Errorf("order %s: %w", o.OrderNo, ErrNoQuerier)
	}
	var best Report
	var errs []error
	answered := false
	for _, ch := range chans {
		rep, err := r.askOne(ctx, ch, o.OrderNo, manual)
		if err != nil {
			errs = append(errs, err)
			if !answered {
				best.Channel = ch
			}
			continue
		}
		if !answered || rank[rep.State] > rank[best.State] {
			best = rep
		}
		answered = true
	}
	var next durable.Reconciled
	switch {
	case answered && (best.State == query.Paid || best.State == query.Refunded):
		next.Answered, next.Never = true, true // decided, or a person's now: nothing more to learn
	case len(errs) > 0:
		// A channel could not be asked (or its payment not decided): asked
		// again soon, whatever the others said, for it may be the one the
		// order was paid through.
		next.Next = r.retryAfter(o)
	case best.State == query.Closed:
		next.Answered, next.Never = true, true // closed at the channel
	default:
		next.Answered, next.Next = true, r.step(o.Step)
	}
	if ctx.Err() == nil {
		if err := r.cfg.Store.ScheduleReconcile(ctx, o.OrderNo, r.cfg.Window, next); err != nil {
			err = fmt.Errorf("%w: %w", errSchedule, err)
			errs = append(errs, err)
			if answered {
				return best, err
			}
		}
	}
	if !answered {
		return best, &notAsked{errs: errs}
	}
	return best, nil
}

// notAsked is ErrNotAsked with each channel's error: one line, the
// channels' reasons joined by "; ".
type notAsked struct{ errs []error }

func (e *notAsked) Error() string {
	msgs := make([]string, len(e.errs))
	for i, err := range e.errs {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (e *notAsked) Is(target error) bool { return target == ErrNotAsked }

func (e *notAsked) Unwrap() []error { return e.errs }

// retryAfter is the wait after a failed query: After, doubling with each
// failure in a row, never longer than the next step of the back-off.
func (r *Reconciler) retryAfter(o durable.DueOrder) time.Duration {
	limit := r.step(o.Step)
	d := r.cfg.Window.After
	for range o.Errors {
		if d >= limit {
			break
		}
		d *= 2
	}
	return min(d, limit)
}

// step is the wait after the answered query number step+1.
func (r *Reconciler) step(step int) time.Duration {
	return r.cfg.Backoff[min(step, len(r.cfg.Backoff)-1)]
}

// askOne is askChannel in a span of its own ("reconcile query": the
// channel, whether a person asked, the result), when OpenTelemetry's
// global provider traces (tracing.Setup); a no-op span otherwise.
func (r *Reconciler) askOne(ctx context.Context, ch, orderNo string, manual bool) (Report, error) {
	ctx, span := otel.Tracer(tracerName).Start(ctx, "reconcile query", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("notifyedge.channel", ch), attribute.Bool("notifyedge.manual", manual)))
	defer span.End()
	rep, err := r.askChannel(ctx, ch, orderNo, manual)
	if err != nil {
		span.SetStatus(codes.Error, "asked again later")
	} else {
		span.SetAttributes(attribute.String("notifyedge.result", rep.Result))
	}
	return rep, err
}

// tracerName is reconciliation's instrumentation scope.
const tracerName = "github.com/notifyedge/notifyedge/edge/reconcile"

// askChannel asks channel ch about orderNo, within its rate (the
// background's, or manual's), and decides a paid answer.
func (r *Reconciler) askChannel(ctx context.Context, ch, orderNo string, manual bool) (Report, error) {
	q, ok := (*r.queriers.Load())[ch]
	if !ok {
		return Report{}, fmt.Errorf("channel %s: %w", ch, ErrNoQuerier)
	}
	if err := r.limiter(ch, manual).Wait(ctx); err != nil {
		return Report{}, fmt.Errorf("channel %s: %w", ch, err)
	}
	ans, err := q.Query(ctx, orderNo)
	if err != nil {
		r.cfg.OnResult(ch, ResultError)
		r.cfg.Logger.Warn("reconcile: query failed, nothing applied", "channel", ch, "order_no", orderNo,
			"unverified", errors.Is(err, query.ErrUnverified), "error", err.Error())
		return Report{}, fmt.Errorf("channel %s: %w", ch, err)
	}
	rep := Report{Channel: ch, State: ans.State, Outcome: string(ans.State)}
	switch ans.State {
	case query.Pending:
		rep.Result = ResultPending
	case query.Closed:
		rep.Result = ResultClosed
	case query.NotFound:
		rep.Result = ResultNotFound
	case query.Refunded:
		// Never applied as a payment: goods would ship against money the
		// buyer got back. A review row opens once; a person settles it.
		dctx, cancel := context.WithTimeout(ctx, r.cfg.DecideTimeout)
		err := r.cfg.Decider.ReviewStored(dctx, r.cfg.Authority, ch, ans.Body, durable.ReviewRefundedAtChannel)
		cancel()
		if err != nil {
			r.cfg.OnResult(ch, ResultError)
			r.cfg.Logger.Warn("reconcile: paid and refunded at the channel, the review could not be opened: asked again", "channel", ch, "order_no", orderNo, "error", err.Error())
			return Report{}, fmt.Errorf("channel %s: review: %w", ch, err)
		}
		rep.Result = ResultRefunded
		r.cfg.Logger.Warn("reconcile: paid and refunded at the channel: not applied, held for review", "channel", ch, "order_no", orderNo)
	case query.Paid:
		dctx, cancel := context.WithTimeout(ctx, r.cfg.DecideTimeout)
		v, o, err := r.cfg.Decider.DecideStored(dctx, r.cfg.Authority, ch, ans.Body, true)
		cancel()
		if err != nil {
			r.cfg.OnResult(ch, ResultError)
			r.cfg.Logger.Warn("reconcile: the channel says paid, the decision failed: asked again", "channel", ch, "order_no", orderNo, "error", err.Error())
			return Report{}, fmt.Errorf("channel %s: decide: %w", ch, err)
		}
		if !v.Success && !heldForReview[o] {
			// Refused without a review (a malformed field, an unknown
			// currency): nobody would ever look at it, so it is asked
			// again, not counted as decided.
			r.cfg.OnResult(ch, ResultError)
			r.cfg.Logger.Warn("reconcile: the channel says paid, the decision refused its answer: asked again", "channel", ch,
				"order_no", orderNo, "outcome", o.String())
			return Report{}, fmt.Errorf("channel %s: the decision refused the paid answer (%s)", ch, o)
		}
		rep.Outcome, rep.Status, rep.Result = outcomeName(o), v.Status, ResultSkipped
		if o == edge.OutcomeApplied {
			rep.Result = ResultApplied
			r.cfg.Logger.Warn("reconcile: payment applied from the channel's answer: its callbacks were lost",
				"channel", ch, "order_no", orderNo, "status", v.Status)
		} else if !v.Success {
			r.cfg.Logger.Warn("reconcile: the channel says paid; the decision holds it for review", "channel", ch,
				"order_no", orderNo, "outcome", rep.Outcome)
		}
	default:
		r.cfg.OnResult(ch, ResultError)
		return Report{}, fmt.Errorf("channel %s: answer state %q", ch, ans.State)
	}
	r.cfg.OnResult(ch, rep.Result)
	return rep, nil
}

// heldForReview are the outcomes of a decision that refused a paid answer
// and opened a review: decided, for a person to take from there.
var heldForReview = map[edge.Outcome]bool{
	edge.OutcomeConflict: true, edge.OutcomeAmountMismatch: true, edge.OutcomeRefundExceeds: true,
	edge.OutcomeMerchantMismatch: true, edge.OutcomeUnknownOrder: true,
}

// outcomeName names a decision's outcome for the API (a replay from
// Postgres is "replayed").
func outcomeName(o edge.Outcome) string {
	if o == edge.OutcomeReplayedDB {
		return "replayed"
	}
	return o.String()
}

// Run asks about due orders while this node holds the reconciler's lock
// (durable's RunLeader: one node at a time), and stands by while another
// node does, until ctx ends. A node with no channel to ask (no query
// credentials) does not try for the lock.
func (r *Reconciler) Run(ctx context.Context) {
	r.cfg.Store.RunLeader(ctx, durable.LeaderConfig{Name: "reconcile", LockID: durable.ReconcileLockID, Retry: r.cfg.Poll,
		Eligible: r.Asks, OnState: r.cfg.OnState,
		OnError: func(err error) { r.cfg.Logger.Warn("reconcile", "error", err.Error()) },
	}, r.lead)
}

// lead asks about due orders, a batch at a time, until ctx ends or a
// read fails. When the next queries' times could not be written, the
// orders are still due: it waits Poll, doubling while that goes on (at
// most a minute), before it reads them again, rather than asking the
// channels about the same orders at the full rate.
func (r *Reconciler) lead(ctx context.Context) error {
	backoff := r.cfg.Poll
	for ctx.Err() == nil {
		if !r.Asks() {
			return nil // the credentials went with a reload: another node may ask
		}
		due, err := r.cfg.Store.DueOrders(ctx, r.cfg.Window, r.cfg.Batch)
		if err != nil {
			return err
		}
		if len(due) == 0 {
			wait.Sleep(ctx, r.cfg.Poll)
			continue
		}
		if n := r.askAll(ctx, due); n > 0 {
			r.cfg.Logger.Warn("reconcile: the next queries' times could not be written; waiting before asking again",
				"orders", n, "wait", backoff.String())
			wait.Sleep(ctx, backoff)
			backoff = min(2*backoff, time.Minute)
			continue
		}
		backoff = r.cfg.Poll
	}
	return nil
}

// askAll asks about every order of due with Workers at once; errors were
// counted and logged by ask.
func (r *Reconciler) askAll(ctx context.Context, due []durable.DueOrder) (unscheduled int) {
	work := make(chan durable.DueOrder)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range min(r.cfg.Workers, len(due)) {
		wg.Go(func() {
			for o := range work {
				_, err := r.ask(ctx, o, false)
				if errors.Is(err, errSchedule) {
					failed.Add(1)
				}
				if err != nil && errors.Is(err, ErrNoQuerier) {
					r.cfg.Logger.Debug("reconcile: no channel to ask", "order_no", o.OrderNo, "channel", o.Channel)
				}
			}
		})
	}
	for _, o := range due {
		select {
		case work <- o:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	wg.Wait()
	return int(failed.Load())
}
