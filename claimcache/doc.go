// Package claimcache is notifyedge's Redis front: claim-or-replay in one
// round trip, so hot duplicates are answered without touching Postgres.
//
// One Redis key per idempotency key and cache epoch, "ne:<epoch>:{<biz_key>}"
// ("ne:{<biz_key>}" without an epoch). The hash tag is the biz_key alone:
// each key's slot is its own in Redis Cluster, keys spread over the slots,
// and a key keeps its slot when the epoch changes. The epoch (Config.Epoch)
// names the database the entries mirror, so that a restored or promoted
// database is never answered for by entries of its past. Its value is either
//
//	pending: 'P' | digest (32 bytes) | owner token (16 bytes)   with a short TTL
//	done:    'D' | digest (32 bytes) | response bytes           with the result TTL
//
// The response bytes are the rendered answer (status, content type and
// body), byte for byte, so a duplicate gets exactly the first answer.
//
// The cache is an accelerator, never the authority: Postgres decides, and
// every answer is right with Redis empty, slow, flushed or down. The
// caller must Complete only after Postgres committed a DONE result, and a
// Done verdict only ever carries bytes written that way. Any Redis error or
// timeout is returned as an error (the caller goes to Postgres), and a
// breaker stops paying the timeout while Redis stays down.
//
// claimcache knows keys, digests and response bytes; nothing of orders. It
// imports go-redis only.
//
// # Claim, wait, complete, abort
//
// Claim is one round trip, SET key pending PX ttl NX GET. No old value means
// this request owns the key, and Postgres decides. A done entry with the
// same digest is answered at once (the edge adds Idempotent-Replayed: true
// and counts replayed_cache). A done entry with another digest goes to
// Postgres, which records the conflict. Another owner's pending entry is
// waited for: Wait polls at 1, 2, 4 ... ms (at most 16 ms apart) within
// Config.WaitBudget (a quarter of the budget in edged), then the request
// goes to Postgres, which blocks on its unique index and replays.
//
// Complete runs only after Postgres committed a DONE result: applied,
// skipped, or a replay, which refills an emptied cache. The request that
// won the claim writes its answer with a plain SET (its own pending entry is
// there, or, past the pending TTL, the next claimant's, whose answer is the
// same committed one); any other uses a Lua script that never replaces a
// done entry. CompleteMany sends the completions that pile up under load
// together, after their answers went out. Every other outcome aborts: a
// compare-and-delete of the owner's own pending entry.
//
// # Pipelining
//
// Claims and owned completions that arrive while two are in flight queue,
// and the next to end sends them all in one pipeline (up to 128): under
// load, concurrent first deliveries share one write and one read instead of
// a round trip each, which was a quarter of the node's CPU per first
// delivery and most of Redis's. A call that finds nothing in flight goes at
// once, alone; no timer holds one back. A completion has no caller waiting
// for it: it waits up to 2 ms for claims and rides in their pipeline, so
// under load a first delivery costs one round trip, its claim's, shared.
// Each call still answers to its own node's breaker and the client's call
// timeout.
//
// # Failures
//
// go-redis's defaults take seconds against a dead server and retry writes
// (a retried claim would be sent twice), so NewClient bounds every call by
// a per-call timeout (edged passes min(25 ms, budget/8); dials get twice
// that) on read, write and pool wait, with ContextTimeoutEnabled and no
// retries. Any error or timeout sends the request to Postgres and goes to
// Config.OnError (edged counts notifyedge_cache_errors_total).
// Config.BreakerFailures consecutive errors (default 5) open a breaker: no
// Redis calls (notifyedge_cache_breaker_open 1, /readyz "redis":"degraded")
// for Config.BreakerCooldown (default 1 s), then one probe decides whether
// it closes. On a Redis Cluster every master has a breaker of its own, so a
// dead master sends only its own keys to Postgres; the client reads the
// slot map again every second, so a promoted replica takes its keys within
// seconds.
//
// # The per-node table of done entries
//
// Config.LocalEntries (100,000 in edged, about 35 MB) keeps done entries in
// the process and answers the hottest duplicates without a Redis round
// trip, which profiling showed was 43 % of the hot path's CPU, mostly
// syscalls. A done entry never changes (it is the committed first answer),
// so the copy is always right. The table is filled only from Done verdicts
// and after Complete, keeps an entry at most Config.LocalTTL (default
// min(ResultTTL, 10 min)), and is emptied when the epoch changes. A hot
// duplicate then allocates nothing (a !race test asserts 0 allocations per
// request).
//
// # The watermark
//
// A database restored from a file-system snapshot or a base backup keeps
// its epoch (system identifier, timeline, counter) while it lost the
// commits made after the copy, whose answers the cache may hold. With
// Config.Position, each epoch has a watermark, "ne:<epoch>:watermark": a
// WAL position of the database, raised by CompleteMany before it writes any
// done entry, to the positions the answers carry (Completion.Position, the
// decision's own) or, for one that carries none, to a position read after
// its commit, so no entry is ahead of it. Each epoch read reads the
// watermark, then the database's flushed position; a database behind the
// watermark gets a new epoch from Config.OnBehind (edged moves the counter
// on), and until then the cache answers nothing. A completion batch costs
// one Redis call when the position moved; claims, lookups and hot
// duplicates cost nothing more.
//
// # Memory
//
// A done entry for a generic answer costs 216 bytes by MEMORY USAGE and 278
// bytes of used_memory (100,000 entries measured on redis-server 7.0):
// about 265 MiB per million cached results, so a Redis holding 24 h of
// results at 100 callbacks a second (8.6 million) needs about 2.3 GiB.
package claimcache
