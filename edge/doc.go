// Package edge is notifyedge's internet-facing side: the fasthttp listener
// for POST /notify/{channel}, the channel adapters (authenticate, parse, key
// and digest a callback; render the channel's acknowledgement), the one
// request flow that asks the cache and the durable authority, the answers
// table, metrics and logs. The admin listener (operators' and order
// systems' endpoints) is a room of its own, edge/admin; it uses edge's
// metrics and decides re-driven deliveries through Server.Redrive.
//
// The flow is transport-neutral (Request in, Answer out), so the net/http
// adapter (ServeHTTP) is a few lines beside the fasthttp one.
//
// edge must never answer SUCCESS for a delivery whose claim and result are
// not committed in Postgres (or read back from a cache entry written after
// that commit), and must never keep a *fasthttp.RequestCtx or any of its byte
// slices after a handler returns: whatever outlives the request is copied.
//
// # One request
//
// A POST /notify/{channel} is decided in this order: body size, route and
// method, channel, authenticity, body, merchant identity (the adapter, in
// edge/channel), then the cache's claim (claimcache), then the authority
// (durable): an existing claim (replay or conflict), or for a payment its
// trade having paid another order, then the order, then the trade, then the
// event against the order's state. The answers table (answer.go) turns the
// outcome into the HTTP status, the metric label and the message, in one
// row per outcome.
//
// The budget holds whatever the database does: the authority returns by
// the request's deadline itself, with group commit or one delivery at a
// time (durable runs the transaction on, and its claim makes the channel's
// retry a replay), so the edge calls it directly, with no goroutine or
// timer of its own. The cache's completions go after the answers,
// several per round trip (CompleteMany): a round trip per delivery, not a
// goroutine or a timer, was the cost worth removing.
//
// # Packages
//
//	cmd/edged ──> edge/admin ──> edge ──> claimcache   (Redis, go-redis v9)
//	                                  └──> durable      (Postgres, pgx v5)
//
// What each package owns:
//
//   - edge: the fasthttp listener, the one request flow (flow.go), the
//     answers table (answer.go: status, label and message per outcome),
//     metrics; ServeHTTP runs the same flow behind net/http.
//   - edge/admin: the admin listener: health, readiness, metrics, the
//     review queue and re-drive, the orders API, the cache epoch, reload.
//   - edge/channel: the channel adapters, one file each (generic.go with
//     jsonbody.go, wechatpay.go, alipay.go), and what they share
//     (channel.go: Request, Delivery with its key and digest, Verdict,
//     Reject with its kind, the Channel interface). Adapters verify; they
//     never forge, and they know nothing of HTTP statuses or metrics.
//   - edge/channel/channeltest: signers that build callbacks exactly as
//     WeChat Pay and Alipay do, with keys of their own (tests, benches,
//     trials).
//   - claimcache: the Redis claim-and-result cache: claim-or-replay in one
//     round trip, complete, abort, bounded wait, breaker.
//   - claimcache/claimcachetest: a real redis-server (or a Redis Cluster)
//     on free ports for tests and benches, and WaitFor, a wait for a
//     condition with a deadline fit for a loaded machine.
//   - durable: schema migrations, the server-side functions as code (one
//     file each in durable/sql, installed by every migrate), the
//     one-transaction decision (Process),
//     internal transitions (Transition), the orders API's reads and writes,
//     the review queue, the outbox relay, retention, the cache epoch.
//   - durable/outbox: the outbox message and the Publisher interface, with
//     no database client, so brokers and their readers link none.
//   - durable/redisstream: the outbox's Redis Streams publisher and the
//     consumer loop.
//   - durable/shipping: the reference shipper's handler (OnPaid).
//   - durable/pgtemp: throwaway PostgreSQL clusters from the local binaries
//     (edged -dev, tests, benches); it imports no test code, so bin/edged
//     carries none (make lint checks).
//   - durable/invariant: Check, the money invariants by SQL that every
//     storm and kill test and every bench run checks; it imports no test
//     code, so bin/edgebench carries none (make lint checks).
//   - durable/durabletest: per-test databases cloned from a migrated
//     template, order seeding, row locks, lock waits, and Invariants
//     (invariant.Check for tests).
//   - bench: the load scenarios (a table: one row each), the incident demo,
//     the outbox-lag run, the scale-out run, their stack on loopback.
//   - cmd/edged: configuration, wiring, dev mode, edged sign.
//   - cmd/forwarder: the outbox stream as signed webhooks to one URL.
//   - cmd/shipper: the reference consumer of the outbox stream.
//   - cmd/edgebench: bench's main (run, demo, lag, scale).
//
// claimcache and durable import nothing of the project outside themselves
// (make lint checks), so each can be read, tested and replaced alone.
package edge
