// Package shipping is the reference consumer of the outbox stream: it
// ships every order whose ORDER_PAID it reads, through durable's
// conditional PAID -> SHIPPED transition, deduplicated on the outbox id.
// It joins durable and durable/redisstream, so that the broker package
// needs no database client.
package shipping

import (
	"context"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/redisstream"
)

// Store is what the reference shipper needs of Postgres. *durable.Store
// satisfies it.
type Store interface {
	Ship(ctx context.Context, consumer string, outboxID int64, orderNo string) (durable.ShipResult, durable.State, error)
	ShipMany(ctx context.Context, consumer string, items []durable.ShipItem) ([]durable.ShipDecision, error)
}

// OnPaid is the reference consumer's handler: on ORDER_PAID it ships the
// order through the conditional PAID -> SHIPPED transition, deduplicated on
// the outbox id, in one transaction (durable.Store.Ship); other topics are
// acknowledged untouched. onResult, if set, hears every decision.
func OnPaid(store Store, consumer string, onResult func(redisstream.Message, durable.ShipResult)) func(context.Context, redisstream.Message) error {
	return func(ctx context.Context, m redisstream.Message) error {
		if m.Topic != string(durable.TopicOrderPaid) {
			return nil
		}
		r, _, err := store.Ship(ctx, consumer, m.OutboxID, m.OrderNo)
		if err != nil {
			return err
		}
		if onResult != nil {
			onResult(m, r)
		}
		return nil
	}
}

// OnPaidBatch is OnPaid for the messages of one read together
// (redisstream.ConsumerConfig.HandleBatch): their ORDER_PAID orders are
// shipped in one transaction (durable.Store.ShipMany), one commit for the
// batch. If that transaction fails, each is shipped alone, so that one
// order that cannot be shipped holds none of the others back: it alone
// stays pending.
func OnPaidBatch(store Store, consumer string, onResult func(redisstream.Message, durable.ShipResult)) func(context.Context, []redisstream.Message) []error {
	one := OnPaid(store, consumer, onResult)
	return func(ctx context.Context, ms []redisstream.Message) []error {
		errs := make([]error, len(ms))
		var items []durable.ShipItem
		var paid []int // indexes in ms of items
		for i, m := range ms {
			if m.Topic == string(durable.TopicOrderPaid) {
				items = append(items, durable.ShipItem{OutboxID: m.OutboxID, OrderNo: m.OrderNo})
				paid = append(paid, i)
			}
		}
		if len(items) == 0 {
			return errs
		}
		ds, err := store.ShipMany(ctx, consumer, items)
		if err != nil {
			for _, i := range paid {
				errs[i] = one(ctx, ms[i])
			}
			return errs
		}
		if onResult != nil {
			for j, i := range paid {
				onResult(ms[i], ds[j].Result)
			}
		}
		return errs
	}
}
