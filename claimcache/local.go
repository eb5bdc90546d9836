package claimcache

import (
	"hash/maphash"
	"sync"
	"time"
)

// local is a per-node table of done entries in front of Redis. A done entry
// never changes once written (it is the committed first answer), so a copy
// may answer its duplicates without a round trip; Postgres stays the
// authority and Redis the shared cache. It is filled only from a Done
// verdict or after Complete, and bounded: each shard evicts its oldest
// entry (FIFO) when full.
type local struct {
	ttl    time.Duration
	seed   maphash.Seed
	shards [64]localShard
}

type localShard struct {
	mu    sync.Mutex
	m     map[string]localEntry
	order []string // insertion order, for eviction
	max   int
}

type localEntry struct {
	digest   Digest
	response string
	expires  int64 // unix nanos
}

func newLocal(entries int, ttl time.Duration) *local {
	l := &local{ttl: ttl, seed: maphash.MakeSeed()}
	per := max(entries/len(l.shards), 1)
	for i := range l.shards {
		l.shards[i].m = make(map[string]localEntry, per)
		l.shards[i].max = per
	}
	return l
}

func (l *local) shard(key []byte) *localShard {
	return &l.shards[maphash.Bytes(l.seed, key)%uint64(len(l.shards))]
}

// get returns the done entry of key, if held and fresh.
func (l *local) get(key []byte) (localEntry, bool) {
	s := l.shard(key)
	s.mu.Lock()
	e, ok := s.m[string(key)] // no allocation: the compiler converts in place
	s.mu.Unlock()
	if !ok || time.Now().UnixNano() > e.expires {
		return localEntry{}, false
	}
	return e, true
}

// put records a done entry (the first one for a key wins, like Redis's).
func (l *local) put(key []byte, d Digest, response string) {
	s := l.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[string(key)]; ok {
		return
	}
	for len(s.order) >= s.max {
		delete(s.m, s.order[0])
		s.order = s.order[1:]
	}
	k := string(key)
	s.m[k] = localEntry{digest: d, response: response, expires: time.Now().Add(l.ttl).UnixNano()}
	s.order = append(s.order, k)
}
