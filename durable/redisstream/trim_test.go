package redisstream_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/redisstream"
)

// midTrim is a go-redis hook that, once armed, runs act before the first
// command of the trim that is not XINFO: between the trim's read of the
// groups and its next read, or just before a trim that reads them in one
// command.
type midTrim struct {
	mu    sync.Mutex
	armed bool
	act   func()
}

func (h *midTrim) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *midTrim) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *midTrim) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		fire := h.armed && cmd.Name() != "xinfo"
		if fire {
			h.armed = false
		}
		h.mu.Unlock()
		if fire {
			h.act()
		}
		return next(ctx, cmd)
	}
}

// Trimming never removes an entry that a consumer group has not read and
// acknowledged, whatever the groups do while the trim reads them: the
// forwarder's group acknowledges its last pending entry mid-trim (while
// the shipper's group is far ahead), and a group is created mid-trim.
// Afterwards the forwarder reads every entry it had not read, and the new
// group every entry.
func TestTrimKeepsWhatAGroupHasNotRead(t *testing.T) {
	srv := plainRedis(t)
	ctx := context.Background()
	opts := &redis.Options{Addr: srv.Addr()}
	plain, hooked := redis.NewClient(opts), redis.NewClient(opts)
	t.Cleanup(func() { plain.Close(); hooked.Close() })
	hook := &midTrim{}
	hooked.AddHook(hook)
	const stream, n = "trim-test", 7
	pub := redisstream.NewPublisher(hooked, stream, 0)
	var msgs []durable.OutboxMessage
	for i := range n {
		msgs = append(msgs, durable.OutboxMessage{ID: int64(i + 1), Topic: "ORDER_PAID", OrderNo: fmt.Sprintf("O-%d", i), Payload: []byte("{}")})
	}
	if err := pub.Publish(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	// XINFO GROUPS lists the groups by name: the forwarder's comes first.
	read := func(group string, count int64) []redis.XMessage {
		t.Helper()
		got, err := plain.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c",
			Streams: []string{stream, ">"}, Count: count, Block: -1}).Result()
		if err == redis.Nil {
			return nil
		}
		if err != nil {
			t.Fatalf("%s reads: %v", group, err)
		}
		return got[0].Messages
	}
	for _, g := range []string{"a-forwarder", "b-shipper"} {
		if err := plain.XGroupCreate(ctx, stream, g, "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	forwarded := read("a-forwarder", 1)
	shipped := read("b-shipper", 100)
	if len(forwarded) != 1 || len(shipped) != n {
		t.Fatalf("read %d and %d entries, want 1 and %d", len(forwarded), len(shipped), n)
	}
	for _, m := range shipped {
		if err := plain.XAck(ctx, stream, "b-shipper", m.ID).Err(); err != nil {
			t.Fatal(err)
		}
	}
	hook.act = func() {
		if err := plain.XAck(ctx, stream, "a-forwarder", forwarded[0].ID).Err(); err != nil {
			t.Error(err)
		}
		if err := plain.XGroupCreate(ctx, stream, "c-late", "0").Err(); err != nil {
			t.Error(err)
		}
	}
	hook.mu.Lock()
	hook.armed = true
	hook.mu.Unlock()
	if err := pub.Trim(ctx); err != nil {
		t.Fatal(err)
	}
	hook.mu.Lock()
	acted := !hook.armed
	hook.mu.Unlock()
	if !acted {
		t.Fatal("the trim sent no command for the hook to act before")
	}
	if got := read("a-forwarder", 100); len(got) != n-1 {
		t.Errorf("the forwarder read %d of the %d entries it had not read: the trim removed the rest", len(got), n-1)
	}
	if got := read("c-late", 100); len(got) != n {
		t.Errorf("the group created mid-trim read %d of %d entries", len(got), n)
	}
	// Once every group has read and acknowledged everything, the trim
	// takes all but the last delivered entry.
	for _, g := range []string{"a-forwarder", "c-late"} {
		pend, err := plain.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: g, Start: "-", End: "+", Count: 100}).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pend {
			plain.XAck(ctx, stream, g, p.ID)
		}
	}
	if err := pub.Trim(ctx); err != nil {
		t.Fatal(err)
	}
	if l, err := plain.XLen(ctx, stream).Result(); err != nil || l != 1 {
		t.Errorf("stream length %d %v after every group acknowledged all, want 1 (the last delivered)", l, err)
	}
}

// A trim of a stream that does not exist, or has no groups, trims nothing
// and is no error; a key of another type is.
func TestTrimWithoutGroups(t *testing.T) {
	srv := plainRedis(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	if err := redisstream.NewPublisher(c, "none", 0).Trim(ctx); err != nil {
		t.Errorf("no stream: %v", err)
	}
	c.XAdd(ctx, &redis.XAddArgs{Stream: "nogroups", Values: []string{"k", "v"}})
	if err := redisstream.NewPublisher(c, "nogroups", 0).Trim(ctx); err != nil {
		t.Errorf("no groups: %v", err)
	}
	if l, _ := c.XLen(ctx, "nogroups").Result(); l != 1 {
		t.Errorf("a stream without groups trimmed to %d entries", l)
	}
	c.Set(ctx, "astring", "x", 0)
	if err := redisstream.NewPublisher(c, "astring", 0).Trim(ctx); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("a string key: %v, want WRONGTYPE", err)
	}
}

// plainRedis starts a redis-server for the test, stopped with it.
func plainRedis(t *testing.T) *claimcachetest.Server {
	t.Helper()
	srv, err := claimcachetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv
}
