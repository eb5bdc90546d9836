// Package bench measures and demonstrates notifyedge against real parts: it
// starts its own stack (throwaway Postgres, redis-server, the edge in
// process) unless pointed at one, drives it over HTTP, and checks the
// invariants by SQL afterwards. cmd/edgebench is its thin main.
//
// bench owns the naive baseline's tables (naive_*) and may read Postgres to
// check invariants; it is not imported by anything.
package bench
