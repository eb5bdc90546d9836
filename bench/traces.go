package bench

import (
	"fmt"
	"os"
	"strconv"

	"github.com/notifyedge/notifyedge/edge/tracing/tracingtest"
)

// startTraceReceiver starts an OTLP/HTTP receiver in the bench's process
// and points the OpenTelemetry SDK's variables at it, sampling sample of
// the traces: the parts inherit the bench's environment, and the edge part
// sets tracing up from it as edged does.
func startTraceReceiver(sample float64) (*tracingtest.Receiver, error) {
	if sample < 0 || sample > 1 {
		return nil, fmt.Errorf("trace sample %v: want 0 to 1", sample)
	}
	rcv, err := tracingtest.StartCounting()
	if err != nil {
		return nil, err
	}
	for k, v := range map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.Endpoint(),
		"OTEL_TRACES_SAMPLER":         "parentbased_traceidratio",
		"OTEL_TRACES_SAMPLER_ARG":     strconv.FormatFloat(sample, 'f', -1, 64),
	} {
		if err := os.Setenv(k, v); err != nil {
			rcv.Close()
			return nil, fmt.Errorf("trace receiver: %w", err)
		}
	}
	return rcv, nil
}
