package edge_test

import (
	"context"
	"net/http"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge"
)

// tracedSetup is a bundle whose server traces into a recorder with sampler.
func tracedSetup(t *testing.T, sampler sdktrace.Sampler) (*bundle, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sampler))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return setup(t, options{server: edge.Config{Tracer: tp.Tracer("test")}}), rec
}

// A request for a channel nobody configured is traced under one name, not
// under the path segment it sent: span names stay a bounded set.
func TestSpanNameOfAnUnknownChannel(t *testing.T) {
	b, rec := tracedSetup(t, sdktrace.AlwaysSample())
	for _, path := range []string{"/notify/nosuch", "/notify/another-one"} {
		if r := b.send(t, http.MethodPost, path, nil, "{}"); r.status != 404 {
			t.Fatalf("%s: %d", path, r.status)
		}
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	for _, s := range spans {
		if s.Name() != "notify unknown" {
			t.Errorf("span %q, want notify unknown", s.Name())
		}
	}
}

// A callback whose trace is not sampled records no span and keeps no trace
// context with its outbox row; its answer is the same.
func TestUnsampledCallbackRecordsNothing(t *testing.T) {
	b, rec := tracedSetup(t, sdktrace.NeverSample())
	b.order(t, "O-u", durable.PendingPay, 1999)
	if r := b.post(t, body("T-u", "PAY_SUCCESS", "O-u", 1999)); r.status != 200 {
		t.Fatalf("first delivery: %d %s", r.status, r.body)
	}
	if n := len(rec.Started()); n != 0 {
		t.Errorf("%d spans started for an unsampled callback", n)
	}
	if n := b.count(t, `SELECT count(*) FROM notify_trace`); n != 0 {
		t.Errorf("notify_trace holds %d rows after an unsampled callback", n)
	}
}
