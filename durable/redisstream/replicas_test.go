package redisstream_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/outbox"
	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// With fewer replicas than asked (a single redis-server and Replicas 1),
// each row is appended once: the relay keeps the first batch unpublished,
// checks the entries it appended again instead of appending them again,
// and says it is degraded; the rows behind it wait, in order. An entry the
// stream lost meanwhile is appended again, never marked published. Once a
// replica attaches (--replicaof) every row is marked published, and the
// stream holds one entry a row.
func TestTooFewReplicasAppendOnce(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.paidAndRefunded(t, "RA", 12, false)
	pub := redisstream.NewPublisher(b.client, "", 0)
	pub.Replicas, pub.ReplicaTimeout = 1, 20*time.Millisecond
	if n, err := pub.ConnectedReplicas(ctx); err != nil || n != 0 {
		t.Fatalf("connected replicas %d %v, want 0", n, err)
	}
	var mu sync.Mutex
	var states []string
	var unconfirmed atomic.Int64
	var lastErr atomic.Value
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	const batch = 5
	go func() {
		defer close(done)
		b.store.RunRelay(rctx, durable.RelayConfig{Publisher: pub, Poll: 20 * time.Millisecond, Batch: batch,
			OnState: func(st string) { mu.Lock(); states = append(states, st); mu.Unlock() },
			OnUnconfirmed: func(err error) {
				unconfirmed.Add(1)
				lastErr.Store(err)
			},
			OnError: func(err error) { t.Errorf("relay: %v", err) }})
	}()
	t.Cleanup(func() { cancel(); <-done })
	state := func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(states) == 0 {
			return ""
		}
		return states[len(states)-1]
	}
	// entries reads the stream's outbox ids, failing the test on one
	// appended twice.
	entries := func() []int64 {
		msgs, err := b.client.XRange(ctx, redisstream.DefaultStream, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		seen := map[int64]bool{}
		var ids []int64
		for _, m := range msgs {
			id, _ := strconv.ParseInt(fmt.Sprint(m.Values[redisstream.FieldOutboxID]), 10, 64)
			if seen[id] {
				t.Fatalf("outbox id %d appended twice: stream %v", id, msgs)
			}
			seen[id] = true
			ids = append(ids, id)
		}
		return ids
	}
	wait.For(t, "the relay degraded, its first batch appended and checked again", func() (bool, string) {
		n := len(entries())
		return state() == "degraded" && unconfirmed.Load() >= 20 && n == batch,
			fmt.Sprintf("state %q, %d unconfirmed publishes, stream %d entries", state(), unconfirmed.Load(), n)
	})
	// The stream loses the last two entries (a failover to a replica that
	// had not got them): they go again, and are still not published.
	msgs, err := b.client.XRange(ctx, redisstream.DefaultStream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.client.XDel(ctx, redisstream.DefaultStream, msgs[len(msgs)-1].ID, msgs[len(msgs)-2].ID).Err(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the lost entries appended again", func() (bool, string) {
		n := len(entries())
		return n == batch, fmt.Sprintf("stream %d entries", n)
	})
	b.paidAndRefunded(t, "RB", 3, false)
	seen := unconfirmed.Load()
	wait.For(t, "more checks while the later rows wait", func() (bool, string) {
		return unconfirmed.Load() >= seen+20, fmt.Sprint(unconfirmed.Load())
	})
	rows := b.count(t, `SELECT count(*) FROM outbox`)
	if n := len(entries()); n != batch {
		t.Errorf("stream %d entries while degraded, want the first batch (%d) and the rows behind it waiting", n, batch)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL`); n != 0 {
		t.Errorf("%d rows marked published that no replica holds", n)
	}
	if err, _ := lastErr.Load().(error); !errors.Is(err, redisstream.ErrReplicas) || !errors.Is(err, outbox.ErrUnconfirmed) {
		t.Errorf("the relay heard %v, want ErrReplicas (outbox.ErrUnconfirmed)", err)
	}
	t.Logf("degraded: %d rows, stream length %d, %d checks; %v", rows, len(entries()), unconfirmed.Load(), lastErr.Load())

	host, port, _ := net.SplitHostPort(b.redis.Addr())
	replica, err := claimcachetest.Start("--replicaof", host, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(replica.Stop)
	b.waitPublished(t)
	wait.For(t, "the relay running again", func() (bool, string) { return state() == "running", state() })
	if ids := entries(); len(ids) != rows || !slices.IsSorted(ids) {
		t.Errorf("stream %v for %d rows once the replica attached, want one entry a row, in outbox order", ids, rows)
	}
	if n, err := pub.ConnectedReplicas(ctx); err != nil || n != 1 {
		t.Errorf("connected replicas %d %v, want 1", n, err)
	}
	t.Logf("with the replica: %d rows, stream length %d, all published", rows, len(entries()))
}
