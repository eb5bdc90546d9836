// Package tracing sets OpenTelemetry's SDK up from its own standard
// variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER,
// OTEL_SERVICE_NAME, OTEL_EXPORTER_OTLP_HEADERS, …), exporting over
// OTLP/HTTP. Without an endpoint it sets nothing up: the processes then hold
// no tracer, and the request paths take no tracing branch at all.
package tracing

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// Enabled reports whether getenv configures an export: an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),
// and neither OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(getenv("OTEL_TRACES_EXPORTER"), "none") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Provider is a process's tracer provider. A nil *Provider is tracing off:
// its Tracer is nil and its Shutdown does nothing.
type Provider struct {
	sdk *sdktrace.TracerProvider
}

// Setup returns the process's Provider: nil when getenv configures no
// export (Enabled), else an SDK provider exporting in batches over
// OTLP/HTTP, its sampler, resource and exporter read by the SDK from the
// process's environment, service the service name unless
// OTEL_SERVICE_NAME says otherwise. It also installs the provider and the
// W3C trace-context propagator as OpenTelemetry's globals, for the
// instrumentations of the clients (pgx, go-redis) that read them.
func Setup(ctx context.Context, service string, getenv func(string) string) (*Provider, error) {
	if !Enabled(getenv) {
		return nil, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", service)))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default.
	if env, err := resource.New(ctx, resource.WithFromEnv()); err == nil {
		if merged, err := resource.Merge(res, env); err == nil {
			res = merged
		}
	}
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(sdk)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return &Provider{sdk: sdk}, nil
}

// Tracer returns the named tracer, nil when tracing is off.
func (p *Provider) Tracer(name string) trace.Tracer {
	if p == nil {
		return nil
	}
	return p.sdk.Tracer(name)
}

// Shutdown exports what is buffered and stops the exporter.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	if err := p.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// HeaderCarrier reads a request's trace context (traceparent, tracestate)
// from any header reader with Peek: fasthttp's request header, or an
// adapter over net/http's. It copies what it returns, so nothing it hands
// the SDK refers to the request's buffers.
type HeaderCarrier struct {
	Header interface{ Peek(name string) []byte }
}

// Get returns the header's value, copied.
func (c HeaderCarrier) Get(key string) string { return string(c.Header.Peek(key)) }

// Set does nothing: the carrier only reads.
func (HeaderCarrier) Set(string, string) {}

// Keys lists the headers the W3C propagator reads.
func (HeaderCarrier) Keys() []string { return []string{"traceparent", "tracestate"} }

// Traceparent is sc's W3C traceparent header value when sc is sampled,
// else "": only sampled contexts are carried on.
func Traceparent(sc trace.SpanContext) string {
	if !sc.IsSampled() {
		return ""
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
}

// Parse reads a W3C traceparent header value with the W3C propagator; the
// span context is invalid for anything that is not one.
func Parse(traceparent string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": traceparent}))
}

// Links reads traceparents (those not valid are skipped) into the first
// one's span context, for a span over several events to be that trace's
// child, and links to every one.
func Links(traceparents ...string) (first trace.SpanContext, links []trace.Link) {
	for _, tp := range traceparents {
		sc := Parse(tp)
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

// Children returns a tracer provider for the clients' instrumentations
// (nil when p is nil): its tracers start a span only under a recording one
// in the context they are handed; otherwise they return that context and a
// span that records nothing. An instrumented query outside any sampled
// callback then starts no trace of its own, and costs a check.
func (p *Provider) Children() trace.TracerProvider {
	if p == nil {
		return nil
	}
	return childProvider{tp: p.sdk}
}

// childProvider is Children's provider.
type childProvider struct {
	embedded.TracerProvider
	tp trace.TracerProvider
}

// Tracer returns the named tracer, starting children only.
func (c childProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childTracer{t: c.tp.Tracer(name, opts...)}
}

// childTracer starts a span only under a recording one.
type childTracer struct {
	embedded.Tracer
	t trace.Tracer
}

// noSpan is what childTracer returns outside a recording span; held in an
// interface once, so returning it allocates nothing.
var noSpan trace.Span = noop.Span{}

// Start starts a child of ctx's span when that one records; otherwise it
// returns ctx and a span that records nothing.
func (c childTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, noSpan
	}
	return c.t.Start(ctx, name, opts...)
}
