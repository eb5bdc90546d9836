package redisstream_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/outbox"
	"github.com/notifyedge/notifyedge/durable/redisstream"
)

// With fewer replicas than asked (a single redis-server and Replicas 1),
// each row is appended once: the relay keeps the rows unpublished, checks
// the entries it appended again instead of appending them again, and says
// it is degraded; rows written meanwhile are appended too. Once a replica
// attaches (--replicaof) every row is marked published, and the stream
// holds one entry a row.
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
	go func() {
		defer close(done)
		b.store.RunRelay(rctx, durable.RelayConfig{Publisher: pub, Poll: 20 * time.Millisecond, Batch: 5,
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
	rows := b.count(t, `SELECT count(*) FROM outbox`)
	streamLen := func() int {
		n, err := b.client.XLen(ctx, redisstream.DefaultStream).Result()
		if err != nil {
			t.Fatal(err)
		}
		return int(n)
	}
	// Many checks of every row, then more rows while degraded.
	appendedOnce := func() {
		if n := streamLen(); n > rows {
			t.Fatalf("stream length %d for %d rows: a row was appended again", n, rows)
		}
	}
	claimcachetest.WaitFor(t, "the relay degraded, every row appended and checked again", func() (bool, string) {
		appendedOnce()
		return state() == "degraded" && unconfirmed.Load() >= 20 && streamLen() == rows,
			fmt.Sprintf("state %q, %d unconfirmed publishes, stream %d of %d rows", state(), unconfirmed.Load(), streamLen(), rows)
	})
	b.paidAndRefunded(t, "RB", 3, false)
	rows = b.count(t, `SELECT count(*) FROM outbox`)
	seen := unconfirmed.Load()
	claimcachetest.WaitFor(t, "the later rows appended and checked again", func() (bool, string) {
		appendedOnce()
		return streamLen() == rows && unconfirmed.Load() >= seen+20,
			fmt.Sprintf("stream %d of %d rows, %d unconfirmed publishes", streamLen(), rows, unconfirmed.Load())
	})
	if n := streamLen(); n != rows {
		t.Errorf("stream length %d for %d rows while degraded: a row was appended again", n, rows)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL`); n != 0 {
		t.Errorf("%d rows marked published that no replica holds", n)
	}
	if err, _ := lastErr.Load().(error); !errors.Is(err, redisstream.ErrReplicas) || !errors.Is(err, outbox.ErrUnconfirmed) {
		t.Errorf("the relay heard %v, want ErrReplicas (outbox.ErrUnconfirmed)", err)
	}
	t.Logf("degraded: %d rows, stream length %d, %d checks; %v", rows, streamLen(), unconfirmed.Load(), lastErr.Load())

	host, port, _ := net.SplitHostPort(b.redis.Addr())
	replica, err := claimcachetest.Start("--replicaof", host, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(replica.Stop)
	b.waitPublished(t)
	claimcachetest.WaitFor(t, "the relay running again", func() (bool, string) { return state() == "running", state() })
	if n := streamLen(); n != rows {
		t.Errorf("stream length %d for %d rows once the replica attached, want one entry a row", n, rows)
	}
	if n, err := pub.ConnectedReplicas(ctx); err != nil || n != 1 {
		t.Errorf("connected replicas %d %v, want 1", n, err)
	}
	t.Logf("with the replica: %d rows, stream length %d, all published", rows, streamLen())
}
