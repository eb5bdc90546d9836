package edge

import (
	"context"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/notifyedge/notifyedge/edge/tracing/tracingtest"
)

// BenchmarkUnsampledServerSpan: what every callback that is not sampled
// pays for its server span with tracing on (ratio 0 here, most of them at
// 1 %): started, found not recording, ended; with and without a caller's
// traceparent that is itself not sampled.
func BenchmarkUnsampledServerSpan(b *testing.B) {
	b.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	b.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
	p, _ := tracingtest.Provider(b)
	b.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	s := &Server{tracer: p.Tracer("bench")}
	s.spanNames.Store(&map[string]string{"acme": "notify acme"})
	for _, tc := range []struct{ name, traceparent string }{
		{"no-traceparent", ""},
		{"unsampled-parent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var h fasthttp.RequestHeader
			if tc.traceparent != "" {
				h.Set("traceparent", tc.traceparent)
			}
			x := &exchange{}
			x.req.Header = &h
			x.req.Channel = []byte("acme")
			start := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				s.startTrace(start, x)
				if x.span.IsRecording() {
					b.Fatal("sampled at ratio 0")
				}
				s.endTrace(x)
			}
		})
	}
}
