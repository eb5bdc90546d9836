package tracing_test

import (
	"context"
	"testing"

	"github.com/notifyedge/notifyedge/edge/tracing"
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
