package pgtemp

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Order is a biz_order row to seed.
type Order struct {
	No       string
	Status   string
	Amount   int64
	Currency string
}

// SeedOrders inserts orders into the migrated database at url with COPY
// (about 100k rows in a third of a second): for tests, benches and
// `edged -dev`, which is why it lives here and not in durabletest.
func SeedOrders(ctx context.Context, url string, orders []Order) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("seed orders: connect: %w", err)
	}
	defer conn.Close(ctx)
	_, err = conn.CopyFrom(ctx, pgx.Identifier{"biz_order"}, []string{"order_no", "status", "amount", "currency"},
		pgx.CopyFromSlice(len(orders), func(i int) ([]any, error) {
			o := orders[i]
			return []any{o.No, o.Status, o.Amount, o.Currency}, nil
		}))
	if err != nil {
		return fmt.Errorf("seed orders: %w", err)
	}
	return nil
}

// SeedPending seeds n PENDING_PAY orders in CNY of amount each, numbered
// by nameFormat (a fmt format taking the index), and returns them.
func SeedPending(ctx context.Context, url, nameFormat string, n int, amount int64) ([]Order, error) {
	orders := make([]Order, n)
	for i := range orders {
		orders[i] = Order{No: fmt.Sprintf(nameFormat, i), Status: "PENDING_PAY", Amount: amount, Currency: "CNY"}
	}
	return orders, SeedOrders(ctx, url, orders)
}
