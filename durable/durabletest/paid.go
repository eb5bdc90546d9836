package durabletest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// StormPaidOnce checks what a storm of payments over a database of its
// own must leave, beside Invariants: every order PAID, and exactly one
// outbox row and one DONE claim per order, orders in all.
func StormPaidOnce(t testing.TB, db *pgxpool.Pool, orders int) {
	t.Helper()
	var outbox, claims, notPaid int
	if err := db.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM outbox),
		(SELECT count(*) FROM notify_claim WHERE claim_state = 'DONE'),
		(SELECT count(*) FROM biz_order WHERE status <> 'PAID')`).Scan(&outbox, &claims, &notPaid); err != nil {
		t.Fatalf("count the storm's rows: %v", err)
	}
	if outbox != orders || claims != orders || notPaid != 0 {
		t.Errorf("after the storm: %d outbox rows and %d DONE claims for %d orders, %d orders not PAID; want %d, %d, 0",
			outbox, claims, orders, notPaid, orders, orders)
	}
}
