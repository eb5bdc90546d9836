package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/edge/channel"
)

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
	// Partitions is how many orders are forwarded at once (default 8):
	// each order always maps to the same partition, which forwards its
	// events one by one in stream order.
	Partitions int
	// Batch is how many entries one stream read takes (default 100).
	Batch int64
	// Block is how long a read waits for new entries (default 1s).
	Block time.Duration
	// RedriveGiveUp is how long Redrive retries one dead entry before it
	// leaves that order in the dead-letter stream (default 1m).
	RedriveGiveUp time.Duration
	// Log receives JSON-able structured logs (default: discarded).
	Log *slog.Logger
	// Metrics is where counts go (default: a private set).
	Metrics *Metrics
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

// Key names derived from the stream.
const (
	deadSuffix       = ":dead"
	deadOrdersSuffix = ":orders"
	leaseInfix       = ":lease:"
)

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
	c.Block = cmp.Or(c.Block, time.Second)
	c.RedriveGiveUp = cmp.Or(c.RedriveGiveUp, time.Minute)
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
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

// forwarder is one process's state across lease terms.
type forwarder struct {
	cfg      Config
	lease    *lease
	sender   *sender
	dead     deadOrders
	retryLog rateLog
	redisLog rateLog
	// lanes of the current term, for the lag gauge; nil while standby.
	lanes atomic.Pointer[[]*lane]
}

func newForwarder(cfg Config) *forwarder {
	f := &forwarder{
		cfg:      cfg,
		lease:    newLease(cfg.Client, cfg.Stream+leaseInfix+cfg.Group, cfg.Name, cfg.LeaseTTL),
		sender:   &sender{client: cfg.HTTPClient, url: cfg.URL, secret: cfg.Secret},
		retryLog: rateLog{every: time.Second},
		redisLog: rateLog{every: time.Second},
	}
	return f
}

// errCrash marks a run aborted by the beforeAck hook.
var errCrash = errors.New("forwarder: aborted before ack")

// Run forwards the stream until ctx ends: it waits for the group's lease
// (standby while another forwarder holds it), then claims every entry the
// group has pending, forwards them and then new entries in stream order
// per partition, and gives the lease up on return. It returns nil once ctx
// ended, after the attempts in flight finished.
func Run(ctx context.Context, cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	f := newForwarder(cfg)
	cfg.Metrics.setLag(f.lag)
	defer cfg.Metrics.setLag(nil)
	standbyLogged := false
	for ctx.Err() == nil {
		start, holder, err := f.lease.try(ctx)
		if err != nil {
			f.redisError("acquire lease", err)
			sleepCtx(ctx, f.lease.ttl/4)
			continue
		}
		if holder != "" {
			if !standbyLogged {
				cfg.Log.Info("standby: another forwarder holds the lease", "holder", holder, "group", cfg.Group)
				standbyLogged = true
			}
			sleepCtx(ctx, f.lease.ttl/4)
			continue
		}
		standbyLogged = false
		err = f.term(ctx, start)
		if errors.Is(err, errCrash) {
			return err
		}
		if err != nil && ctx.Err() == nil {
			cfg.Log.Warn("lease term ended", "error", err.Error())
			sleepCtx(ctx, f.lease.ttl/4)
		}
	}
	return nil
}

// term is one lease term: from acquiring the lease to losing or giving it up.
func (f *forwarder) term(ctx context.Context, start time.Time) error {
	cfg := f.cfg
	held := f.lease.hold(start, cfg.Log)
	// work ends when the lease lapses or a worker aborts; ctx ending lets
	// the attempts in flight finish (and be acknowledged) first.
	work, abort := context.WithCancelCause(held.ctx)
	var crashed atomic.Bool
	defer func() {
		lapsed := held.ctx.Err() != nil
		abort(nil)
		held.stop()
		cfg.Metrics.active.Set(0) // before the release: never two 1s at once
		// A crash leaves the lease to expire, as a SIGKILL would.
		if !crashed.Load() && !lapsed {
			rctx, cancel := context.WithTimeout(context.Background(), time.Second)
			f.lease.release(rctx)
			cancel()
		}
	}()
	cfg.Log.Info("active: lease acquired", "group", cfg.Group, "name", cfg.Name)
	cfg.Metrics.active.Set(1)

	if err := f.ensureGroup(work); err != nil {
		return err
	}
	if err := f.dead.load(work, cfg.Client, cfg.DeadStream+deadOrdersSuffix); err != nil {
		return err
	}
	lanes := make([]*lane, cfg.Partitions)
	var wg sync.WaitGroup
	for i := range lanes {
		lanes[i] = &lane{ch: make(chan redis.XMessage, cfg.Batch)}
		wg.Go(func() {
			if err := f.runLane(ctx, work, lanes[i]); err != nil {
				crashed.Store(errors.Is(err, errCrash))
				abort(err)
			}
		})
	}
	f.lanes.Store(&lanes)
	defer f.lanes.Store(nil)
	err := f.dispatch(ctx, work, lanes)
	if err != nil {
		abort(err) // the lanes stop too; the next term claims what they held
	}
	wg.Wait()
	if cause := context.Cause(work); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// ensureGroup creates the group (from the stream's start) if it is missing.
func (f *forwarder) ensureGroup(ctx context.Context) error {
	err := f.cfg.Client.XGroupCreateMkStream(ctx, f.cfg.Stream, f.cfg.Group, "0").Err()
	if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("create group %s: %w", f.cfg.Group, err)
	}
	return nil
}

// dispatch feeds the lanes: first every entry pending in the group, whoever
// holds it (the lease says its holder is gone), then new entries; both in
// stream order, so each lane sees its orders' events in outbox order.
func (f *forwarder) dispatch(ctx, work context.Context, lanes []*lane) error {
	cfg := f.cfg
	send := func(msgs []redis.XMessage) bool {
		for _, xm := range msgs {
			ln := lanes[partition(orderOf(xm), len(lanes))]
			select {
			case ln.ch <- xm:
			case <-ctx.Done():
				return false
			case <-work.Done():
				return false
			}
		}
		return true
	}
	// Claim the pending entries of every consumer of the group. Entries
	// above the group's last-delivered id were never read, so all of these
	// come before anything ">" returns.
	cursor := "0-0"
	for {
		if ctx.Err() != nil || work.Err() != nil {
			return nil
		}
		msgs, next, err := cfg.Client.XAutoClaim(work, &redis.XAutoClaimArgs{
			Stream: cfg.Stream, Group: cfg.Group, Consumer: cfg.Name, MinIdle: 0, Start: cursor, Count: cfg.Batch,
		}).Result()
		if err != nil {
			return fmt.Errorf("xautoclaim: %w", err)
		}
		if !send(msgs) {
			return nil
		}
		if next == "0-0" || next == "" {
			break
		}
		cursor = next
	}
	f.forgetIdleConsumers(work)
	for ctx.Err() == nil && work.Err() == nil {
		streams, err := cfg.Client.XReadGroup(work, &redis.XReadGroupArgs{
			Group: cfg.Group, Consumer: cfg.Name, Streams: []string{cfg.Stream, ">"},
			Count: cfg.Batch, Block: cfg.Block,
		}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			if work.Err() != nil || ctx.Err() != nil {
				return nil
			}
			f.redisError("xreadgroup", err)
			if strings.Contains(err.Error(), "NOGROUP") {
				// The stream was deleted: what was read is gone with it.
				if err := f.ensureGroup(work); err != nil {
					f.redisError("create group", err)
				}
			}
			sleepCtx(work, 200*time.Millisecond)
			continue
		}
		for _, s := range streams {
			if !send(s.Messages) {
				return nil
			}
		}
	}
	return nil
}

// forgetIdleConsumers removes the consumers of earlier terms (each process
// names itself anew) once their pending entries were claimed, so XINFO
// stays readable. Only consumers with nothing pending: deleting one that
// held entries would drop them from the pending list.
func (f *forwarder) forgetIdleConsumers(ctx context.Context) {
	cs, err := f.cfg.Client.XInfoConsumers(ctx, f.cfg.Stream, f.cfg.Group).Result()
	if err != nil {
		f.redisError("xinfo consumers", err)
		return
	}
	for _, c := range cs {
		if c.Name != f.cfg.Name && c.Pending == 0 {
			_ = f.cfg.Client.XGroupDelConsumer(ctx, f.cfg.Stream, f.cfg.Group, c.Name).Err()
		}
	}
}

// lane forwards the entries of its orders one at a time.
type lane struct {
	ch chan redis.XMessage
	// head is the stream time (unix ms) of the entry in hand, 0 when idle.
	head atomic.Int64
}

// runLane processes its entries until ctx ends (after the attempt in
// flight) or work ends (lease lost: at once).
func (f *forwarder) runLane(ctx, work context.Context, ln *lane) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-work.Done():
			return nil
		case xm := <-ln.ch:
			ln.head.Store(entryTime(xm.ID).UnixMilli())
			err := f.process(ctx, work, xm)
			ln.head.Store(0)
			if err != nil {
				return err
			}
		}
	}
}

// process delivers one entry, retrying until a 2xx, until it is older than
// MaxAge (then dead-letters it), or until the run stops. An entry left
// unacknowledged stays pending and is claimed again by the next term.
func (f *forwarder) process(ctx, work context.Context, xm redis.XMessage) error {
	cfg := f.cfg
	if len(xm.Values) == 0 {
		// Trimmed or deleted from the stream while pending: nothing to send.
		cfg.Log.Warn("pending entry no longer in the stream", "stream_id", xm.ID)
		f.ack(work, xm.ID)
		return nil
	}
	m, err := decode(xm)
	if err != nil {
		f.bury(work, xm, err.Error(), 0)
		return nil
	}
	if f.dead.has(m.OrderNo) {
		f.bury(work, xm, "order "+m.OrderNo+" has an earlier event in "+cfg.DeadStream, 0)
		return nil
	}
	body, err := buildBody(m)
	if err != nil {
		f.bury(work, xm, err.Error(), 0)
		return nil
	}
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil || work.Err() != nil {
			return nil
		}
		err := f.sender.post(work, m.OutboxID, body)
		if err == nil {
			if cfg.beforeAck != nil {
				if err := cfg.beforeAck(m); err != nil {
					return fmt.Errorf("%w: %w", errCrash, err)
				}
			}
			if f.ack(work, xm.ID) {
				cfg.Metrics.forward.WithLabelValues(resultDelivered).Inc()
			}
			return nil
		}
		if work.Err() != nil {
			return nil // the lease lapsed mid-POST: not the receiver's failure
		}
		if age := f.age(xm.ID); age > cfg.MaxAge {
			f.bury(work, xm, err.Error(), attempt)
			return nil
		}
		wait := backoff(attempt, cfg.BackoffMin, cfg.BackoffMax)
		cfg.Metrics.forward.WithLabelValues(resultRetried).Inc()
		if cfg.afterFailure != nil {
			cfg.afterFailure(m, attempt, wait)
		}
		if ok, suppressed := f.retryLog.allow(); ok {
			cfg.Log.Warn("delivery failed, will retry", "outbox_id", m.OutboxID, "order_no", m.OrderNo,
				"attempt", attempt, "backoff", wait.String(), "error", err.Error(), "suppressed", suppressed)
		}
		select {
		case <-ctx.Done():
		case <-work.Done():
		case <-time.After(wait):
		}
	}
}

// ack acknowledges an entry, retrying while the lease holds. False when it
// gave up: the entry stays pending and comes again (a duplicate the
// receiver drops by webhook-id).
func (f *forwarder) ack(work context.Context, id string) bool {
	return f.retryRedis(work, "xack", func(ctx context.Context) error {
		return f.cfg.Client.XAck(ctx, f.cfg.Stream, f.cfg.Group, id).Err()
	})
}

// retryRedis runs op until it succeeds or work ends, backing off up to a
// second between tries.
func (f *forwarder) retryRedis(work context.Context, what string, op func(context.Context) error) bool {
	for attempt := 1; work.Err() == nil; attempt++ {
		err := op(work)
		if err == nil {
			return true
		}
		if work.Err() != nil {
			break
		}
		f.redisError(what, err)
		sleepCtx(work, backoff(attempt, 50*time.Millisecond, time.Second))
	}
	return false
}

func (f *forwarder) redisError(what string, err error) {
	if ok, suppressed := f.redisLog.allow(); ok {
		f.cfg.Log.Warn("redis", "op", what, "error", err.Error(), "suppressed", suppressed)
	}
}

// age is how old a stream entry is by Redis's clock (the entry id's time
// is Redis's clock at XADD), so a skewed local clock does not age events.
func (f *forwarder) age(id string) time.Duration {
	return f.lease.now().Sub(entryTime(id))
}

// lag is the age of the oldest entry this forwarder has read and not
// finished (delivered or dead-lettered), 0 when it has none in hand.
func (f *forwarder) lag() float64 {
	lanes := f.lanes.Load()
	if lanes == nil {
		return 0
	}
	var oldest int64
	for _, ln := range *lanes {
		if h := ln.head.Load(); h != 0 && (oldest == 0 || h < oldest) {
			oldest = h
		}
	}
	if oldest == 0 {
		return 0
	}
	return max(0, f.lease.now().Sub(time.UnixMilli(oldest)).Seconds())
}

// partition maps an order to its lane: always the same one, so one
// goroutine forwards all of an order's events.
func partition(orderNo string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(orderNo))
	return int(h.Sum32() % uint32(n))
}

func orderOf(xm redis.XMessage) string {
	s, _ := xm.Values[redisstream.FieldOrderNo].(string)
	return s
}

// backoff is full jitter: uniform in [0, min(max, min·2^(attempt-1))].
func backoff(attempt int, lo, hi time.Duration) time.Duration {
	ceil := lo
	for i := 1; i < attempt && ceil < hi; i++ {
		ceil *= 2
	}
	ceil = min(ceil, hi)
	return rand.N(ceil + 1)
}

// rateLog lets one line through per interval and counts the rest.
type rateLog struct {
	every      time.Duration
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (r *rateLog) allow() (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.last) >= r.every {
		n := r.suppressed
		r.last, r.suppressed = now, 0
		return true, n
	}
	r.suppressed++
	return false, 0
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
