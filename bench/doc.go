// Package bench measures and demonstrates notifyedge against real parts: it
// starts its own stack (throwaway Postgres, redis-server, and the edge and
// the outbox relay as processes of their own) unless pointed at one, drives
// it over HTTP, reads each part's CPU from /proc around every attack, and
// checks the invariants by SQL afterwards. cmd/edgebench is its thin main.
//
// bench owns the naive baseline's tables (naive_*) and may read Postgres to
// check invariants; it is not imported by anything.
package bench
