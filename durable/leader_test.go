package durable_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// WithLock: one session holds the lock at a time; the next gets it once
// it ends, and a holder whose lock's connection dies learns it.
func TestWithLockOneAtATime(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leading := make(chan struct{})
	release := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- b.store.WithLock(ctx, 4242, "test", func(ctx context.Context) error {
			close(leading)
			<-release
			return nil
		})
	}()
	<-leading
	if err := b.store.WithLock(ctx, 4242, "test", func(context.Context) error { return nil }); !errors.Is(err, durable.ErrNotLeader) {
		t.Fatalf("second leader: %v, want ErrNotLeader", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := b.store.WithLock(ctx, 4242, "test", func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("after the first ended: %v, ran %v", err, ran)
	}
	// The lock's session killed: run's context ends with the cause.
	err := b.store.WithLock(ctx, 4242, "test", func(rctx context.Context) error {
		if _, err := b.db.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'notifyedge-test'`); err != nil {
			return err
		}
		<-rctx.Done()
		return nil
	})
	if err == nil {
		t.Fatal("a leader whose lock connection died did not learn it")
	}
}

// RunLeader, on two nodes at once: exactly one leads; when the leader's
// session dies, the other takes over within its Retry and the dead one's
// leadership ends (its context ends, its error is heard); a node that is
// not eligible never takes the lock. The roles (the relay, retention,
// reconciliation, the bills) lead through it and are not tested for this
// again.
func TestRunLeader(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var leaders atomic.Int32
	var maxLeaders atomic.Int32
	var mu sync.Mutex
	lost := map[string]error{}
	states := map[string]string{}
	run := func(name string, eligible func() bool) {
		go b.store.RunLeader(ctx, durable.LeaderConfig{Name: "leadtest-" + name, LockID: 4343, Retry: 50 * time.Millisecond, Eligible: eligible,
			OnState: func(st string) { mu.Lock(); states[name] = st; mu.Unlock() },
			OnError: func(err error) { mu.Lock(); lost[name] = err; mu.Unlock() },
		}, func(lctx context.Context) error {
			n := leaders.Add(1)
			for m := maxLeaders.Load(); n > m && !maxLeaders.CompareAndSwap(m, n); m = maxLeaders.Load() {
			}
			<-lctx.Done()
			leaders.Add(-1)
			return nil
		})
	}
	run("a", nil)
	run("b", nil)
	run("never", func() bool { return false })
	leader := func() string {
		mu.Lock()
		defer mu.Unlock()
		for n, st := range states {
			if st == durable.StateLeader {
				return n
			}
		}
		return ""
	}
	wait.For(t, "a leader", func() (bool, string) { l := leader(); return l != "", fmt.Sprint(states) })
	first := leader()
	if first == "never" {
		t.Fatal("a node that may not lead took the lock")
	}
	// Both sessions alive: one leader, however long they try.
	time.Sleep(300 * time.Millisecond) // six tries of the standby: a span to watch, not a wait for a condition
	if m := maxLeaders.Load(); m != 1 {
		t.Fatalf("%d leaders at once while both sessions lived", m)
	}
	// Its session killed: the other takes over, and the first learns it
	// lost the lock (its lead's context ends, with the error heard).
	if _, err := b.db.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, "notifyedge-leadtest-"+first); err != nil {
		t.Fatal(err)
	}
	// Until the dead session is noticed (a ping every few seconds) the
	// first may still run: it must stop, and the other lead alone.
	wait.For(t, "the other node leading alone", func() (bool, string) {
		l := leader()
		mu.Lock()
		defer mu.Unlock()
		return l != "" && l != first && l != "never" && lost[first] != nil && leaders.Load() == 1, fmt.Sprint(states, lost, leaders.Load())
	})
	mu.Lock()
	if st := states["never"]; st != durable.StateStandby {
		t.Errorf("the ineligible node is %q", st)
	}
	mu.Unlock()
}
