package tracing_test

import (
	"context"
	"testing"

	"github.com/notifyedge/notifyedge/edge/tracing"
	"github.com/notifyedge/notifyedge/edge/tracing/tracingtest"
)

// Tracing is on only with an OTLP endpoint, and off again when the SDK's
// own switches say so; off, Setup sets nothing up.
func TestEnabled(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "TRUE"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}, false},
	} {
		getenv := func(k string) string { return c.env[k] }
		if got := tracing.Enabled(getenv); got != c.want {
			t.Errorf("Enabled(%v) = %v, want %v", c.env, got, c.want)
		}
		if c.want {
			continue
		}
		p, err := tracing.Setup(context.Background(), "edged", getenv)
		if err != nil || p != nil || p.Tracer("x") != nil {
			t.Errorf("Setup(%v) = %v, %v: want no provider and no tracer", c.env, p, err)
		}
	}
}

// The clients' instrumentations start spans only under a recording one: a
// query outside any sampled callback starts no trace (and allocates
// nothing to find that out); one inside is that span's child.
func TestChildrenOnlyUnderARecordingSpan(t *testing.T) {
	p, rcv := tracingtest.Provider(t)
	if (*tracing.Provider)(nil).Children() != nil {
		t.Error("tracing off: want no provider for the clients")
	}
	lib := p.Children().Tracer("lib")
	bg := context.Background()
	ctx, span := lib.Start(bg, "orphan")
	if ctx != bg || span.IsRecording() {
		t.Errorf("outside a span: context %v, recording %v; want the same context and nothing recorded", ctx, span.IsRecording())
	}
	span.End()
	if n := testing.AllocsPerRun(100, func() { _, s := lib.Start(bg, "orphan"); s.End() }); n != 0 {
		t.Errorf("outside a span: %v allocations, want 0", n)
	}
	pctx, parent := p.Tracer("app").Start(bg, "callback")
	_, child := lib.Start(pctx, "query")
	child.End()
	parent.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Spans()
	if len(spans) != 2 {
		t.Fatalf("exported %d spans, want the callback and its query", len(spans))
	}
	for _, s := range spans {
		if s.Name == "query" && (s.ParentSpanID != parent.SpanContext().SpanID().String() || s.Scope != "lib") {
			t.Errorf("query span %+v, want a child of the callback's in scope lib", s)
		}
	}
}
