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
package edge
