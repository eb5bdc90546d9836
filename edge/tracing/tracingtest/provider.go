package tracingtest

import (
	"context"
	"os"
	"testing"

	"github.com/notifyedge/notifyedge/edge/tracing"
)

// Provider starts a Receiver and sets tracing up as a process does when
// OTEL_EXPORTER_OTLP_ENDPOINT names it (the SDK reads the process's
// environment, which t.Setenv puts back); the receiver closes when t ends.
func Provider(t testing.TB) (*tracing.Provider, *Receiver) {
	t.Helper()
	rcv, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rcv.Close() })
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint())
	p, err := tracing.Setup(context.Background(), "edged", os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	return p, rcv
}
