package main

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/edge/tracing"
)

// send posts m's webhook: within a client span of the callback's trace
// when the forwarder traces and m carries a trace context (the webhook's
// traceparent is then that span's), else with m's own traceparent, if any.
func (f *forwarder) send(ctx context.Context, m redisstream.Message, attempt int, body []byte) error {
	tracer := f.cfg.Tracer
	if tracer == nil || m.Traceparent == "" {
		return f.sender.post(ctx, webhookID(m), m.Traceparent, body)
	}
	parent := trace.ContextWithRemoteSpanContext(ctx, tracing.Parse(m.Traceparent))
	ctx, span := tracer.Start(parent, "forward "+m.Topic, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("http.request.method", "POST"),
			attribute.Int64("notifyedge.outbox_id", m.OutboxID), attribute.Int("notifyedge.attempt", attempt)))
	defer span.End()
	tp := m.Traceparent
	if own := tracing.Traceparent(span.SpanContext()); own != "" {
		tp = own
	}
	err := f.sender.post(ctx, webhookID(m), tp, body)
	if err != nil {
		span.SetStatus(codes.Error, "not delivered: retried or dead-lettered")
	}
	return err
}
