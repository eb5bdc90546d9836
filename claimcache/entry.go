package claimcache

import (
	"encoding/binary"
	"sync"
)

// The entries the cache keeps in Redis, one per key: a pending claim (its
// digest and owner token) or a done answer (its digest and the rendered
// response), and how they are read back.

// bufs are scratch buffers for keys and values.
var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

const (
	keyPrefix  = "ne:{"
	keySuffix  = "}"
	kindDone   = 'D'
	kindPend   = 'P'
	headerSize = 1 + len(Digest{})
)

func (c *Cache) newToken() Token {
	var t Token
	copy(t[:8], c.node[:])
	binary.BigEndian.PutUint64(t[8:], c.seq.Add(1))
	return t
}

func pendingValue(dst []byte, d Digest, t Token) []byte {
	dst = append(dst, kindPend)
	dst = append(dst, d[:]...)
	return append(dst, t[:]...)
}

func doneValue(dst []byte, d Digest, response []byte) []byte {
	dst = append(dst, kindDone)
	dst = append(dst, d[:]...)
	return append(dst, response...)
}

// classify reads an existing entry against digest d.
func classify(v string, d Digest) Result {
	if len(v) < headerSize || v[1:headerSize] != string(d[:]) {
		return Result{Verdict: Mismatch}
	}
	if v[0] == kindDone {
		return Result{Verdict: Done, Response: v[headerSize:]}
	}
	var t Token
	copy(t[:], v[headerSize:])
	return Result{Verdict: Busy, Token: t}
}
