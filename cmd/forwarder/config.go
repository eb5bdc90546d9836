package main

import (
	"go.opentelemetry.io/otel/trace"

	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/edge/channel"
)

// The forwarder's configuration: what Run is given, its defaults, and the
// HTTP client it POSTs with.

// Config configures Run and Redrive. Zero fields take the defaults noted.
type Config struct {
	// Client is the stream's Redis (EDGE_STREAM_URL); required.
	Client redis.UniversalClient
	// Stream is the outbox stream (default redisstream.DefaultStream).
	Stream string
	// Group is the consumer group (default "forwarder").
	Group string
	// Name is this consumer within the group; required.
	Name string
	// DeadStream is the dead-letter stream (default Stream + ":dead"); the
	// set of dead orders is DeadStream + ":orders". One group per dead
	// stream: two groups sharing one would bury each other's orders.
	DeadStream string
	// URL is where events are POSTed (FORWARD_URL); required.
	URL string
	// Secret signs each message ("whsec_" + base64 key); required.
	Secret string
	// Timeout bounds one POST, response included (default 10s).
	Timeout time.Duration
	// MaxAge is how old, by its stream entry's time, an event may grow
	// while it fails before it is dead-lettered (default 24h).
	MaxAge time.Duration
	// LeaseTTL is the lifetime of the single-active-consumer lease
	// (default 10s): a SIGKILLed forwarder's successor waits at most this long.
	LeaseTTL time.Duration
	// BackoffMin and BackoffMax bound the retry delay: full jitter over
	// BackoffMin doubling per attempt up to BackoffMax (defaults 100ms, 30s).
	BackoffMin, BackoffMax time.Duration
	// Partitions is how many events are POSTed at once (default 8), each
	// of a different order: the number of workers. Any worker may take any
	// order, but an order's events go one by one, in stream order.
	Partitions int
	// Batch is how many entries one stream read takes (default 100).
	Batch int64
	// MaxHeld is how many entries of held orders (orders waiting for a
	// failed event's retry) are kept in memory before reading pauses
	// (default 100000): a bound for when the receiver refuses most orders.
	MaxHeld int
	// Block is how long a read waits for new entries (default 1s).
	Block time.Duration
	// RedriveGiveUp is how long Redrive retries one dead entry before it
	// leaves that order in the dead-letter stream (default 1m).
	RedriveGiveUp time.Duration
	// Logger receives JSON-able structured logs (default: discarded).
	Logger *slog.Logger
	// Metrics is where counts go (default: a private set).
	Metrics *Metrics
	// Tracer, when set, gives every attempt at an event that carries a
	// callback's trace context a client span in that trace, and the
	// webhook that span's traceparent (nil: the event's own is sent on).
	Tracer trace.Tracer
	// HTTPClient posts the events (default: one with Timeout that follows
	// no redirects). Its Timeout should bound every request.
	HTTPClient *http.Client

	// beforeAck, when set, runs after a 2xx and before the XACK; an error
	// aborts the run there without acknowledging or releasing the lease,
	// as a crash would (tests force a redelivery with it).
	beforeAck func(redisstream.Message) error
	// afterFailure, when set, runs after a failed attempt that will be
	// retried, with the delay chosen before the next one (tests check
	// the backoff with it, not with the wall clock).
	afterFailure func(m redisstream.Message, attempt int, wait time.Duration)
}

// newHTTPClient returns a client with the total timeout given that never
// follows a redirect: Go would turn a redirected POST into a GET, whose
// 200 would acknowledge an event nobody received.
func newHTTPClient(timeout time.Duration, conns int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = max(conns, 2)
	return &http.Client{
		Timeout:       timeout,
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func (c Config) withDefaults() (Config, error) {
	if c.Client == nil || c.Name == "" || c.URL == "" || c.Secret == "" {
		return c, errors.New("forwarder: Client, Name, URL and Secret are required")
	}
	if _, err := channel.DecodeWebhookSecret(c.Secret); err != nil {
		return c, fmt.Errorf("forwarder: secret: %w", err)
	}
	c.Stream = cmp.Or(c.Stream, redisstream.DefaultStream)
	c.Group = cmp.Or(c.Group, "forwarder")
	c.DeadStream = cmp.Or(c.DeadStream, c.Stream+deadSuffix)
	c.Timeout = cmp.Or(c.Timeout, 10*time.Second)
	c.MaxAge = cmp.Or(c.MaxAge, 24*time.Hour)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, 10*time.Second)
	c.BackoffMin = cmp.Or(c.BackoffMin, 100*time.Millisecond)
	c.BackoffMax = max(cmp.Or(c.BackoffMax, 30*time.Second), c.BackoffMin)
	c.Partitions = max(c.Partitions, 0)
	c.Partitions = cmp.Or(c.Partitions, 8)
	c.Batch = cmp.Or(c.Batch, 100)
	c.MaxHeld = cmp.Or(max(c.MaxHeld, 0), 100000)
	c.Block = cmp.Or(c.Block, time.Second)
	c.RedriveGiveUp = cmp.Or(c.RedriveGiveUp, time.Minute)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics()
	}
	if c.HTTPClient == nil {
		c.HTTPClient = newHTTPClient(c.Timeout, c.Partitions)
	}
	if c.LeaseTTL < 40*time.Millisecond {
		return c, fmt.Errorf("forwarder: lease ttl %v too short", c.LeaseTTL)
	}
	return c, nil
}
