package claimcache

import (
	"context"
	"time"
)

// Complete stores response as the key's answer, unless a done entry exists:
// CompleteMany of one, for tests that complete a key at a time.
func (c *Cache) Complete(ctx context.Context, key []byte, d Digest, response []byte) error {
	return c.CompleteMany(ctx, []Completion{{Key: key, Digest: d, Response: response}})
}

// LocalShard returns which shard of c's local table holds key and how many
// entries a shard keeps, so that an external test can predict FIFO eviction
// exactly (the shard seed is random per table).
func LocalShard(c *Cache, key []byte) (shard, capacity int) {
	s := c.local.shard(key)
	for i := range c.local.shards {
		if &c.local.shards[i] == s {
			return i, s.max
		}
	}
	panic("BUG: key in no shard")
}

// LocalLen returns how many entries c's local table holds and how many
// FIFO slots it uses, summed over its shards.
func LocalLen(c *Cache) (entries, slots int) {
	for i := range c.local.shards {
		s := &c.local.shards[i]
		s.mu.Lock()
		entries += len(s.m)
		slots += len(s.order)
		s.mu.Unlock()
	}
	return entries, slots
}

// PipeQueued returns how many calls wait in c's pipe for a slot.
func PipeQueued(c *Cache) int {
	c.pipe.mu.Lock()
	defer c.pipe.mu.Unlock()
	return len(c.pipe.queue)
}

// PipeRiders returns how many completions wait in c's pipe for calls to
// ride along with.
func PipeRiders(c *Cache) int {
	c.pipe.mu.Lock()
	defer c.pipe.mu.Unlock()
	return len(c.pipe.riders)
}

// SetCarryWait sets how long c's completions wait for claims to ride with.
func SetCarryWait(c *Cache, d time.Duration) { c.pipe.carryWait = d }
