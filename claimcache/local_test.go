package claimcache

import (
	"fmt"
	"testing"
	"time"
)

// sameShard returns n keys that land in one shard of l.
func sameShard(l *local, n int) [][]byte {
	var keys [][]byte
	target := l.shard([]byte("k0"))
	for i := 0; len(keys) < n; i++ {
		k := fmt.Appendf(nil, "k%d", i)
		if l.shard(k) == target {
			keys = append(keys, k)
		}
	}
	return keys
}

// expire makes key's entry expired, as if its TTL had passed.
func expire(l *local, key []byte) {
	s := l.shard(key)
	s.mu.Lock()
	e := s.m[string(key)]
	e.expires = time.Now().Add(-time.Nanosecond).UnixNano()
	s.m[string(key)] = e
	s.mu.Unlock()
}

// held returns which of keys l answers for, in order.
func held(l *local, keys [][]byte) string {
	var out []byte
	for _, k := range keys {
		if _, ok := l.get(k, 0); ok {
			out = append(out, k...)
			out = append(out, ' ')
		}
	}
	return string(out)
}

// An expired entry is replaced by the next put of its key (a hot key would
// otherwise go to Redis on every request until evicted), and the
// replacement is evicted as the newest entry of its shard, not by the
// expired one's place in the FIFO order.
func TestLocalPutReplacesExpired(t *testing.T) {
	l := newLocal(4*len(local{}.shards), time.Hour, time.Now) // 4 entries a shard
	k := sameShard(l, 7)
	a, b, c, d, e, f, g := k[0], k[1], k[2], k[3], k[4], k[5], k[6]
	s := l.shard(a)
	check := func(step, want string) {
		t.Helper()
		if got := held(l, k); got != want {
			t.Errorf("%s: held %q, want %q", step, got, want)
		}
		if len(s.m) > s.max || len(s.order) > 2*s.max {
			t.Errorf("%s: %d entries, %d slots, want at most %d and %d", step, len(s.m), len(s.order), s.max, 2*s.max)
		}
	}
	l.put(a, 0, Digest{1}, "first")
	l.put(b, 0, Digest{1}, "b")
	l.put(a, 0, Digest{2}, "second") // fresh: the first answer stays
	if got, _ := l.get(a, 0); got.response != "first" {
		t.Fatalf("fresh entry replaced: %q", got.response)
	}
	expire(l, a)
	check("a expired", fmt.Sprintf("%s ", b))
	l.put(a, 0, Digest{1}, "again")
	if got, ok := l.get(a, 0); !ok || got.response != "again" {
		t.Fatalf("expired entry not replaced: %+v %v", got, ok)
	}
	check("a replaced", fmt.Sprintf("%s %s ", a, b))
	l.put(c, 0, Digest{1}, "c")
	l.put(d, 0, Digest{1}, "d") // full: the expired a's old slot goes, not the fresh a
	check("d put", fmt.Sprintf("%s %s %s %s ", a, b, c, d))
	l.put(e, 0, Digest{1}, "e") // b is the oldest live entry now
	check("e put", fmt.Sprintf("%s %s %s %s ", a, c, d, e))
	l.put(f, 0, Digest{1}, "f") // then the replaced a
	check("f put", fmt.Sprintf("%s %s %s %s ", c, d, e, f))

	// A key that expires again and again keeps the table within its bound.
	for i := range 1000 {
		expire(l, c)
		l.put(c, 0, Digest{1}, fmt.Sprint(i))
	}
	check("c replaced 1000 times", fmt.Sprintf("%s %s %s %s ", c, d, e, f))
	if got, _ := l.get(c, 0); got.response != "999" {
		t.Errorf("c answers %q, want the last replacement", got.response)
	}
	l.put(g, 0, Digest{1}, "g") // d is the oldest now: c was replaced after it
	check("g put", fmt.Sprintf("%s %s %s %s ", c, e, f, g))
}

// A reset empties every shard for the next generation; a request that read
// the epoch before it neither answers from the reset table nor leaves an
// entry of the old generation in it, and one of the new generation finds
// nothing in a shard not reset yet.
func TestLocalResetGenerations(t *testing.T) {
	l := newLocal(1024, time.Hour, time.Now)
	k := []byte("k")
	l.put(k, 0, Digest{1}, "gen 0")
	if _, ok := l.get(k, 1); ok {
		t.Error("a request of generation 1 answered from a shard of generation 0")
	}
	l.reset(1)
	if _, ok := l.get(k, 0); ok {
		t.Error("an entry survived the reset")
	}
	l.put(k, 0, Digest{1}, "late gen 0")
	if _, ok := l.get(k, 1); ok {
		t.Error("a put of generation 0 landed after the reset")
	}
	l.put(k, 1, Digest{1}, "gen 1")
	if e, ok := l.get(k, 1); !ok || e.response != "gen 1" {
		t.Errorf("generation 1: %v %q", ok, e.response)
	}
	for i := range l.shards {
		if n := len(l.shards[i].order); n > 1 {
			t.Errorf("shard %d keeps %d slots after the reset", i, n)
		}
	}
}
