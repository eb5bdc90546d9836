package readiness_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/edge/readiness"
)

// clock is an injected clock the test moves by hand.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) advance(d time.Duration) { c.now = c.now.Add(d) }

// database is a Postgres probe the test turns off and on: what a ping
// returns while the database is reachable or not.
type database struct{ down bool }

func (d *database) ping(context.Context) error {
	if d.down {
		return errors.New("connection refused")
	}
	return nil
}

// peersOn starts a redis-server and returns RedisPeers on it under a key of
// the test's own.
func peersOn(t *testing.T) (readiness.RedisPeers, *claimcachetest.Server) {
	t.Helper()
	rs, err := claimcachetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	client := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { client.Close() })
	return readiness.RedisPeers{Client: client}, rs
}

// node is one node's Checker on the shared clock and peers.
func node(name string, db *database, peers readiness.Peers, clk *clock) *readiness.Checker {
	return readiness.New(readiness.Config{Node: name, Postgres: db.ping, Peers: peers, Now: clk.Now,
		Window: 2 * time.Second, Redis: func() string { return "ok" }})
}

// Three nodes on one database. One loses it alone: it leaves rotation (the
// others reached Postgres since its failure began). Then all lose it: the
// two that lose it now stay in rotation at once ("shared": nobody reached
// Postgres since), the one that lost it first once the others' last
// successes are older than the window. Postgres back: "ok" again.
func TestSharedOutageAgainstNodeOwn(t *testing.T) {
	peers, _ := peersOn(t)
	clk := &clock{now: time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)}
	ctx := context.Background()
	dbs := []*database{{}, {}, {}}
	nodes := []*readiness.Checker{node("a", dbs[0], peers, clk), node("b", dbs[1], peers, clk), node("c", dbs[2], peers, clk)}
	round := func() {
		for _, n := range nodes {
			n.Probe(ctx)
		}
		clk.advance(500 * time.Millisecond)
	}
	want := func(when string, i int, ready bool, postgres, outage string) {
		t.Helper()
		if st := nodes[i].State(); st.Ready() != ready || st.Postgres != postgres || st.Outage != outage {
			t.Errorf("%s: node %c %+v, want ready %v, postgres %q, outage %q", when, 'a'+i, st, ready, postgres, outage)
		}
	}
	round()
	for i := range nodes {
		want("Postgres up", i, true, "ok", readiness.OutageNone)
	}

	// Node a alone loses the database: b and c record after its failure.
	dbs[0].down = true
	round()
	round()
	want("a alone without Postgres", 0, false, "down", readiness.OutageNode)
	want("a alone without Postgres", 1, true, "ok", readiness.OutageNone)

	// Every node loses it.
	dbs[1].down, dbs[2].down = true, true
	round()
	want("just after every node lost it", 0, false, "down", readiness.OutageNode)
	want("just after every node lost it", 1, true, "down", readiness.OutageShared)
	want("just after every node lost it", 2, true, "down", readiness.OutageShared)
	for range 4 {
		round()
	}
	for i := range nodes {
		want("every node without Postgres, past the window", i, true, "down", readiness.OutageShared)
	}

	// The database back: one round records every node again.
	for _, db := range dbs {
		db.down = false
	}
	round()
	for i := range nodes {
		want("Postgres back", i, true, "ok", readiness.OutageNone)
	}
}

// Without peers, or when their Redis does not answer, a node cannot tell
// whose outage it is: it leaves rotation, as it would answer nothing from
// the cache either.
func TestOutageUnknownWithoutPeers(t *testing.T) {
	clk := &clock{now: time.Now()}
	db := &database{down: true}
	alone := node("a", db, nil, clk)
	alone.Probe(context.Background())
	if st := alone.State(); st.Ready() || st.Outage != readiness.OutageUnknown {
		t.Errorf("no peers: %+v, want outage unknown, not ready", st)
	}

	peers, rs := peersOn(t)
	n := node("a", db, peers, clk)
	rs.Kill()
	n.Probe(context.Background())
	if st := n.State(); st.Ready() || st.Outage != readiness.OutageUnknown {
		t.Errorf("peers' Redis down: %+v, want outage unknown, not ready", st)
	}
}

// A ping that hangs counts as down once Timeout has passed: the probe
// never waits longer than that, and State never waits at all.
func TestProbeTimesOutAHangingPing(t *testing.T) {
	hang := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	c := readiness.New(readiness.Config{Postgres: hang, Timeout: 50 * time.Millisecond})
	done := make(chan struct{})
	go func() { c.Probe(context.Background()); close(done) }()
	if st := c.State(); st.Postgres != "ok" {
		t.Errorf("State while the first probe hangs: %+v, want the initial ok", st)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the probe did not give up on a hanging ping")
	}
	if st := c.State(); st.Postgres != "down" {
		t.Errorf("after a hanging ping: %+v, want down", st)
	}
}

// Members older than PeersKeep are dropped as others record, so the set
// holds the nodes of the last hour only.
func TestRedisPeersDropsOldNodes(t *testing.T) {
	peers, _ := peersOn(t)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	if err := peers.Reached(ctx, "gone", t0); err != nil {
		t.Fatal(err)
	}
	if err := peers.Reached(ctx, "live", t0.Add(readiness.PeersKeep+time.Second)); err != nil {
		t.Fatal(err)
	}
	names, err := peers.Client.ZRange(ctx, readiness.DefaultPeersKey, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != "live" {
		t.Errorf("members %v, want only live", names)
	}
	// Only another node counts.
	if ok, err := peers.OthersReachedSince(ctx, "live", t0); err != nil || ok {
		t.Errorf("OthersReachedSince(live) = %v, %v; want false: live is the only member", ok, err)
	}
	if ok, err := peers.OthersReachedSince(ctx, "other", t0); err != nil || !ok {
		t.Errorf("OthersReachedSince(other) = %v, %v; want true", ok, err)
	}
}
