package durable

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is durable's instrumentation scope.
const tracerName = "github.com/notifyedge/notifyedge/durable"

// batchSpan starts the span of a group commit's batch when any of its
// members' callbacks is sampled: a child of the first sampled member's
// decision (so that the sampler, following its parent, keeps it), linking
// every sampled member's. Otherwise, tracing off included, it starts
// nothing and returns ctx and nil.
func batchSpan(ctx context.Context, batch []*member) (context.Context, trace.Span) {
	parent, links := spanLinks(len(batch), func(i int) trace.SpanContext {
		if sc := trace.SpanContextFromContext(batch[i].ctx); sc.IsSampled() {
			return sc
		}
		return trace.SpanContext{}
	})
	if links == nil {
		return ctx, nil
	}
	return otel.Tracer(tracerName).Start(trace.ContextWithSpanContext(ctx, parent), "group commit",
		trace.WithLinks(links...), trace.WithAttributes(attribute.String("db.system", "postgresql")))
}

// spanLinks reads n span contexts (the invalid ones skipped) into the first
// valid one, for a span over several callbacks to be that one's child, and
// a link to every one.
func spanLinks(n int, at func(int) trace.SpanContext) (first trace.SpanContext, links []trace.Link) {
	for i := range n {
		sc := at(i)
		if !sc.IsValid() {
			continue
		}
		if !first.IsValid() {
			first = sc
		}
		links = append(links, trace.Link{SpanContext: sc})
	}
	return first, links
}

// endBatchSpan ends a batch's span (none: nothing) with its size, the
// members it handed back busy, and its failure.
func endBatchSpan(span trace.Span, size int, busy []bool, err error) {
	if span == nil {
		return
	}
	n := 0
	for _, b := range busy {
		if b {
			n++
		}
	}
	span.SetAttributes(attribute.Int("notifyedge.batch.size", size), attribute.Int("notifyedge.batch.busy", n))
	if err != nil {
		span.SetStatus(codes.Error, "batch failed: its members are decided again alone")
	}
	span.End()
}

// relaySpan starts the relay's span for a batch of events when any of
// them carries a sampled callback's trace context: a child of the first
// one's, linking every one's. Otherwise it starts nothing.
func relaySpan(ctx context.Context, msgs []OutboxMessage) (context.Context, trace.Span) {
	parent, links := spanLinks(len(msgs), func(i int) trace.SpanContext {
		if msgs[i].Traceparent == "" {
			return trace.SpanContext{}
		}
		return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
			propagation.MapCarrier{"traceparent": msgs[i].Traceparent}))
	})
	if links == nil {
		return ctx, nil
	}
	return otel.Tracer(tracerName).Start(trace.ContextWithRemoteSpanContext(ctx, parent), "relay publish",
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(links...),
		trace.WithAttributes(attribute.String("messaging.system", "redis"), attribute.Int("messaging.batch.message_count", len(msgs))))
}
