package readiness

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultPeersKey is the sorted set RedisPeers keeps: members are node
// names, scores the Unix milliseconds each last reached Postgres. One key,
// so it lives on one node of a Redis Cluster; it has no TTL (a cache's
// volatile-ttl eviction never takes it) and stays small (PeersKeep).
const DefaultPeersKey = "ne:readyz:postgres"

// PeersKeep is how long a node that stopped recording stays in the set:
// every record drops the members older than this.
const PeersKeep = time.Hour

// RedisPeers keeps Peers in a Redis sorted set.
type RedisPeers struct {
	// Client is the cache's Redis client.
	Client redis.UniversalClient
	// Key is the sorted set (default DefaultPeersKey).
	Key string
}

func (p RedisPeers) key() string {
	if p.Key == "" {
		return DefaultPeersKey
	}
	return p.Key
}

// Reached records node's success at at, and drops the nodes that recorded
// nothing for PeersKeep (restarted processes take new names).
func (p RedisPeers) Reached(ctx context.Context, node string, at time.Time) error {
	_, err := p.Client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.ZAdd(ctx, p.key(), redis.Z{Score: float64(at.UnixMilli()), Member: node})
		pipe.ZRemRangeByScore(ctx, p.key(), "-inf", "("+strconv.FormatInt(at.Add(-PeersKeep).UnixMilli(), 10))
		return nil
	})
	if err != nil {
		return fmt.Errorf("readiness: record %s reached Postgres: %w", node, err)
	}
	return nil
}

// OthersReachedSince reports whether a node other than node recorded a
// success at since or later.
func (p RedisPeers) OthersReachedSince(ctx context.Context, node string, since time.Time) (bool, error) {
	// At most two members matter: node itself and one other.
	names, err := p.Client.ZRevRangeByScore(ctx, p.key(), &redis.ZRangeBy{
		Min: strconv.FormatInt(since.UnixMilli(), 10), Max: "+inf", Count: 2}).Result()
	if err != nil {
		return false, fmt.Errorf("readiness: ask who reached Postgres: %w", err)
	}
	for _, n := range names {
		if n != node {
			return true, nil
		}
	}
	return false, nil
}
