package edge_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// Two nodes on a Redis Cluster (3 masters, a replica each) and one
// Postgres. First deliveries, then duplicate storms from both nodes while
// one master is SIGKILLed: every answer stays the first answer, the keys
// of the healthy masters keep being answered from the cache (one breaker
// per master), the dead master's keys go to Postgres until its replica is
// promoted, and the SQL invariants hold.
func TestClusterMasterKilledMidLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster and waits for a failover")
	}
	ctx := context.Background()
	cl, err := claimcachetest.StartCluster(ctx, 3, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	a := setup(t, options{cluster: cl})
	b := setup(t, options{cluster: cl, dbURL: a.dbURL})
	const keys = 120
	payloads := a.seedPaid(t, "CL", keys) // first deliveries through a
	waitClusterDone(t, cl, keys)
	victim, err := cl.MasterOf(ctx, "ne:{acme:TCL-0000:PAY_SUCCESS}")
	if err != nil {
		t.Fatal(err)
	}
	onVictim := 0
	for i := range keys {
		m, err := cl.MasterOf(ctx, fmt.Sprintf("ne:{acme:TCL-%04d:PAY_SUCCESS}", i))
		if err != nil {
			t.Fatal(err)
		}
		if m == victim {
			onVictim++
		}
	}
	before := a.cacheAnswers(t) + b.cacheAnswers(t)
	firstBody := `{"code":"SUCCESS","outcome":"applied","status":"PAID"}`
	var wg sync.WaitGroup
	var mu sync.Mutex
	var wrong []string
	sent := 0
	storm := func(n *bundle) {
		defer wg.Done()
		for round := range 20 {
			for i, p := range payloads {
				r := n.post(t, p)
				mu.Lock()
				sent++
				if r.status != 200 || !r.replayed || r.body != firstBody {
					wrong = append(wrong, fmt.Sprintf("round %d key %d: %+v", round, i, r))
				}
				mu.Unlock()
			}
		}
	}
	wg.Add(2)
	go storm(a)
	go storm(b)
	// Kill the master once the storm is under way (a tenth of it answered).
	wait.For(t, "the storm under way (a tenth answered)", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return sent >= len(payloads)*4, fmt.Sprintf("%d answered", sent)
	})
	victim.Kill()
	wg.Wait()
	if len(wrong) > 0 {
		t.Fatalf("%d wrong answers, first: %s", len(wrong), wrong[0])
	}
	fromCache := a.cacheAnswers(t) + b.cacheAnswers(t) - before
	healthy := float64(sent) * float64(keys-onVictim) / keys
	t.Logf("%d duplicates, %d keys of %d on the killed master; %0.f answered from the cache (the healthy masters' share: %.0f)",
		sent, onVictim, keys, fromCache, healthy)
	if fromCache < 0.95*healthy {
		t.Errorf("%0.f duplicates answered from the cache, want at least 95%% of the healthy masters' %.0f", fromCache, healthy)
	}
	if err := durabletest.Invariants(ctx, a.db, "CL-", nil); err != nil {
		t.Error(err)
	}
}

// cacheAnswers is the node's replayed_cache count.
func (b *bundle) cacheAnswers(t *testing.T) float64 {
	return b.metric(t, `notifyedge_requests_total{channel="acme",outcome="replayed_cache"}`)
}

// replicated returns an error unless m's replicas have all of its
// replication stream (their offsets reached its own).
func replicated(ctx context.Context, m *redis.Client) error {
	info, err := m.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	var own string
	var replicas []string
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "master_repl_offset:"); ok {
			own = v
		}
		if strings.HasPrefix(line, "slave") && strings.Contains(line, "offset=") {
			_, rest, _ := strings.Cut(line, "offset=")
			off, _, _ := strings.Cut(rest, ",")
			replicas = append(replicas, off)
		}
	}
	if len(replicas) == 0 {
		return fmt.Errorf("%s has no replica", m.Options().Addr)
	}
	for _, off := range replicas {
		if off != own {
			return errNotYet
		}
	}
	return nil
}

var errNotYet = errors.New("replicas behind")

// waitClusterDone waits until the cluster's masters hold at least n done
// entries (Complete runs after the answer), and their replicas have them.
func waitClusterDone(t *testing.T, cl *claimcachetest.Cluster, n int) {
	t.Helper()
	cc := cl.Client()
	defer cc.Close()
	ctx := context.Background()
	wait.For(t, fmt.Sprintf("%d done entries in the cluster's masters and replicas", n), func() (bool, string) {
		var mu sync.Mutex
		done := 0
		err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			n, err := doneEntries(ctx, m)
			if err != nil {
				return err
			}
			mu.Lock()
			done += n
			mu.Unlock()
			return replicated(ctx, m)
		})
		if err != nil && !errors.Is(err, errNotYet) {
			t.Fatal(err)
		}
		return done >= n && err == nil, fmt.Sprintf("%d done (%v)", done, err)
	})
}
