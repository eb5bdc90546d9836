package edge

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge/channel"
)

// Authority decides deliveries durably: the only source of truth.
// *durable.Store satisfies it.
type Authority interface {
	// Process decides a delivery and returns by ctx's deadline whatever the
	// database does (the budget relies on it); it must not keep n's bytes
	// past its return.
	Process(ctx context.Context, n durable.Notification) (durable.Result, error)
	// RecordReview opens a review row for a delivery refused before Process
	// (merchant mismatch), with no claim.
	RecordReview(ctx context.Context, n durable.Notification, reason durable.ReviewReason) error
}

// Cache is the claim-and-result cache in front of the authority: an
// accelerator, never the authority. *claimcache.Cache satisfies it.
type Cache interface {
	Claim(ctx context.Context, key []byte, d claimcache.Digest) (claimcache.Result, error)
	Wait(ctx context.Context, key []byte, d claimcache.Digest) (claimcache.Result, error)
	// CompleteMany writes committed answers, several in one round trip.
	CompleteMany(ctx context.Context, cs []claimcache.Completion) error
	Abort(ctx context.Context, key []byte, d claimcache.Digest, t claimcache.Token) error
}

// exchange is one request's pooled state: the transport fills req, the flow
// fills the rest, the transport writes the answer. Everything in it is
// request-scoped and reset on release.
type exchange struct {
	req      channel.Request
	d        channel.Delivery
	verdict  channel.Verdict
	body     []byte // the rendered answer
	ctype    string
	replayed bool
	outcome  Outcome
	path     Path
	channel  channel.Channel // nil for an unknown channel or path
	review   durable.ReviewReason
	err      error
	cached   []byte // the answer as the cache stores it
	// cacheSeen is what the claim cache said (cacheHit, …; cacheOff
	// without a cache), for the request's span.
	cacheSeen string
	// span is the request's server span and tctx its context; nil when
	// the server has no tracer or the request is not routed.
	span trace.Span
	tctx context.Context
	// spanOpts holds the server span's start options, so that starting
	// it allocates no slice of them.
	spanOpts [2]trace.SpanStartOption
}

var exchanges = sync.Pool{New: func() any { return &exchange{body: make([]byte, 0, 256), path: PathRejected} }}

func getExchange() *exchange { return exchanges.Get().(*exchange) }

func putExchange(x *exchange) {
	x.d.Reset()
	*x = exchange{d: x.d, body: x.body[:0], cached: x.cached[:0], path: PathRejected}
	exchanges.Put(x)
}

// decide runs the one request flow for a routed POST /notify/{channel}:
// channel → authenticity and body (the adapter) → durable → answer.
// start is when the request had been read; the budget runs from it.
func (s *Server) decide(start time.Time, x *exchange) {
	ch, ok := (*s.channels.Load())[string(x.req.Channel)]
	if !ok {
		s.fail(x, OutcomeUnknownChannel, "", "")
		return
	}
	x.channel = ch
	if rej := ch.Parse(&x.req, &x.d); rej != nil {
		o := rejectOutcome(rej.Kind)
		if o == OutcomeMerchantMismatch {
			// Authentic, but for another merchant or app: a human must look.
			x.path = PathDurable
			ctx, cancel := context.WithDeadline(context.Background(), start.Add(s.durableBudget))
			err := s.auth().RecordReview(ctx, s.notification(x), durable.ReviewMerchantMismatch)
			cancel()
			if err != nil {
				x.err = err
				s.fail(x, OutcomeUnavailable, "", "")
				return
			}
			x.review = durable.ReviewMerchantMismatch
		}
		s.fail(x, o, "", rej.Message)
		return
	}
	// The cache answers hot duplicates; Won, Mismatch, a slow owner and any
	// Redis failure go on to Postgres.
	var owned claimcache.Result
	cacheUp := false
	x.cacheSeen = cacheOff
	if s.cache != nil {
		cctx, span := s.child(x, "claim")
		r, err := s.cache.Claim(cctx, x.d.Key, x.d.Sum) // bounded by the call timeout and the cache's WaitBudget
		if err == nil && r.Verdict == claimcache.Busy {
			wctx, cancel := context.WithDeadline(cctx, start.Add(s.durableBudget))
			r, err = s.cache.Wait(wctx, x.d.Key, x.d.Sum)
			cancel()
		}
		x.cacheSeen = cacheVerdict(r.Verdict, err)
		endChild(span, err != nil)
		if err == nil {
			cacheUp = true
			switch r.Verdict {
			case claimcache.Done:
				if s.replayCached(x, r.Response) {
					return
				}
			case claimcache.Won:
				owned = r
			}
		}
	}
	res, err := s.process(start, x)
	if owned.Verdict == claimcache.Won && (err != nil || !res.Outcome.Done()) {
		s.cleanup.abort(x.d.Key, x.d.Sum, owned.Token) // after the answer; the pending TTL backstops a failure
	}
	if err != nil {
		x.err = err
		msg := "" // the table's
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, durable.ErrTimeout) {
			msg = "latency budget exceeded; retry"
		}
		s.fail(x, OutcomeUnavailable, "", msg)
		return
	}
	x.review = res.Review
	if res.Outcome.Done() {
		x.outcome = OutcomeApplied
		switch {
		case res.Replayed:
			x.outcome, x.replayed = OutcomeReplayedDB, true
		case res.Outcome == durable.Skipped:
			x.outcome = OutcomeSkipped
		}
		x.verdict = doneVerdict(res.Outcome, res.Status)
		x.body, x.ctype = ch.Render(x.body[:0], &x.verdict)
		if cacheUp {
			// Committed: from now on the cache may answer with these bytes.
			x.cached = encodeCached(x.cached[:0], x.verdict.HTTP, x.ctype, x.body)
			s.cleanup.complete(x.d.Key, x.d.Sum, x.cached, owned.Verdict == claimcache.Won, owned.Epoch, res.Position, x.sampled()) // after the answer
		}
		return
	}
	var status durable.State
	if res.Outcome == durable.Premature {
		status = res.Status // tells the channel what the payment has not reached yet
	}
	s.fail(x, durableOutcome(res.Outcome), status, "")
}

// process asks the authority, under what is left of the budget less a
// margin to write the answer: past it the answer is 503 and the channel
// retries. Whatever the call commits after that is correct: the claim makes
// the channel's retry a replay. The authority returns by the deadline
// whatever the database does (see Authority), so the call runs on the
// handler's goroutine.
func (s *Server) process(start time.Time, x *exchange) (durable.Result, error) {
	x.path = PathDurable
	base, span := s.child(x, "decide")
	ctx, cancel := context.WithDeadline(base, start.Add(s.durableBudget))
	defer cancel()
	n := s.notification(x)
	if span != nil {
		n.Traceparent = sampledTraceparent(span)
	}
	res, err := s.auth().Process(ctx, n)
	endChild(span, err != nil)
	return res, err
}

// notification copies the delivery out of request-scoped bytes. The trade
// is "{channel}:{channel_txn_id}": the payment a refund or a close acts on.
func (s *Server) notification(x *exchange) durable.Notification {
	event, _ := durable.ParseChannelEvent(x.d.Event)
	raw := x.req.Body
	if x.d.ReviewBody != nil {
		raw = x.d.ReviewBody
	}
	return durable.Notification{
		BizKey:       string(x.d.Key),
		OrderNo:      string(x.d.OrderNo),
		Event:        event,
		Amount:       x.d.Amount,
		Currency:     string(x.d.Currency),
		Digest:       string(x.d.Digest[:]),
		RawBody:      raw,
		Trade:        x.channel.Name() + ":" + string(x.d.TxnID),
		RefundID:     string(x.d.RefundID),
		RefundAmount: x.d.RefundAmount,
		Cumulative:   x.d.Cumulative,
	}
}

// The cache stores an answer as status (2 bytes) | content-type length (1)
// | content type | body: what the transport writes, byte for byte.
func encodeCached(dst []byte, status int, ctype string, body []byte) []byte {
	dst = append(dst, byte(status>>8), byte(status), byte(len(ctype)))
	dst = append(dst, ctype...)
	return append(dst, body...)
}

// replayCached sets the answer from a cache entry (false if it is not one
// this build wrote: then Postgres answers).
func (s *Server) replayCached(x *exchange, v string) bool {
	if len(v) < 3 || len(v) < 3+int(v[2]) {
		return false
	}
	n := 3 + int(v[2])
	x.verdict.HTTP = int(v[0])<<8 | int(v[1])
	x.verdict.Success = true
	x.ctype = v[3:n]
	x.body = append(x.body[:0], v[n:]...)
	x.outcome, x.path, x.replayed = OutcomeReplayedCache, PathCache, true
	return true
}

// fail sets a FAIL answer, rendered by the channel's adapter when the
// channel is known, else in the generic JSON form.
func (s *Server) fail(x *exchange, o Outcome, status durable.State, msg string) {
	x.outcome = o
	x.verdict = failVerdict(o, status, msg)
	if x.channel != nil {
		x.body, x.ctype = x.channel.Render(x.body[:0], &x.verdict)
		return
	}
	x.body, x.ctype = channel.AppendVerdictJSON(x.body[:0], &x.verdict), "application/json"
}

// finish records the request: its metrics always, a log line for every
// non-2xx answer and every alarm. Rejections (401, 400, 404 channel, 405,
// 413) are logged at a bounded rate: attackers must not fill the disk.
func (s *Server) finish(start time.Time, x *exchange) {
	elapsed := time.Since(start)
	s.metrics.observe(s.metrics.channel(x.req.Channel), x.outcome, x.path, elapsed)
	if x.verdict.HTTP < 300 && x.review == "" {
		return
	}
	level := slog.LevelWarn
	switch {
	case x.outcome == OutcomeConflict || x.review != "":
		level = slog.LevelError // an alarm: a human must look
	case x.path == PathRejected:
		if !s.httpLog.allow() {
			return
		}
	case x.outcome == OutcomeInternal:
		level = slog.LevelError
	}
	name := UnknownChannel
	if x.channel != nil {
		name = x.channel.Name()
	}
	attrs := []slog.Attr{
		slog.String("channel", name),
		slog.String("outcome", x.outcome.String()),
		slog.Int("http", x.verdict.HTTP),
		slog.Float64("latency_ms", float64(elapsed.Microseconds())/1000),
	}
	if len(x.d.Key) > 0 {
		attrs = append(attrs, slog.String("biz_key", string(x.d.Key)))
	}
	if x.review != "" {
		attrs = append(attrs, slog.String("review", string(x.review)))
	}
	if x.verdict.Message != "" {
		attrs = append(attrs, slog.String("message", x.verdict.Message))
	}
	if x.err != nil {
		attrs = append(attrs, slog.String("error", x.err.Error()))
	}
	msg := "callback answered"
	if level == slog.LevelError && x.outcome != OutcomeInternal {
		msg = "alarm: callback needs review"
	}
	s.log.LogAttrs(context.Background(), level, msg, attrs...)
}
