package claimcache

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// masterLookup is a Redis Cluster client: it names the master that serves a
// key, and the masters there are. *redis.ClusterClient satisfies it.
type masterLookup interface {
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
	ClusterSlots(ctx context.Context) *redis.ClusterSlotsCmd
}

// nodeBreakers gives each call the breaker of the node it goes to: the one
// breaker of a single Redis, or, on a Redis Cluster, the breaker of the
// key's master, so that a dead master sends only its own keys to Postgres
// and the other masters' keys stay answered from the cache.
type nodeBreakers struct {
	single  *breaker     // a single Redis (cluster is nil)
	cluster masterLookup // nil for a single Redis
	build   func(node string) *breaker

	mu     sync.Mutex
	byNode sync.Map // master address -> *breaker
}

func newNodeBreakers(c Client, build func(node string) *breaker) *nodeBreakers {
	nb := &nodeBreakers{build: build}
	if ml, ok := c.(masterLookup); ok {
		nb.cluster = ml
	} else {
		nb.single = build("")
	}
	return nb
}

// forKey returns the breaker of the node serving the Redis key rk. A
// cluster whose slot map is unknown (every node unreachable) shares one
// breaker under the empty name.
func (nb *nodeBreakers) forKey(ctx context.Context, rk string) *breaker {
	if nb.cluster == nil {
		return nb.single
	}
	node := ""
	if m, err := nb.cluster.MasterForKey(ctx, rk); err == nil {
		node = m.Options().Addr
	}
	return nb.node(node)
}

// node returns node's breaker, making it on first use.
func (nb *nodeBreakers) node(node string) *breaker {
	if b, ok := nb.byNode.Load(node); ok {
		return b.(*breaker)
	}
	nb.mu.Lock()
	defer nb.mu.Unlock()
	if b, ok := nb.byNode.Load(node); ok {
		return b.(*breaker)
	}
	b := nb.build(node)
	nb.byNode.Store(node, b)
	return b
}

// anyOpen reports whether some node's breaker is open.
func (nb *nodeBreakers) anyOpen() bool {
	if nb.cluster == nil {
		return nb.single.isOpen()
	}
	open := false
	nb.byNode.Range(func(_, b any) bool {
		open = b.(*breaker).isOpen()
		return !open
	})
	return open
}

// prune forgets the breakers of nodes that are no longer masters (a dead
// master replaced by its replica: none of its keys go there any more, so
// its breaker would stay open for ever), closing them first so that their
// gauge reads 0. It asks the cluster which nodes are masters; an error
// leaves every breaker as it is.
func (nb *nodeBreakers) prune(ctx context.Context) error {
	if nb.cluster == nil {
		return nil
	}
	slots, err := nb.cluster.ClusterSlots(ctx).Result()
	if err != nil {
		return err
	}
	masters := make(map[string]bool)
	for _, s := range slots {
		if len(s.Nodes) > 0 {
			masters[s.Nodes[0].Addr] = true
		}
	}
	nb.byNode.Range(func(k, b any) bool {
		if node := k.(string); node != "" && !masters[node] {
			b.(*breaker).reset()
			nb.byNode.Delete(node)
		}
		return true
	})
	return nil
}
