package claimcache

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Redis client under the cache: the calls, their timeouts and the
// breaker that stops paying them while Redis is down.

// ErrSlow is returned for a call that waited the cache's WaitBudget for
// its turn in the pipeline: go to Postgres.
var ErrSlow = errors.New("claimcache: redis too slow to take the call")

// ErrBreakerOpen is returned without calling Redis while the breaker is
// open: go to Postgres.
var ErrBreakerOpen = errors.New("claimcache: breaker open")

// Client lists the Redis commands the cache uses; redis.UniversalClient
// (single node or cluster) satisfies it.
type Client interface {
	redis.Scripter
	Ping(ctx context.Context) *redis.StatusCmd
	SetArgs(ctx context.Context, key string, value any, a redis.SetArgs) *redis.StatusCmd
	Get(ctx context.Context, key string) *redis.StringCmd
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// NewClient returns a go-redis client for url, tuned for a 200 ms budget:
// url is redis://[user:pass@]host:port[/db] (or rediss://), or go-redis's
// cluster form redis://host1:port1?addr=host2:port2. Every call is bounded
// by callTimeout (socket deadlines and the pool wait), nothing is retried
// (go-redis retries writes after a timeout, which would re-send a claim),
// and a dead server fails in about a millisecond.
func NewClient(url string, callTimeout time.Duration, poolSize int) (redis.UniversalClient, error) {
	callTimeout = cmp.Or(callTimeout, 25*time.Millisecond)
	tune := func(dial, read, write, pool *time.Duration, retries, dialRetries, size *int, ctxTimeout *bool) {
		*dial, *read, *write, *pool = 2*callTimeout, callTimeout, callTimeout, callTimeout
		*retries, *dialRetries, *ctxTimeout = -1, 1, true
		if poolSize > 0 {
			*size = poolSize
		}
	}
	if bytes.Contains([]byte(url), []byte("addr=")) {
		o, err := redis.ParseClusterURL(url)
		if err != nil {
			return nil, fmt.Errorf("claimcache: parse cluster url: %w", err)
		}
		tune(&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.MaxRetries, &o.DialerRetries, &o.PoolSize, &o.ContextTimeoutEnabled)
		// The slot map is read again at most a second after it is a second
		// old (go-redis's default is a minute): a failed-over master's keys
		// move to its promoted replica within seconds, and a breaker that
		// stops calls to the dead master would otherwise keep the stale map
		// from ever being refreshed by an error.
		o.ClusterStateReloadInterval = time.Second
		return redis.NewClusterClient(o), nil
	}
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("claimcache: parse url: %w", err)
	}
	tune(&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.MaxRetries, &o.DialerRetries, &o.PoolSize, &o.ContextTimeoutEnabled)
	return redis.NewClient(o), nil
}

// call runs f against Redis unless the breaker of the node serving the
// Redis key rk is open, and feeds that breaker and OnError with its outcome
// (redis.Nil is an answer, not an error).
func (c *Cache) call(ctx context.Context, rk string, f func() error) error {
	b := c.breakers.forKey(ctx, rk)
	if !b.allow() {
		return ErrBreakerOpen
	}
	err := f()
	c.record(b, err)
	if errors.Is(err, redis.Nil) {
		return nil
	}
	return err
}

// record feeds b and OnError with a call's outcome (redis.Nil is an
// answer, not an error).
func (c *Cache) record(b *breaker, err error) {
	if errors.Is(err, redis.Nil) {
		err = nil
	}
	b.record(err)
	if err == nil && c.probeBad.Load() {
		c.probeBad.Store(false) // an answer is as good as the probe's PING
	}
	if err != nil && c.onError != nil {
		c.onError(err)
	}
}
