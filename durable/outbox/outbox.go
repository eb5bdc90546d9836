// Package outbox holds what the outbox relay hands a broker: the message
// and the Publisher interface. It imports nothing of the database, so a
// broker (durable/redisstream) and the programs that only read the broker
// (cmd/forwarder) link no Postgres client.
package outbox

import (
	"context"
	"time"
)

// Message is one outbox row as the relay publishes it.
type Message struct {
	ID        int64
	Topic     string
	OrderNo   string
	Payload   []byte // the JSON payload
	CreatedAt time.Time
}

// Publisher delivers outbox rows to a downstream broker. Publish returns nil
// only once the broker acknowledged every message; it must keep their
// order. A different broker is one new Publisher.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) error
}
