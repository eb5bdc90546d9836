package edge

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/edge/tracing"
)

// The cache attribute's values: what the claim cache said of a delivery.
const (
	cacheOff      = "off"      // no cache configured
	cacheHit      = "hit"      // answered from the cache
	cacheWon      = "won"      // this request owns the delivery; Postgres decides
	cacheMismatch = "mismatch" // same key, different content; Postgres decides
	cacheBusy     = "busy"     // another request owned it past the wait; Postgres decides
	cacheError    = "error"    // Redis failed or was slow; Postgres decides
)

// traceContext is the W3C propagator the server reads a channel's (or a
// proxy's) traceparent with.
var traceContext propagation.TraceContext

// startTrace starts the request's server span, a child of the traceparent
// the request carries if any, timed from start. Only with a tracer.
//
// Most callbacks are not sampled, so what every one pays is kept small:
// no carrier is boxed when the request has no traceparent, the span kind
// option is built once, and the options' slice lives in the pooled
// exchange instead of escaping per call.
func (s *Server) startTrace(start time.Time, x *exchange) {
	parent := context.Background()
	if len(x.req.Header.Peek(headerTraceparent)) != 0 {
		parent = traceContext.Extract(parent, tracing.HeaderCarrier{Header: x.req.Header})
	}
	x.spanOpts = [2]trace.SpanStartOption{serverSpanKind, trace.WithTimestamp(start)}
	x.tctx, x.span = s.tracer.Start(parent, s.spanName(x.req.Channel), x.spanOpts[:]...)
}

// headerTraceparent is the W3C trace-context header a caller's trace comes in.
const headerTraceparent = "traceparent"

// serverSpanKind is built once: building it boxes a value each time.
var serverSpanKind = trace.WithSpanKind(trace.SpanKindServer)

// spanName is the server span's name for the {channel} path segment:
// "notify <channel>" for a configured channel, "notify unknown" for any
// other (a name per segment an attacker sends would be unbounded).
func (s *Server) spanName(segment []byte) string {
	if name, ok := (*s.spanNames.Load())[string(segment)]; ok {
		return name
	}
	return unknownSpanName
}

// unknownSpanName names the server span of a request for no configured
// channel.
const unknownSpanName = "notify " + UnknownChannel

// endTrace sets what the request came to on its span and ends it: the
// channel, the outcome, the cache's verdict and the HTTP status; never a
// body, a header or a key.
func (s *Server) endTrace(x *exchange) {
	if !x.span.IsRecording() {
		x.span.End() // not sampled: nothing to set
		return
	}
	name := UnknownChannel
	if x.channel != nil {
		name = x.channel.Name()
	}
	x.span.SetAttributes(
		attribute.String("notifyedge.channel", name),
		attribute.String("notifyedge.outcome", x.outcome.String()),
		attribute.Int("http.response.status_code", x.verdict.HTTP),
	)
	if x.cacheSeen != "" { // "": refused before the cache was asked
		x.span.SetAttributes(attribute.String("notifyedge.cache", x.cacheSeen))
	}
	if x.verdict.HTTP >= 500 {
		x.span.SetStatus(codes.Error, x.outcome.String())
	}
	x.span.End()
}

// child starts a child span of the request's and returns the context to
// call with: context.Background() and no span when the request is not
// traced or not sampled.
func (s *Server) child(x *exchange, name string) (context.Context, trace.Span) {
	if x.span == nil || !x.span.IsRecording() {
		// Not sampled: its children would not be either.
		return context.Background(), nil
	}
	return s.tracer.Start(x.tctx, name)
}

// sampled is the request's server span's context when it is sampled, else
// zero.
func (x *exchange) sampled() trace.SpanContext {
	if x.span == nil || !x.span.IsRecording() {
		return trace.SpanContext{}
	}
	return x.span.SpanContext()
}

// endChild ends a child span (none: nothing), marked failed when failed.
// The status says only that: an error's text may carry what the request
// held.
func endChild(span trace.Span, failed bool) {
	if span == nil {
		return
	}
	if failed {
		span.SetStatus(codes.Error, "failed")
	}
	span.End()
}

// cacheVerdict names what the claim cache said of a delivery.
func cacheVerdict(v claimcache.Verdict, err error) string {
	switch {
	case err != nil:
		return cacheError
	case v == claimcache.Done:
		return cacheHit
	case v == claimcache.Won:
		return cacheWon
	case v == claimcache.Mismatch:
		return cacheMismatch
	}
	return cacheBusy
}

// sampledTraceparent is span's W3C traceparent when its trace is sampled,
// else "": only a sampled callback's trace context is kept with its
// outbox row, for the consumers' spans to join.
func sampledTraceparent(span trace.Span) string { return tracing.Traceparent(span.SpanContext()) }
