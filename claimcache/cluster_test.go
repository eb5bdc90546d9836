package claimcache_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// A master of a Redis Cluster is killed mid-load. Its keys go to Postgres
// (errors here) until its replica is promoted, then are answered again from
// the replica's copy; the other masters' keys are answered from the cache
// throughout: one breaker per master, so a dead one refuses nothing of the
// others'. No answer is ever wrong.
func TestClusterMasterKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of its own and waits for a failover")
	}
	ctx := context.Background()
	cl, err := claimcachetest.StartCluster(ctx, 3, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	var mu sync.Mutex
	opened := map[string]int{}
	c := newCache(t, cl.URL(), claimcache.Config{BreakerFailures: 3, BreakerCooldown: 200 * time.Millisecond,
		OnBreaker: func(node string, open bool) {
			if open {
				mu.Lock()
				opened[node]++
				mu.Unlock()
			}
		}})
	const keys = 300
	d := digest("x")
	answer := func(i int) string { return fmt.Sprintf("answer %d", i) }
	key := func(i int) []byte { return fmt.Appendf(nil, "kill:%d", i) }
	for i := range keys {
		if r, err := c.Claim(ctx, key(i), d); err != nil || r.Verdict != claimcache.Won {
			t.Fatalf("claim %d: %v %v", i, r.Verdict, err)
		}
		if err := c.Complete(ctx, key(i), d, []byte(answer(i))); err != nil {
			t.Fatal(err)
		}
	}
	// Every done entry on the replicas too before the kill: the test is
	// about the breakers, not about Redis's asynchronous replication.
	waitReplicated(t, cl)
	victim, err := cl.MasterOf(ctx, "ne:{"+string(key(0))+"}")
	if err != nil {
		t.Fatal(err)
	}
	onVictim := make([]bool, keys)
	for i := range keys {
		m, err := cl.MasterOf(ctx, "ne:{"+string(key(i))+"}")
		if err != nil {
			t.Fatal(err)
		}
		onVictim[i] = m == victim
	}
	victim.Kill()
	killed := time.Now()
	healthyErrors, victimErrors, wrong := 0, 0, 0
	var back time.Duration // when the victim's keys were answered again
	for time.Since(killed) < wait.Timeout {
		victimOK := true
		for i := range keys {
			r, err := c.Claim(ctx, key(i), d)
			switch {
			case err != nil && onVictim[i]:
				victimErrors++
				victimOK = false
			case err != nil:
				healthyErrors++
				t.Logf("key %d (healthy master): %v", i, err)
			case r.Verdict != claimcache.Done || r.Response != answer(i):
				wrong++
				t.Errorf("key %d: %v %q, want done %q", i, r.Verdict, r.Response, answer(i))
			}
		}
		if victimOK && victimErrors > 0 {
			back = time.Since(killed)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if healthyErrors > 0 {
		t.Errorf("%d calls for keys of healthy masters failed while one master was down", healthyErrors)
	}
	if victimErrors == 0 {
		t.Error("no call for the dead master's keys failed: was it the master?")
	}
	if back == 0 {
		cc := cl.Client()
		defer cc.Close()
		nodes, _ := cc.ClusterNodes(ctx).Result()
		_, err := c.Claim(ctx, key(0), d)
		t.Fatalf("the dead master's keys were not answered again within %v (last: %v); nodes:\n%s", wait.Timeout, err, nodes)
	}
	mu.Lock()
	defer mu.Unlock()
	for node := range opened {
		if node != victim.Addr() {
			t.Errorf("the breaker of %q opened; only the dead master's (%s) should", node, victim.Addr())
		}
	}
	if opened[victim.Addr()] == 0 {
		t.Errorf("the dead master's breaker never opened")
	}
	t.Logf("dead master's keys answered again %v after the kill; %d refused meanwhile", back.Round(time.Millisecond), victimErrors)
	// Readiness: degraded while the dead master's breaker is open, ok once
	// the probe has forgotten the node that no longer serves anything.
	wait.For(t, "state ok after the failover", func() (bool, string) {
		s := c.State()
		return s == "ok", s
	})
}

// waitReplicated waits until every master's writes reached its replica
// (WAIT on each master).
func waitReplicated(t *testing.T, cl *claimcachetest.Cluster) {
	t.Helper()
	cc := cl.Client()
	defer cc.Close()
	ctx := context.Background()
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.Wait(ctx, 1, 5*time.Second).Result()
		if err != nil {
			return err
		}
		if n < 1 {
			return errors.New("replica not caught up in 5 s")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
