// Package tracingtest is an OTLP/HTTP trace receiver for tests: it decodes
// the real protocol (protobuf ExportTraceServiceRequest on POST /v1/traces,
// gzip or not) into spans the tests can inspect.
package tracingtest

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, its ids in lower-case hex.
type Span struct {
	Service string
	// Scope is the instrumentation scope's name: the tracer's, or the
	// instrumented client's library (otelpgx, redisotel).
	Scope        string
	TraceID      string
	SpanID       string
	ParentSpanID string // "" for a root
	Name         string
	Kind         string // "server", "client", "internal", …
	Start, End   time.Time
	// Attributes are the span's attributes, each value as text.
	Attributes map[string]string
	// Links are the trace and span ids the span links to.
	Links []Link
	// Status is "error" for a span that failed, else "".
	Status string
}

// Link is one link of a span.
type Link struct{ TraceID, SpanID string }

// Receiver is an OTLP/HTTP receiver on a loopback port.
type Receiver struct {
	srv *http.Server
	ln  net.Listener

	// countOnly keeps no span, only their number.
	countOnly bool

	mu    sync.Mutex
	spans []Span
	count int
	errs  []error
}

// Start starts a Receiver on 127.0.0.1 and a free port.
func Start() (*Receiver, error) { return start(false) }

// StartCounting starts a Receiver that keeps no span, only counts them:
// for a bench's millions.
func StartCounting() (*Receiver, error) { return start(true) }

func start(countOnly bool) (*Receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tracingtest: listen: %w", err)
	}
	r := &Receiver{ln: ln, countOnly: countOnly}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.export)
	r.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go r.srv.Serve(ln)
	return r, nil
}

// Endpoint is the URL to set as OTEL_EXPORTER_OTLP_ENDPOINT.
func (r *Receiver) Endpoint() string { return "http://" + r.ln.Addr().String() }

// Close stops the receiver.
func (r *Receiver) Close() error { return r.srv.Close() }

// Spans returns every span received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.spans)
}

// Count returns how many spans were received so far.
func (r *Receiver) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// Errors returns the requests the receiver could not decode.
func (r *Receiver) Errors() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.errs)
}

func (r *Receiver) export(w http.ResponseWriter, req *http.Request) {
	spans, err := decode(req)
	r.mu.Lock()
	if err != nil {
		r.errs = append(r.errs, err)
	}
	r.count += len(spans)
	if !r.countOnly {
		r.spans = append(r.spans, spans...)
	}
	r.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func decode(req *http.Request) ([]Span, error) {
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		return nil, fmt.Errorf("tracingtest: content type %q, want application/x-protobuf", ct)
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(req.Body)
		if err != nil {
			return nil, fmt.Errorf("tracingtest: gzip: %w", err)
		}
		body = gz
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		return nil, fmt.Errorf("tracingtest: read: %w", err)
	}
	var msg collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &msg); err != nil {
		return nil, fmt.Errorf("tracingtest: decode: %w", err)
	}
	var out []Span
	for _, rs := range msg.GetResourceSpans() {
		service := attrs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s := Span{
					Service:      service,
					Scope:        ss.GetScope().GetName(),
					TraceID:      hex.EncodeToString(sp.GetTraceId()),
					SpanID:       hex.EncodeToString(sp.GetSpanId()),
					ParentSpanID: hex.EncodeToString(sp.GetParentSpanId()),
					Name:         sp.GetName(),
					Kind:         kind(sp.GetKind().String()),
					Start:        time.Unix(0, int64(sp.GetStartTimeUnixNano())),
					End:          time.Unix(0, int64(sp.GetEndTimeUnixNano())),
					Attributes:   attrs(sp.GetAttributes()),
				}
				for _, l := range sp.GetLinks() {
					s.Links = append(s.Links, Link{TraceID: hex.EncodeToString(l.GetTraceId()), SpanID: hex.EncodeToString(l.GetSpanId())})
				}
				if sp.GetStatus().GetCode().String() == "STATUS_CODE_ERROR" {
					s.Status = "error"
				}
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// kind turns SPAN_KIND_SERVER into "server".
func kind(k string) string { return strings.ToLower(strings.TrimPrefix(k, "SPAN_KIND_")) }

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		out[kv.GetKey()] = fmt.Sprint(anyValue(kv.GetValue()))
	}
	return out
}

func anyValue(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_BytesValue:
		return hex.EncodeToString(x.BytesValue)
	case *commonpb.AnyValue_ArrayValue:
		var out []any
		for _, e := range x.ArrayValue.GetValues() {
			out = append(out, anyValue(e))
		}
		return out
	}
	return nil
}
