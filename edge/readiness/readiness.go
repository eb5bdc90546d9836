// Package readiness decides what a node's /readyz answers, from probes
// that run on their own schedule: the endpoint reads their last result
// and never waits for Postgres or Redis itself, so a load balancer's check
// is answered at once whatever they do.
//
// A node leaves rotation when it alone lost Postgres: the others can take
// its callbacks. When every node lost it at once (a failover, the
// database down), leaving rotation helps nobody and refuses what the
// nodes can still answer from the claim cache (a duplicate of a payment
// already applied gets its stored answer; a first delivery gets the
// node's own 503 and Retry-After). Which of the two it is, the nodes tell
// each other through the cache's Redis: each records when it last reached
// Postgres (Peers), and a node that cannot reach it asks whether any other
// did since its own first failed probe (and within Window): at the start
// of a shared outage no other node has, so no node leaves rotation, and a
// node that alone lost the database hears of the others' next successes
// within one round of their probes.
package readiness

import (
	"cmp"
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Peers records which nodes reached Postgres when. The claim cache's Redis
// holds it (RedisPeers); without one a node cannot tell a shared outage
// from its own.
type Peers interface {
	// Reached records that node reached Postgres at at.
	Reached(ctx context.Context, node string, at time.Time) error
	// OthersReachedSince reports whether a node other than node reached
	// Postgres at since or later.
	OthersReachedSince(ctx context.Context, node string, since time.Time) (bool, error)
}

// The outage values of State.
const (
	// OutageNone: Postgres answers this node.
	OutageNone = ""
	// OutageShared: this node cannot reach Postgres and no other node has
	// within Window: every node lost it, so this one stays in rotation.
	OutageShared = "shared"
	// OutageNode: this node cannot reach Postgres and another node has
	// within Window: this node leaves rotation.
	OutageNode = "node"
	// OutageUnknown: this node cannot reach Postgres and cannot ask the
	// others (no cache Redis, or it does not answer): it leaves rotation,
	// as it could answer nothing from the cache either.
	OutageUnknown = "unknown"
)

// Config configures a Checker.
type Config struct {
	// Node names this node among its peers (required when Peers is set;
	// unique per process, a restart included).
	Node string
	// Postgres pings the database (required).
	Postgres func(ctx context.Context) error
	// Redis reports the cache Redis's state, "ok", "degraded" or "off"
	// (nil: "off"). It may block for a while: it runs in the probe loop.
	Redis func() string
	// Peers, when set, tells a shared outage from this node's own.
	Peers Peers
	// Every is how often the probes run (default 500ms).
	Every time.Duration
	// Timeout bounds one Postgres ping (default 1s): a ping still waiting
	// after it counts as down.
	Timeout time.Duration
	// Window bounds how long ago another node's success still counts
	// (default 2s: four rounds of the others' probes). A success counts
	// when it came after this node's first failed probe of the outage: a
	// node whose failure began before the others' (it lost the database
	// first, or alone) stays out of rotation until their last successes
	// are older than Window.
	Window time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// State is the last probes' result.
type State struct {
	// Postgres is "ok" or "down" ("starting", before Postgres first
	// answered, is the caller's to say).
	Postgres string
	// Outage says whose outage a "down" is (OutageNone when "ok").
	Outage string
	// Redis is the cache Redis's state.
	Redis string
	// At is when the probes ran.
	At time.Time
}

// Ready reports whether the node should stay in rotation: Postgres answers,
// or every node lost it.
func (s State) Ready() bool { return s.Postgres == "ok" || s.Outage == OutageShared }

// Checker runs the probes and keeps their last result.
type Checker struct {
	cfg   Config
	state atomic.Pointer[State]
	// round serializes Probe: Run's rounds and a caller's own.
	round sync.Mutex
	// failingSince is when the current run of failed probes began (zero
	// while Postgres answers); held by round.
	failingSince time.Time
}

// New returns a Checker for cfg; until its first round (Probe or Run)
// State reports Postgres "ok". A caller that starts it before Postgres
// first answered reports "starting" itself until then, and runs a round
// (Probe) once it has.
func New(cfg Config) *Checker {
	cfg.Every = cmp.Or(cfg.Every, 500*time.Millisecond)
	cfg.Timeout = cmp.Or(cfg.Timeout, time.Second)
	cfg.Window = cmp.Or(cfg.Window, 2*time.Second)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Checker{cfg: cfg}
	c.state.Store(&State{Postgres: "ok", Redis: c.redis(), At: cfg.Now()})
	return c
}

// State returns the last round's result, without waiting for anything.
func (c *Checker) State() State { return *c.state.Load() }

// Run probes every Every until ctx ends.
func (c *Checker) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Every)
	defer t.Stop()
	for {
		c.Probe(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Probe runs one round: it pings Postgres, reads the Redis state, records
// a success with the peers or asks them after a failure, and stores the
// result: a caller that needs a fresh result (a database that just
// answered) runs one itself, one round at a time with Run's.
func (c *Checker) Probe(ctx context.Context) {
	c.round.Lock()
	defer c.round.Unlock()
	pctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	err := c.cfg.Postgres(pctx)
	cancel()
	now := c.cfg.Now()
	st := State{Postgres: "ok", Redis: c.redis(), At: now}
	if err != nil {
		if c.failingSince.IsZero() {
			c.failingSince = now
		}
		st.Postgres, st.Outage = "down", c.whose(ctx, now)
	} else {
		c.failingSince = time.Time{}
		if c.cfg.Peers != nil {
			// A failed record only makes this node's next outage look
			// shared to the others a little sooner; the next round
			// records again.
			_ = c.cfg.Peers.Reached(ctx, c.cfg.Node, now)
		}
	}
	c.state.Store(&st)
}

// whose asks the peers whether the outage is this node's alone: whether
// another node reached Postgres since this node's first failed probe, and
// within Window.
func (c *Checker) whose(ctx context.Context, now time.Time) string {
	if c.cfg.Peers == nil {
		return OutageUnknown
	}
	others, err := c.cfg.Peers.OthersReachedSince(ctx, c.cfg.Node, maxTime(c.failingSince, now.Add(-c.cfg.Window)))
	switch {
	case err != nil:
		return OutageUnknown
	case others:
		return OutageNode
	default:
		return OutageShared
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (c *Checker) redis() string {
	if c.cfg.Redis == nil {
		return "off"
	}
	return c.cfg.Redis()
}
