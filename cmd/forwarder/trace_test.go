package main

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/redisstream"
)

// An event that carries its callback's traceparent is forwarded with it as
// the traceparent header; one without, or with a malformed one (not what
// the relay writes), is forwarded without.
func TestTraceparentForwarded(t *testing.T) {
	e := newTestEnv(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	traced := durable.OutboxMessage{ID: 1, EventID: newEventID(), Topic: "ORDER_PAID", OrderNo: "O-t",
		Payload: []byte(`{"order_no": "O-t", "occurred_at": "2026-12-06T01:02:03.000004Z"}`), CreatedAt: time.Now(), Traceparent: tp}
	plain := traced
	plain.ID, plain.EventID, plain.OrderNo, plain.Traceparent = 2, newEventID(), "O-p", ""
	plain.Payload = []byte(`{"order_no": "O-p", "occurred_at": "2026-12-06T01:02:03.000004Z"}`)
	if err := e.pub.Publish(context.Background(), []durable.OutboxMessage{traced, plain}); err != nil {
		t.Fatal(err)
	}
	if err := e.client.XAdd(context.Background(), &redis.XAddArgs{Stream: e.stream, Values: []any{
		redisstream.FieldOutboxID, 3, redisstream.FieldTopic, "ORDER_PAID", redisstream.FieldOrderNo, "O-m",
		redisstream.FieldPayload, `{"order_no": "O-m"}`, redisstream.FieldTraceparent, "00-xyz\r\ninjected: 1",
	}}).Err(); err != nil {
		t.Fatal(err)
	}
	e.start(e.config("f1"))
	waitFor(t, "the three events", func() bool { return e.recv.unique() == 3 })
	e.recv.checkNoProblems()
	want := map[int64]string{1: tp, 2: "", 3: ""}
	for _, a := range e.recv.snapshot() {
		if a.Traceparent != want[a.OutboxID] {
			t.Errorf("outbox id %d forwarded with traceparent %q, want %q", a.OutboxID, a.Traceparent, want[a.OutboxID])
		}
	}
}
