package durable_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/notifyedge/notifyedge/durable"
)

// wantUniqueViolation fails the test unless err is the unique index on
// biz_order.paid_by refusing a write.
func wantUniqueViolation(t *testing.T, what string, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || pgErr.ConstraintName != "biz_order_paid_by_uniq" {
		t.Errorf("%s: %v, want a unique violation of biz_order_paid_by_uniq", what, err)
	}
}

// The schema holds it, not only the functions: no write makes a trade the
// payer of a second order. Orders without a payer are not concerned.
func TestPaidByIsUnique(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.seed(t, "UQ-A", durable.Paid, 100, "test:TX-UQ", 0)
	b.seed(t, "UQ-B", durable.Paid, 100, "test:TX-B", 0)
	b.seed(t, "UQ-C", durable.Paid, 100, "", 0)
	b.seed(t, "UQ-D", durable.Paid, 100, "", 0)
	_, err := b.db.Exec(ctx, `UPDATE biz_order SET paid_by = 'test:TX-UQ' WHERE order_no = 'UQ-B'`)
	wantUniqueViolation(t, "UPDATE of UQ-B to UQ-A's payer", err)
	_, err = b.db.Exec(ctx, `INSERT INTO biz_order (order_no, status, amount, currency, paid_by)
		VALUES ('UQ-E', 'PAID', 100, 'CNY', 'test:TX-UQ')`)
	wantUniqueViolation(t, "INSERT of an order paid by UQ-A's payer", err)
	if payer, _, _ := b.money(t, "UQ-B"); payer != "test:TX-B" {
		t.Errorf("UQ-B's payer %q, want test:TX-B", payer)
	}
}

// The upgrade to a unique paid_by finds orders that share a payer and
// stops with a bounded list of them and what an operator must do; once
// they are fixed, it adds the index. An index of that name left invalid
// by a failed concurrent build is refused, not kept.
func TestUpgradeReportsTradesPayingSeveralOrders(t *testing.T) {
	ctx := context.Background()
	url := durabletestCreateEmpty(t)
	if err := durable.MigrateTo(ctx, url, 8); err != nil {
		t.Fatal(err)
	}
	b := &bundle{url: url, db: newPool(t, url)}
	// 22 trades pay several orders: acme:TX-00 seven, the others two.
	for i := range 22 {
		n := 2
		if i == 0 {
			n = 7
		}
		for j := range n {
			b.seed(t, fmt.Sprintf("UP-%02d-%d", i, j), durable.Paid, 100, fmt.Sprintf("acme:TX-%02d", i), 0)
		}
	}
	b.seed(t, "UP-FINE", durable.Paid, 100, "acme:FINE", 0)
	b.seed(t, "UP-NOPAYER-1", durable.Paid, 100, "", 0)
	b.seed(t, "UP-NOPAYER-2", durable.Paid, 100, "", 0)
	version := func() int {
		t.Helper()
		return b.count(t, `SELECT version FROM notifyedge_schema_version`)
	}

	err := durable.Migrate(ctx, url)
	if err == nil {
		t.Fatal("the upgrade went through with trades paying several orders")
	}
	msg := err.Error()
	for _, want := range []string{
		"22 trade(s)", "(the first 20)",
		"acme:TX-00 paid UP-00-0, UP-00-1, UP-00-2, UP-00-3, UP-00-4 and 2 more; acme:TX-01 paid UP-01-0, UP-01-1;",
		"acme:TX-19 paid UP-19-0, UP-19-1.",
		"decide which order it paid", "set paid_by of every other order to NULL", "then restart",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the upgrade's error does not say %q:\n%s", want, msg)
		}
	}
	for _, not := range []string{"acme:TX-20", "acme:TX-21", "FINE", "NOPAYER"} {
		if strings.Contains(msg, not) {
			t.Errorf("the upgrade's error names %q:\n%s", not, msg)
		}
	}
	if v := version(); v != 8 {
		t.Errorf("schema version %d after the refused upgrade, want 8", v)
	}

	// An operator builds the index by hand, concurrently, before fixing
	// the orders: the build fails and leaves it invalid.
	if _, err := b.db.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY biz_order_paid_by_uniq ON biz_order (paid_by) WHERE paid_by IS NOT NULL`); err == nil {
		t.Fatal("a unique index built over shared payers")
	}
	if err := durable.Migrate(ctx, url); err == nil || !strings.Contains(err.Error(), "DROP INDEX CONCURRENTLY biz_order_paid_by_uniq") {
		t.Fatalf("the upgrade over an invalid index: %v, want it refused with what to do", err)
	}
	b.exec(t, `DROP INDEX biz_order_paid_by_uniq`)

	// What the operator does: each trade keeps the first of its orders.
	b.exec(t, `UPDATE biz_order o SET paid_by = NULL
		WHERE order_no <> (SELECT min(p.order_no) FROM biz_order p WHERE p.paid_by = o.paid_by)`)
	if err := durable.Migrate(ctx, url); err != nil {
		t.Fatalf("the upgrade once the orders were fixed: %v", err)
	}
	if v := version(); v < 9 {
		t.Errorf("schema version %d, want 9 or later", v)
	}
	if n := b.count(t, `SELECT count(*) FROM pg_index WHERE indexrelid = 'biz_order_paid_by_uniq'::regclass AND indisvalid AND indisunique`); n != 1 {
		t.Error("no valid unique index biz_order_paid_by_uniq")
	}
	_, err = b.db.Exec(ctx, `UPDATE biz_order SET paid_by = 'acme:TX-00' WHERE order_no = 'UP-FINE'`)
	wantUniqueViolation(t, "UPDATE after the upgrade", err)

	// Down to 8 and up again: the migration runs again from scratch.
	if err := durable.MigrateTo(ctx, url, 8); err != nil {
		t.Fatal(err)
	}
	if err := durable.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	_, err = b.db.Exec(ctx, `UPDATE biz_order SET paid_by = 'acme:TX-00' WHERE order_no = 'UP-FINE'`)
	wantUniqueViolation(t, "UPDATE after down and up again", err)
}
