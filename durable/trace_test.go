package durable_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/notifyedge/notifyedge/durable"
)

// A group commit's batch of sampled callbacks is one span, a child of one
// member's decision, linking every member's; callbacks whose traces are
// not sampled start no batch span.
func TestBatchSpanLinksItsCallbacks(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	b := setup(t)
	store := newStore(t, b.url, durable.Config{GroupCommit: true})
	const n = 16
	for i := range n {
		b.order(t, fmt.Sprintf("O-%02d", i), durable.PendingPay, 1999, "CNY")
	}
	decide := func(from int, sampled bool) map[trace.SpanID]bool {
		ids := map[trace.SpanID]bool{}
		var wg sync.WaitGroup
		for i := from; i < from+n/2; i++ {
			flags := trace.TraceFlags(0)
			if sampled {
				flags = trace.FlagsSampled
			}
			sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, byte(i)}, SpanID: trace.SpanID{2, byte(i)}, TraceFlags: flags})
			ids[sc.SpanID()] = true
			ctx := trace.ContextWithSpanContext(context.Background(), sc)
			wg.Go(func() {
				nt := note(fmt.Sprintf("T-%02d", i), durable.PaySuccess, fmt.Sprintf("O-%02d", i), 1999, "CNY")
				if r, err := store.Process(ctx, nt); err != nil || r.Outcome != durable.Applied {
					t.Errorf("pay O-%02d: %+v %v", i, r, err)
				}
			})
		}
		wg.Wait()
		return ids
	}
	decide(0, false)
	if spans := rec.Ended(); len(spans) != 0 {
		t.Fatalf("%d spans for callbacks not sampled", len(spans))
	}
	before := store.GroupStats().Batches.Load()
	members := decide(n/2, true)
	formed := store.GroupStats().Batches.Load() - before
	if formed == 0 {
		t.Skip("no batch formed: every delivery was decided alone (the machine ran them one by one)")
	}
	batches := rec.Ended()
	if uint64(len(batches)) != formed {
		t.Errorf("%d batch spans for %d batches", len(batches), formed)
	}
	linked := 0
	for _, s := range batches {
		if s.Name() != "group commit" || !members[s.Parent().SpanID()] {
			t.Errorf("span %q, parent %v: want a group commit under a member's decision", s.Name(), s.Parent().SpanID())
		}
		for _, l := range s.Links() {
			if !members[l.SpanContext.SpanID()] {
				t.Errorf("batch links %v, not a member", l.SpanContext.SpanID())
			}
			linked++
		}
		if size := attr(s, "notifyedge.batch.size"); size != int64(len(s.Links())) {
			t.Errorf("batch of %d members links %d", size, len(s.Links()))
		}
	}
	if linked > n/2 {
		t.Errorf("%d links over %d members: one linked twice", linked, n/2)
	}
}

// attr is span's int attribute key (0 without one).
func attr(s sdktrace.ReadOnlySpan, key string) int64 {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.AsInt64()
		}
	}
	return 0
}
