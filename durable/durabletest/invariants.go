package durabletest

import (
	"context"

	"github.com/notifyedge/notifyedge/durable/invariant"
)

// The money invariants live in durable/invariant, which benches link into
// their binaries (package testing may not be linked there). These names
// keep the tests that check them through durabletest compiling.

// Querier is what Invariants reads through: *pgxpool.Pool, *pgx.Conn and
// pgx.Tx satisfy it (invariant.Querier).
type Querier = invariant.Querier

// ErrInvariant marks the error Invariants returns when the stored state
// breaks a money invariant (invariant.ErrViolated).
var ErrInvariant = invariant.ErrViolated

// Invariants checks by SQL the money invariants over the orders whose
// order_no starts with orderPrefix, and that every key in answeredSuccess
// has a DONE claim: invariant.Check, which documents each of them.
func Invariants(ctx context.Context, db Querier, orderPrefix string, answeredSuccess []string) error {
	return invariant.Check(ctx, db, orderPrefix, answeredSuccess)
}
