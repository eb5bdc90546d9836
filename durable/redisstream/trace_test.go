package redisstream_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/redisstream"
)

// traceparentOf is a distinct W3C traceparent for order i.
func traceparentOf(i int) string {
	return fmt.Sprintf("00-%032x-%016x-01", 0xabc000+i, 0xdef000+i)
}

// A sampled callback's traceparent goes with its outbox row's event, by
// the statement that decided it, whether decided alone or in a group
// commit's batch: the stream entry carries it; an unsampled callback's
// entry carries none, and a delivery that applied nothing keeps none.
func TestTraceparentTravelsWithTheEvent(t *testing.T) {
	for _, group := range []bool{false, true} {
		t.Run(fmt.Sprintf("group commit %v", group), func(t *testing.T) {
			b := setup(t)
			store, err := durable.New(context.Background(), durable.Config{URL: b.url, MaxConns: 8, MinConns: 1, GroupCommit: group})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(store.Close)
			ctx := context.Background()
			const n = 24
			orders := make([]pgtemp.Order, n)
			for i := range n {
				orders[i] = pgtemp.Order{No: fmt.Sprintf("T-%02d", i), Status: "PENDING_PAY", Amount: 1999, Currency: "CNY"}
			}
			if err := pgtemp.SeedOrders(ctx, b.url, orders); err != nil {
				t.Fatal(err)
			}
			// Even orders are sampled; all are decided at once, so that
			// group commit batches them.
			var wg sync.WaitGroup
			for i, o := range orders {
				wg.Go(func() {
					nt := note("P"+o.No, durable.PaySuccess, o.No)
					if i%2 == 0 {
						nt.Traceparent = traceparentOf(i)
					}
					if r, err := store.Process(ctx, nt); err != nil || r.Outcome != durable.Applied {
						t.Errorf("pay %s: %+v %v", o.No, r, err)
					}
				})
			}
			wg.Wait()
			// A duplicate, sampled under another trace, is replayed: it
			// applies nothing, and keeps no trace context.
			dup := note("PT-00", durable.PaySuccess, "T-00")
			dup.Traceparent = traceparentOf(999)
			if r, err := store.Process(ctx, dup); err != nil || !r.Replayed {
				t.Fatalf("duplicate: %+v %v", r, err)
			}
			if got := b.count(t, `SELECT count(*) FROM notify_trace`); got != n/2 {
				t.Errorf("notify_trace holds %d rows, want %d (the sampled deliveries that applied)", got, n/2)
			}

			runRelay(t, store, redisstream.NewPublisher(b.client, "", 0), nil)
			b.waitPublished(t)
			msgs, err := b.client.XRange(ctx, redisstream.DefaultStream, "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) != n {
				t.Fatalf("%d stream entries, want %d", len(msgs), n)
			}
			for _, m := range msgs {
				var i int
				fmt.Sscanf(m.Values[redisstream.FieldOrderNo].(string), "T-%d", &i)
				tp, ok := m.Values[redisstream.FieldTraceparent]
				switch {
				case i%2 == 0 && tp != traceparentOf(i):
					t.Errorf("order T-%02d's event: traceparent %v, want %s", i, tp, traceparentOf(i))
				case i%2 == 1 && ok:
					t.Errorf("order T-%02d's event, not sampled: traceparent %v", i, tp)
				}
			}
		})
	}
}
