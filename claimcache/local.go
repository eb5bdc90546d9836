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
// entry (FIFO) when full. An entry past its TTL is replaced by the next put
// of its key and counts from then on as the shard's newest.
//
// Its entries belong to one cache epoch (see Config.Epoch), numbered by a
// generation: reset empties the table for a new one, and get and put name
// the generation their caller's request runs under, so that a request that
// read the epoch before a change can neither answer from the new
// generation's shards nor leave an entry of the old one behind in them.
type local struct {
	ttl    time.Duration
	now    func() time.Time // the clock the TTL runs on
	seed   maphash.Seed
	shards [64]localShard
}

type localShard struct {
	mu sync.Mutex
	m  map[string]localEntry
	// order holds a slot per insertion, oldest first, for eviction. A
	// replaced entry leaves its old slot behind (removing it would cost a
	// scan under the lock): a slot whose seq is not its entry's is stale,
	// skipped by eviction and dropped by compaction, so order stays within
	// 2*max slots and a stale slot never evicts the entry that replaced it.
	order []localSlot
	seq   uint64 // stamps each insertion
	max   int
	gen   uint64 // the epoch generation the entries belong to
}

type localSlot struct {
	key string
	seq uint64
}

type localEntry struct {
	digest   Digest
	response string
	expires  int64  // unix nanos
	seq      uint64 // the insertion that wrote it: its live slot has the same
}

func newLocal(entries int, ttl time.Duration, now func() time.Time) *local {
	l := &local{ttl: ttl, now: now, seed: maphash.MakeSeed()}
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

// get returns the done entry of key, if held, fresh and of generation gen.
func (l *local) get(key []byte, gen uint64) (localEntry, bool) {
	s := l.shard(key)
	s.mu.Lock()
	e, ok := s.m[string(key)] // no allocation: the compiler converts in place
	ok = ok && s.gen == gen
	s.mu.Unlock()
	if !ok || l.now().UnixNano() > e.expires {
		return localEntry{}, false
	}
	return e, true
}

// put records a done entry read or written under generation gen (dropped
// if the shard holds another). The first one for a key wins, like Redis's,
// until it expires; then this one replaces it, or a hot key would go to
// Redis on every request until FIFO eviction reached it.
func (l *local) put(key []byte, gen uint64, d Digest, response string) {
	s := l.shard(key)
	now := l.now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen != gen {
		return
	}
	old, replacing := s.m[string(key)]
	if replacing && now <= old.expires {
		return
	}
	if !replacing {
		for len(s.m) >= s.max {
			s.evictOldest()
		}
	}
	k := string(key)
	s.seq++
	s.m[k] = localEntry{digest: d, response: response, expires: now + int64(l.ttl), seq: s.seq}
	s.order = append(s.order, localSlot{key: k, seq: s.seq})
	if len(s.order) > 2*s.max {
		s.compact()
	}
}

// reset empties the table for generation gen, one shard at a time: until
// a shard is reset it answers no request of gen, and takes no entry of the
// generation before once it is.
func (l *local) reset(gen uint64) {
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		clear(s.m)
		clear(s.order) // the backing array must not keep the keys alive
		s.order = s.order[:0]
		s.gen = gen
		s.mu.Unlock()
	}
}

// evictOldest deletes the oldest live entry, dropping the stale slots in
// front of it. Every entry has its live slot in order, so one is found
// while the map is not empty.
func (s *localShard) evictOldest() {
	for len(s.order) > 0 {
		o := s.order[0]
		s.order[0] = localSlot{} // the backing array must not keep the key alive
		s.order = s.order[1:]
		if e, ok := s.m[o.key]; ok && e.seq == o.seq {
			delete(s.m, o.key)
			return
		}
	}
}

// compact drops the stale slots, keeping the live ones in order. It runs
// after at least max replacements since the last time, so its cost is
// constant per put on average.
func (s *localShard) compact() {
	live := s.order[:0]
	for _, o := range s.order {
		if e, ok := s.m[o.key]; ok && e.seq == o.seq {
			live = append(live, o)
		}
	}
	clear(s.order[len(live):])
	s.order = live
}
