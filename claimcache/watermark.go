package claimcache

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The watermark: how far the database an epoch names had written when
// done entries were last written under that epoch. A database restored from
// a snapshot or a base backup keeps its system identifier and timeline, so
// its epoch is the same, while the entries may hold answers of commits it
// no longer has. Its position is then behind the watermark, and the epoch
// read finds it so.
//
//   - CompleteMany raises the watermark before it writes a done entry, to
//     the positions the answers carry (Completion.Position: read by the
//     decision's own statement, never past what the database will have
//     flushed when the answer goes out), or, for one that carries
//     none, to a position read after it was called (after the commits of
//     everything it writes): an entry is never in Redis ahead of its
//     watermark, and an answer that carries its position needs no read of
//     the database to be cached.
//   - The check compares the database's flushed WAL position
//     (Config.Position), which no restart or crash takes back: a decision's
//     position precedes its commit record, which was flushed before its
//     answer went out (synchronous_commit on), and recovery replays at
//     least that far. Retention and aborts do not lower it either.
//   - The check reads the watermark first and the position after, so a
//     watermark raised meanwhile by another node, from a later position,
//     is never compared with an earlier one.
//   - A database found behind gets a new epoch (Config.OnBehind), whose
//     watermark starts from the database's own position.

// markKey is the Redis key of an epoch's watermark. It holds 16 hex digits
// (fixed width, so the script compares them as strings) and lives as long
// as the entries it covers.
func markKey(epoch string) string { return "ne:" + epoch + ":watermark" }

// markValue renders a position as the watermark holds it.
func markValue(pos uint64) string { return fmt.Sprintf("%016x", pos) }

// raiseScript sets the watermark to ARGV[1] unless it holds a later one,
// and keeps it as long as the entries written after it.
//
// KEYS[1] the watermark; ARGV[1] the position (16 hex digits); ARGV[2] TTL in ms.
var raiseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if (not v) or ARGV[1] > v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1`)

// ErrBehind wraps an epoch read that found the database behind the
// epoch's watermark, reported through OnError only when the new epoch
// could not be had (OnBehind failed); the cache then keeps its epoch.
var ErrBehind = errors.New("claimcache: the database is behind the cache's watermark")

// marker raises the watermark ahead of the done entries: it reads the
// database's position at most once at a time, and a completion batch uses
// a read that started after it was called.
type marker struct {
	position func(context.Context) (uint64, error)
	onBehind func(ctx context.Context, epoch string, pos, mark uint64) (string, error)

	mu     sync.Mutex
	last   uint64    // the newest position read
	lastAt time.Time // when its read started; zero: none yet
	flight *posRead  // the read under way, nil when none
	// raised is the highest watermark this process set under generation
	// raisedGen: a batch behind it needs no call to Redis.
	raised    uint64
	raisedGen uint64
}

// posRead is one read of the position; done is closed once pos and err are set.
type posRead struct {
	started time.Time
	done    chan struct{}
	pos     uint64
	err     error
}

// since returns a position read that started at or after t: the newest one
// if it did, else the one under way if it did, else a new one.
func (m *marker) since(ctx context.Context, t time.Time) (uint64, error) {
	for {
		m.mu.Lock()
		if !m.lastAt.IsZero() && !m.lastAt.Before(t) {
			pos := m.last
			m.mu.Unlock()
			return pos, nil
		}
		if f := m.flight; f != nil {
			m.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return 0, ctx.Err()
			}
			if !f.started.Before(t) {
				return f.pos, f.err
			}
			continue // it started too early: the next one
		}
		f := &posRead{started: time.Now(), done: make(chan struct{})}
		m.flight = f
		m.mu.Unlock()
		f.pos, f.err = m.position(ctx)
		m.mu.Lock()
		if f.err == nil && f.started.After(m.lastAt) {
			m.last, m.lastAt = f.pos, f.started
		}
		m.flight = nil
		m.mu.Unlock()
		close(f.done)
		return f.pos, f.err
	}
}

// raise sets st's watermark to at least every position cs carry, and, if
// one carries none, a position read at or after t; unless this process
// already set it that high.
func (c *Cache) raise(ctx context.Context, st *epochState, t time.Time, cs []Completion) error {
	m := c.marker
	var pos uint64
	unknown := false
	for i := range cs {
		pos = max(pos, cs[i].Position)
		unknown = unknown || cs[i].Position == 0
	}
	if unknown {
		read, err := m.since(ctx, t)
		if err != nil {
			return fmt.Errorf("watermark: read the database's position: %w", err)
		}
		pos = max(pos, read)
	}
	m.mu.Lock()
	done := m.raisedGen == st.gen && m.raised >= pos
	m.mu.Unlock()
	if done {
		return nil
	}
	if err := c.setMark(ctx, st.epoch, pos); err != nil {
		return err
	}
	m.mu.Lock()
	if m.raisedGen != st.gen || pos > m.raised {
		m.raised, m.raisedGen = pos, st.gen
	}
	m.mu.Unlock()
	return nil
}

// setMark raises epoch's watermark to pos in Redis, under the watermark
// key's breaker.
func (c *Cache) setMark(ctx context.Context, epoch string, pos uint64) error {
	rk := markKey(epoch)
	return c.call(ctx, rk, func() error {
		if err := raiseScript.Run(ctx, c.client, []string{rk}, markValue(pos), c.resultMS).Err(); err != nil {
			return fmt.Errorf("watermark: raise: %w", err)
		}
		return nil
	})
}

// mark reads epoch's watermark: ok false when there is none (no entry
// written under it, or Redis was flushed or replaced, entries and all).
func (c *Cache) mark(ctx context.Context, epoch string) (pos uint64, ok bool, err error) {
	v, err := c.client.Get(ctx, markKey(epoch)).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("watermark: read: %w", err)
	}
	pos, err = strconv.ParseUint(v, 16, 64)
	if err != nil {
		return 0, false, fmt.Errorf("watermark: %q: %w", v, err)
	}
	return pos, true, nil
}

// checkMark returns the epoch to run under for e, just read: e itself,
// unless its database is behind e's watermark; then the epoch OnBehind
// gives it, whose watermark starts from the database's position. A check
// that cannot be made (Redis or the position unreadable) keeps e: the
// next read checks again, and a cache that cannot reach Redis answers
// nothing from it meanwhile.
func (c *Cache) checkMark(ctx context.Context, e string) (string, error) {
	m := c.marker
	// The watermark first, the position after: see the package's rule.
	mark, ok, err := c.mark(ctx, e)
	if err != nil || !ok {
		return e, err
	}
	pos, err := m.since(ctx, time.Now())
	if err != nil {
		return e, fmt.Errorf("watermark: read the database's position: %w", err)
	}
	if pos >= mark {
		return e, nil
	}
	next, err := m.onBehind(ctx, e, pos, mark)
	if err != nil {
		return e, fmt.Errorf("%w (position %x, watermark %x): %w", ErrBehind, pos, mark, err)
	}
	if err := c.setMark(ctx, next, pos); err != nil {
		return next, err
	}
	return next, nil
}
