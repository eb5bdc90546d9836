// Package outbox holds what the outbox relay hands a broker: the message
// and the Publisher interface. It imports nothing of the database, so a
// broker (durable/redisstream) and the programs that only read the broker
// (cmd/forwarder) link no Postgres client.
package outbox

import (
	"context"
	"errors"
	"time"
)

// Message is one outbox row as the relay publishes it.
type Message struct {
	ID int64
	// EventID is the row's event_id: unique across databases and
	// environments, the same at every re-send ("" for a row written
	// before event ids).
	EventID   string
	Topic     string
	OrderNo   string
	Payload   []byte // the JSON payload
	CreatedAt time.Time
	// Traceparent is the W3C traceparent of the sampled callback whose
	// decision wrote the row ("" for none): a consumer's work joins that
	// trace.
	Traceparent string
}

// Publisher delivers outbox rows to a downstream broker. Publish returns nil
// only once the broker acknowledged every message; it must keep their
// order. A different broker is one new Publisher.
//
// A broker that holds the messages but cannot yet say they are safe (too
// few replicas have them) returns an error wrapping ErrUnconfirmed: the
// relay keeps the rows unpublished and hands them to Publish again later,
// and Publish must then not append them again, only check them again.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) error
}

// ErrUnconfirmed marks a Publish whose messages the broker holds but has
// not yet confirmed as durable.
var ErrUnconfirmed = errors.New("outbox: the broker holds the messages but has not confirmed them")
