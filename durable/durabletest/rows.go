package durabletest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Count runs a query of one integer (a count, a sum) on db, failing t
// when it does not run.
func Count(t testing.TB, db *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// Status reads an order's status ("" with a failed t when there is none).
func Status(t testing.TB, db *pgxpool.Pool, orderNo string) string {
	t.Helper()
	var s string
	if err := db.QueryRow(context.Background(), `SELECT status FROM biz_order WHERE order_no = $1`, orderNo).Scan(&s); err != nil {
		t.Fatalf("status of order %s: %v", orderNo, err)
	}
	return s
}
