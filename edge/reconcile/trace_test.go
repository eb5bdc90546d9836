package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge/reconcile"
	"github.com/notifyedge/notifyedge/edge/reconcile/query"
	"github.com/notifyedge/notifyedge/edge/tracing/tracingtest"
)

// With tracing set up, each question to a channel is a span: the channel,
// whether a person asked, and the result; never the order or the answer.
func TestQuerySpan(t *testing.T) {
	rec := tracingtest.Record(t)

	r := newRig(t)
	wx := newAnswers()
	rc, err := reconcile.New(reconcile.Config{Store: r.store, Decider: &decisions{}, Authority: noAuthority{},
		Window:  durable.ReconcileWindow{After: time.Minute, Horizon: 3 * time.Hour},
		Backoff: []time.Duration{10 * time.Minute}, Rate: 1000})
	if err != nil {
		t.Fatal(err)
	}
	rc.SetQueriers(map[string]reconcile.Querier{"wx": wx})
	r.order(t, "O-span", "wx")
	wx.set("O-span", query.Paid)
	if rep, err := rc.Ask(context.Background(), "O-span"); err != nil || rep.Result != reconcile.ResultApplied {
		t.Fatalf("ask: %+v %v", rep, err)
	}
	spans := rec.Ended()
	if len(spans) != 1 || spans[0].Name() != "reconcile query" {
		t.Fatalf("spans %v, want one reconcile query", spans)
	}
	got := tracingtest.Attributes(spans[0])
	want := map[string]string{"notifyedge.channel": "wx", "notifyedge.manual": "true", "notifyedge.result": reconcile.ResultApplied}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("attribute %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	for k, v := range got {
		if v == "O-span" {
			t.Errorf("attribute %s holds the order number", k)
		}
	}
}
