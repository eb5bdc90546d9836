package main

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/edge/tracing"
)

// traced wraps a batch handler in a consumer span when tracer is set and
// any of the batch's events carries a callback's trace context: a child of
// the first one's, linking every one's (nil tracer: handle as it is).
func traced(tracer trace.Tracer, handle func(context.Context, []redisstream.Message) []error) func(context.Context, []redisstream.Message) []error {
	if tracer == nil {
		return handle
	}
	return func(ctx context.Context, ms []redisstream.Message) []error {
		tps := make([]string, len(ms))
		for i, m := range ms {
			tps[i] = m.Traceparent
		}
		first, links := tracing.Links(tps...)
		if links == nil {
			return handle(ctx, ms)
		}
		ctx, span := tracer.Start(trace.ContextWithRemoteSpanContext(ctx, first), "ship",
			trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...),
			trace.WithAttributes(attribute.String("messaging.system", "redis"), attribute.Int("messaging.batch.message_count", len(ms))))
		defer span.End()
		errs := handle(ctx, ms)
		for _, err := range errs {
			if err != nil {
				span.SetStatus(codes.Error, "an event was not handled: it comes again")
				break
			}
		}
		return errs
	}
}
