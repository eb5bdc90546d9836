// Package instrument attaches the maintained OpenTelemetry instrumentations
// of the clients (otelpgx for pgx, redisotel for go-redis) under a
// process's tracing.Provider. Their spans are only ever children: a query or
// a Redis command whose context holds no recording span (an unsampled
// callback, the relay's polling, a consumer's blocking read) starts none,
// so they add no traces of their own and nothing a sampler could keep
// apart from a callback's.
package instrument

import (
	"fmt"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	noopmetric "go.opentelemetry.io/otel/metric/noop"

	"github.com/notifyedge/notifyedge/edge/tracing"
)

// Postgres returns pgx's tracer for the pools and sessions of a Store
// (durable.Config.Tracer), nil when p is nil (tracing off). A query's span
// holds its SQL text, never its parameters (the raw bodies and digests
// they carry), and the server's address, database and user.
func Postgres(p *tracing.Provider) pgx.QueryTracer {
	if p == nil {
		return nil
	}
	return otelpgx.NewTracer(
		otelpgx.WithTracerProvider(p.Children()),
		// The process's metrics are Prometheus's; none through OpenTelemetry.
		otelpgx.WithMeterProvider(noopmetric.NewMeterProvider()),
	)
}

// Redis adds go-redis's tracing hooks to client; nothing when p is nil. A
// command's span holds its name and the server's address, never its
// arguments (keys, cached answers, stream entries), and no caller frame (a
// stack walk per command).
func Redis(p *tracing.Provider, client redis.UniversalClient) error {
	if p == nil {
		return nil
	}
	if err := redisotel.InstrumentTracing(client,
		redisotel.WithTracerProvider(p.Children()),
		redisotel.WithDBStatement(false),
		redisotel.WithCallerEnabled(false),
	); err != nil {
		return fmt.Errorf("tracing: redis instrumentation: %w", err)
	}
	return nil
}
