package claimcache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Errors of the cache epoch (Config.Epoch).
var (
	// ErrEpoch wraps a failed read of the epoch, reported through
	// Config.OnError; the cache keeps the epoch it had.
	ErrEpoch = errors.New("claimcache: read cache epoch")
	// ErrNoEpoch is returned without calling Redis while no epoch has been
	// read yet (the first read failed): go to Postgres.
	ErrNoEpoch = errors.New("claimcache: cache epoch not known yet")
)

// epochEvery is how often the epoch is read (and the longest one read may
// take): the bound on how long a node keeps answering from entries of a
// database that has been replaced.
const epochEvery = time.Second

// maxEpochLen bounds an epoch: it is in every key.
const maxEpochLen = 128

// epochState is the epoch requests run under: loaded once per call (one
// atomic load), never changed; a new epoch is a new epochState.
type epochState struct {
	epoch string
	// prefix starts every Redis key: "ne:<epoch>:{", or "ne:{" without an
	// epoch. The hash tag is the biz_key alone, so a key's cluster slot does
	// not move when the epoch does, and keys still spread over the slots.
	prefix string
	// gen numbers the epochs this process has seen; the local table holds
	// the entries of one generation.
	gen uint64
}

// key is the Redis key of an idempotency key: one allocation, as the
// string Redis is sent must be.
func (st *epochState) key(k []byte) string {
	return st.prefix + string(k) + keySuffix
}

// noEpoch is the state of a cache configured without an epoch.
var noEpoch = &epochState{prefix: keyPrefix}

// state returns the epoch to run a call under, or ErrNoEpoch.
func (c *Cache) state() (*epochState, error) {
	st := c.epoch.Load()
	if st == nil {
		return nil, ErrNoEpoch
	}
	return st, nil
}

// validEpoch refuses what would break the key layout: a brace would move
// the hash tag off the biz_key.
func validEpoch(e string) error {
	if e == "" || len(e) > maxEpochLen || strings.ContainsAny(e, "{}") {
		return fmt.Errorf("epoch %q: want 1 to %d bytes without braces", e, maxEpochLen)
	}
	return nil
}

// readEpoch reads the epoch and switches to it if it changed; a failure
// keeps the epoch the cache has, and goes to OnError.
func (c *Cache) readEpoch(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, epochEvery)
	e, err := c.epochFn(rctx)
	cancel()
	if err == nil {
		err = validEpoch(e)
	}
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrEpoch, err)
		c.report(err)
		return err
	}
	if c.marker != nil {
		mctx, cancel := context.WithTimeout(ctx, epochEvery)
		next, err := c.checkMark(mctx, e)
		cancel()
		switch {
		case errors.Is(err, ErrBehind):
			// The entries under e may hold answers the database lost:
			// answer nothing from the cache until an epoch of its own.
			c.dropEpoch()
			c.report(err)
			return err
		case err == nil:
			e = next
		default:
			c.report(err) // not checked this time; the next read checks
			if next != e && validEpoch(next) == nil {
				e = next
			}
		}
	}
	c.setEpoch(e)
	return nil
}

// report hands err to OnError, if set.
func (c *Cache) report(err error) {
	if c.onError != nil {
		c.onError(err)
	}
}

// RefreshEpoch reads the epoch now rather than at the next tick, e.g. as
// soon as the database it comes from is reachable at start (until a first
// read succeeds the cache answers nothing). A failure keeps the epoch the
// cache has, goes to OnError, and is returned. Without Config.Epoch it does
// nothing.
func (c *Cache) RefreshEpoch(ctx context.Context) error {
	if c.epochFn == nil {
		return nil
	}
	return c.readEpoch(ctx)
}

// setEpoch switches to epoch e unless it is the current one: new calls use
// its keys at once, and the local table is emptied, since its entries were
// answers of another database. Entries of the old epoch in Redis are never
// read again and expire by their TTL.
func (c *Cache) setEpoch(e string) {
	c.epochMu.Lock() // the refresher and RefreshEpoch: one switch at a time
	defer c.epochMu.Unlock()
	old := c.epoch.Load()
	if old != nil && old.epoch == e {
		return
	}
	c.gens++ // never a generation the local table held before
	st := &epochState{epoch: e, prefix: "ne:" + e + ":{", gen: c.gens}
	c.epoch.Store(st)
	if c.local != nil {
		c.local.reset(st.gen)
	}
	if c.onEpoch != nil {
		c.onEpoch(e)
	}
}

// dropEpoch stops every call from using the cache (ErrNoEpoch) until an
// epoch is set again, and empties the local table.
func (c *Cache) dropEpoch() {
	c.epochMu.Lock()
	defer c.epochMu.Unlock()
	c.epoch.Store(nil)
	if c.local != nil {
		c.gens++
		c.local.reset(c.gens)
	}
}

// refreshEpoch reads the epoch every epochEvery until Close.
func (c *Cache) refreshEpoch(ctx context.Context) {
	defer close(c.refreshDone)
	t := time.NewTicker(epochEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = c.readEpoch(ctx) // a failure went to OnError
		}
	}
}

// Epoch returns the epoch the cache runs under ("" without Config.Epoch,
// or while none has been read).
func (c *Cache) Epoch() string {
	if st := c.epoch.Load(); st != nil {
		return st.epoch
	}
	return ""
}

// Close stops reading the epoch. The cache must not be used after it; the
// Redis client stays open (it is the caller's).
func (c *Cache) Close() {
	if c.stopRefresh != nil {
		c.closeOnce.Do(func() {
			c.stopRefresh()
			<-c.refreshDone
		})
	}
}
