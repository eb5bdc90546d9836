package bills_test

import (
	"context"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge/reconcile/bills"
	"github.com/notifyedge/notifyedge/edge/tracing/tracingtest"
)

// With tracing set up, a day's run is a span: the channel, the day, the
// run's state and its counts by category.
func TestBillRunSpan(t *testing.T) {
	rec := tracingtest.Record(t)

	ctx := context.Background()
	store := newStore(t)
	zone, _ := time.LoadLocation("Asia/Shanghai")
	r, err := bills.New(bills.Config{Store: store, Decider: noDecisions{t}, Authority: noAuthority{}, Zone: zone})
	if err != nil {
		t.Fatal(err)
	}
	r.SetBillers(map[string]bills.Biller{"wx": &biller{}})
	run, err := r.RunDay(ctx, "wx", "2026-12-05")
	if err != nil || run.State != durable.BillOK {
		t.Fatalf("run: %+v %v", run, err)
	}
	spans := rec.Ended()
	if len(spans) != 1 || spans[0].Name() != "bill run" {
		t.Fatalf("spans %v, want one bill run", spans)
	}
	got := tracingtest.Attributes(spans[0])
	for k, v := range map[string]string{"notifyedge.channel": "wx", "notifyedge.bill_date": "2026-12-05",
		"notifyedge.bill_state": durable.BillOK, "notifyedge.bill." + durable.BillMatched: "0"} {
		if got[k] != v {
			t.Errorf("attribute %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}
