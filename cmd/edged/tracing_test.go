package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge/tracing/tracingtest"
)

// With OTEL_EXPORTER_OTLP_ENDPOINT set, a callback carrying a traceparent
// gets a server span in that trace ("notify acme", its parent the
// caller's span) with children for the claim, the decision and the cache's
// completion after the answer, received over OTLP/HTTP as a collector
// would; its duplicate's span says the cache answered. No attribute holds
// the secret, the signature or the body.
func TestTraceOfOneCallback(t *testing.T) {
	rcv, err := tracingtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rcv.Close() })
	// The SDK reads its variables from the process's environment.
	for k, v := range map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.Endpoint(), "OTEL_TRACES_SAMPLER": "always_on",
		"OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_SERVICE_NAME": ""} {
		t.Setenv(k, v)
	}
	rs := persistentRedis(t)
	dbURL := durabletest.NewDatabase(t)
	m := runMain(t, slog.New(slog.NewTextHandler(io.Discard, nil)), "DATABASE_URL="+dbURL, "REDIS_URL="+rs.URL(),
		"EDGE_STREAM_URL="+rs.URL(), "EDGE_SECRET_ACME="+secret, "OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.Endpoint())
	if err := pgtemp.SeedOrders(context.Background(), dbURL, []pgtemp.Order{{No: "O-t", Status: "PENDING_PAY", Amount: 5, Currency: "CNY"}}); err != nil {
		t.Fatal(err)
	}
	const (
		callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
		callerSpan  = "00f067aa0ba902b7"
	)
	body := payOrder("O-t")
	req := signedPost(m.Addr(), secret, "t1", body)
	req.Header.Set("traceparent", "00-"+callerTrace+"-"+callerSpan+"-01")
	signature := req.Header.Get("webhook-signature")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("first delivery: %d", resp.StatusCode)
	}
	if status, _, replayed := sendTo(t, m, "t2", body); status != 200 || !replayed {
		t.Fatalf("duplicate: %d, replayed %v", status, replayed)
	}

	var server, dup tracingtest.Span
	children := map[string]tracingtest.Span{}
	wait.For(t, "the callback's spans and its duplicate's at the receiver", func() (bool, string) {
		children = map[string]tracingtest.Span{}
		server, dup = tracingtest.Span{}, tracingtest.Span{}
		spans := rcv.Spans()
		for _, s := range spans {
			switch {
			case s.Name == "notify acme" && s.TraceID == callerTrace:
				server = s
			case s.Name == "notify acme":
				dup = s
			}
		}
		for _, s := range spans {
			if server.SpanID != "" && s.ParentSpanID == server.SpanID {
				children[s.Name] = s
			}
		}
		return server.SpanID != "" && dup.SpanID != "" && len(children) == 3 && clientSpans(spans, callerTrace, children["decide"].SpanID),
			fmt.Sprint(len(spans), " spans: ", spans)
	})
	if server.ParentSpanID != callerSpan || server.Kind != "server" || server.Service != "edged" {
		t.Errorf("server span: parent %s, kind %s, service %q; want parent %s, server, edged", server.ParentSpanID, server.Kind, server.Service, callerSpan)
	}
	for k, want := range map[string]string{"notifyedge.channel": "acme", "notifyedge.outcome": "applied",
		"notifyedge.cache": "won", "http.response.status_code": "200"} {
		if got := server.Attributes[k]; got != want {
			t.Errorf("server span %s = %q, want %q", k, got, want)
		}
	}
	for _, name := range []string{"claim", "decide"} {
		c, ok := children[name]
		if !ok || c.TraceID != callerTrace || c.Start.Before(server.Start) || c.End.After(server.End) {
			t.Errorf("child %q: %+v, want one inside the server span %v–%v", name, c, server.Start, server.End)
		}
	}
	// The cache learns the answer after it was given: a child that may
	// start once the server span ended.
	if c, ok := children["cache complete"]; !ok || c.TraceID != callerTrace || len(c.Links) != 1 {
		t.Errorf("cache complete: %+v, want a child of the server span linking it", c)
	}
	if dup.Attributes["notifyedge.outcome"] != "replayed_cache" || dup.Attributes["notifyedge.cache"] != "hit" || dup.ParentSpanID != "" {
		t.Errorf("duplicate's span: %+v, want a root, replayed_cache, cache hit", dup)
	}
	// The clients' instrumentations only ever add children: no query or
	// Redis command outside a sampled callback (the relay's polling, the
	// retention and readiness probes, the duplicate's lookup) starts a
	// trace of its own.
	for _, s := range rcv.Spans() {
		if (s.Scope == pgxScope || s.Scope == redisScope) && s.ParentSpanID == "" {
			t.Errorf("%s span %q is a root", s.Scope, s.Name)
		}
	}
	for _, s := range rcv.Spans() {
		for k, v := range s.Attributes {
			for _, bad := range []string{secret, signature, body, "O-t"} {
				if bad != "" && strings.Contains(v, bad) {
					t.Errorf("span %q attribute %s = %q holds what it must not", s.Name, k, v)
				}
			}
		}
	}
	// The relay carries the decision's trace context with the event, for
	// the consumers (the forwarder sends it on as the webhook's
	// traceparent).
	client := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer client.Close()
	want := "00-" + callerTrace + "-" + children["decide"].SpanID + "-01"
	wait.For(t, "the event in the stream with the callback's traceparent", func() (bool, string) {
		msgs, err := client.XRange(context.Background(), redisstream.DefaultStream, "-", "+").Result()
		return len(msgs) == 1 && msgs[0].Values[redisstream.FieldTraceparent] == want, fmt.Sprint(msgs, err, " want ", want)
	})
	if errs := rcv.Errors(); len(errs) > 0 {
		t.Errorf("the receiver could not decode: %v", errs)
	}
}

// The clients' instrumentation scopes.
const (
	pgxScope   = "github.com/exaring/otelpgx"
	redisScope = "github.com/redis/go-redis/extra/redisotel"
)

// clientSpans reports whether the callback's trace holds a Redis command
// (the relay's append; the cache's claims and completions go out in
// pipelines shared by many callbacks, outside any one's trace) and a query
// under its decision, at any depth (through the group commit's batch).
func clientSpans(spans []tracingtest.Span, traceID, decide string) bool {
	parent := make(map[string]string, len(spans))
	for _, s := range spans {
		parent[s.SpanID] = s.ParentSpanID
	}
	under := func(id, ancestor string) bool {
		for p := parent[id]; p != ""; p = parent[p] {
			if p == ancestor {
				return true
			}
		}
		return false
	}
	var redisSeen, pgSeen bool
	for _, s := range spans {
		redisSeen = redisSeen || (s.Scope == redisScope && s.TraceID == traceID)
		pgSeen = pgSeen || (s.Scope == pgxScope && decide != "" && under(s.SpanID, decide))
	}
	return redisSeen && pgSeen
}
