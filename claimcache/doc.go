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
// The cache is an accelerator, never the authority: Postgres decides. The
// caller must Complete only after Postgres committed a DONE result, and a
// Done verdict only ever carries bytes written that way. Any Redis error or
// timeout is returned as an error (the caller goes to Postgres), and a
// breaker stops paying the timeout while Redis stays down.
//
// claimcache knows keys, digests and response bytes; nothing of orders. It
// imports go-redis only.
package claimcache
