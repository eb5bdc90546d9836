// Package admin is notifyedge's admin listener (127.0.0.1:9090 by default):
// health, readiness and metrics for the platform; the review queue, re-drive,
// the cache epoch and credential reload for operators; and the orders API
// for the merchant's own systems.
//
// It never touches the callbacks' hot path: everything it asks of Postgres
// goes to the operator pool (its own connections and timeouts), and its
// bodies follow the callback body's rules and stricter (one JSON object,
// no repeated or case-variant keys, errors naming one field). Tokens are
// compared in constant time; the orders token opens /orders only.
package admin
