package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// Key names derived from the stream.
const (
	deadSuffix       = ":dead"
	deadOrdersSuffix = ":orders"
	leaseInfix       = ":lease:"
)

// forwarder is one process's state across lease terms.
type forwarder struct {
	cfg      Config
	lease    *lease
	sender   *sender
	dead     deadOrders
	retryLog rateLog
	redisLog rateLog
	// sched is the current term's scheduler, for the lag gauge; nil while
	// standby.
	sched atomic.Pointer[scheduler]
}

func newForwarder(cfg Config) *forwarder {
	f := &forwarder{
		cfg:      cfg,
		lease:    newLease(cfg.Client, cfg.Stream+leaseInfix+cfg.Group, cfg.Name, cfg.LeaseTTL, clockwork.NewRealClock()),
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
// per order, and gives the lease up on return. It returns nil once ctx
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
			wait.Sleep(ctx, f.lease.ttl/4)
			continue
		}
		if holder != "" {
			if !standbyLogged {
				cfg.Logger.Info("standby: another forwarder holds the lease", "holder", holder, "group", cfg.Group)
				standbyLogged = true
			}
			wait.Sleep(ctx, f.lease.ttl/4)
			continue
		}
		standbyLogged = false
		err = f.term(ctx, start)
		if errors.Is(err, errCrash) {
			return err
		}
		if err != nil && ctx.Err() == nil {
			cfg.Logger.Warn("lease term ended", "error", err.Error())
			wait.Sleep(ctx, f.lease.ttl/4)
		}
	}
	return nil
}

// term is one lease term: from acquiring the lease to losing or giving it up.
func (f *forwarder) term(ctx context.Context, start time.Time) error {
	cfg := f.cfg
	held := f.lease.hold(start, cfg.Logger)
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
	cfg.Logger.Info("active: lease acquired", "group", cfg.Group, "name", cfg.Name)
	cfg.Metrics.active.Set(1)

	if err := f.ensureGroup(work); err != nil {
		return err
	}
	if err := f.dead.load(work, cfg.Client, cfg.DeadStream+deadOrdersSuffix); err != nil {
		return err
	}
	// Up to a batch per worker of entries that can flow are read ahead:
	// enough that the workers never wait for a read, few enough to bound
	// memory. Entries of held orders have a cap of their own.
	sched := newScheduler(cfg.Partitions*int(cfg.Batch), cfg.MaxHeld,
		func(n int) { cfg.Metrics.held.Set(float64(n)) })
	defer cfg.Metrics.held.Set(0) // after the workers returned: none is held any more
	stopOnCtx := context.AfterFunc(ctx, sched.close)
	defer stopOnCtx()
	stopOnWork := context.AfterFunc(work, sched.close)
	defer stopOnWork()
	var wg sync.WaitGroup
	for range cfg.Partitions {
		wg.Go(func() {
			if err := f.worker(ctx, work, sched); err != nil {
				crashed.Store(errors.Is(err, errCrash))
				abort(err)
			}
		})
	}
	f.sched.Store(sched)
	defer f.sched.Store(nil)
	err := f.dispatch(ctx, work, sched)
	if err != nil {
		abort(err) // the workers stop too; the next term claims what they held
	}
	// Nothing is read any more: once ctx ended, the workers return after
	// their attempts in flight.
	sched.close()
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

// dispatch feeds the scheduler: first every entry pending in the group,
// whoever holds it (the lease says its holder is gone), then new entries;
// both in stream order, so each order's queue is in outbox order. Before
// each read it waits for room in the scheduler.
func (f *forwarder) dispatch(ctx, work context.Context, sched *scheduler) error {
	cfg := f.cfg
	send := func(msgs []redis.XMessage) {
		for _, xm := range msgs {
			sched.add(xm)
		}
	}
	// Claim the pending entries of every consumer of the group. Entries
	// above the group's last-delivered id were never read, so all of these
	// come before anything ">" returns.
	cursor := "0-0"
	for {
		if ctx.Err() != nil || work.Err() != nil || !sched.waitRoom() {
			return nil
		}
		msgs, next, err := cfg.Client.XAutoClaim(work, &redis.XAutoClaimArgs{
			Stream: cfg.Stream, Group: cfg.Group, Consumer: cfg.Name, MinIdle: 0, Start: cursor, Count: cfg.Batch,
		}).Result()
		if err != nil {
			return fmt.Errorf("xautoclaim: %w", err)
		}
		send(msgs)
		if next == "0-0" || next == "" {
			break
		}
		cursor = next
	}
	f.forgetIdleConsumers(work)
	for ctx.Err() == nil && work.Err() == nil && sched.waitRoom() {
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
			wait.Sleep(work, 200*time.Millisecond)
			continue
		}
		for _, s := range streams {
			send(s.Messages)
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

// worker makes attempts on the orders the scheduler hands it until the
// scheduler closes, or until the term stops (ctx: after the attempt in
// flight; work: at once).
func (f *forwarder) worker(ctx, work context.Context, s *scheduler) error {
	for {
		q, xm, failures, ok := s.next()
		if !ok {
			return nil
		}
		res, err := f.attempt(ctx, work, xm, failures+1)
		switch {
		case err != nil:
			return err
		case res.stopped:
			return nil // the entry stays pending: the next term claims it
		case res.failed:
			s.failed(q, res.retryIn)
		default:
			s.done(q)
		}
	}
}

// attemptResult is what one attempt leaves to do with its entry.
type attemptResult struct {
	// failed: the receiver did not take it; try again after retryIn.
	failed  bool
	retryIn time.Duration
	// stopped: the term is ending; the entry stays unacknowledged.
	stopped bool
}

// attempt makes the given attempt (1 for the first) at delivering one
// entry. The entry is finished (the zero result) when it was acknowledged
// after a 2xx, dead-lettered (older than MaxAge, undecodable, or behind an
// earlier dead event of its order), or no longer in the stream. An entry
// left unacknowledged stays pending and is claimed again by the next term.
func (f *forwarder) attempt(ctx, work context.Context, xm redis.XMessage, attempt int) (attemptResult, error) {
	cfg := f.cfg
	if ctx.Err() != nil || work.Err() != nil {
		return attemptResult{stopped: true}, nil
	}
	if len(xm.Values) == 0 {
		// Trimmed or deleted from the stream while pending: nothing to send.
		cfg.Logger.Warn("pending entry no longer in the stream", "stream_id", xm.ID)
		f.ack(work, xm.ID)
		return attemptResult{}, nil
	}
	m, err := decode(xm)
	if err != nil {
		f.bury(work, xm, err.Error(), 0)
		return attemptResult{}, nil
	}
	if f.dead.has(m.OrderNo) {
		f.bury(work, xm, "order "+m.OrderNo+" has an earlier event in "+cfg.DeadStream, 0)
		return attemptResult{}, nil
	}
	body, err := buildBody(m)
	if err != nil {
		f.bury(work, xm, err.Error(), 0)
		return attemptResult{}, nil
	}
	err = f.send(work, m, attempt, body)
	if err == nil {
		if cfg.beforeAck != nil {
			if err := cfg.beforeAck(m); err != nil {
				return attemptResult{}, fmt.Errorf("%w: %w", errCrash, err)
			}
		}
		if f.ack(work, xm.ID) {
			cfg.Metrics.forward.WithLabelValues(resultDelivered).Inc()
		}
		return attemptResult{}, nil
	}
	if work.Err() != nil {
		return attemptResult{stopped: true}, nil // the lease lapsed mid-POST: not the receiver's failure
	}
	if age := f.age(xm.ID); age > cfg.MaxAge {
		f.bury(work, xm, err.Error(), attempt)
		return attemptResult{}, nil
	}
	wait := backoff(attempt, cfg.BackoffMin, cfg.BackoffMax)
	cfg.Metrics.forward.WithLabelValues(resultRetried).Inc()
	if cfg.afterFailure != nil {
		cfg.afterFailure(m, attempt, wait)
	}
	if ok, suppressed := f.retryLog.allow(); ok {
		cfg.Logger.Warn("delivery failed, will retry", "outbox_id", m.OutboxID, "order_no", m.OrderNo,
			"attempt", attempt, "backoff", wait.String(), "error", err.Error(), "suppressed", suppressed)
	}
	return attemptResult{failed: true, retryIn: wait}, nil
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
		wait.Sleep(work, backoff(attempt, 50*time.Millisecond, time.Second))
	}
	return false
}

func (f *forwarder) redisError(what string, err error) {
	if ok, suppressed := f.redisLog.allow(); ok {
		f.cfg.Logger.Warn("redis", "op", what, "error", err.Error(), "suppressed", suppressed)
	}
}

// age is how old a stream entry is by Redis's clock (the entry id's time
// is Redis's clock at XADD), so a skewed local clock does not age events.
func (f *forwarder) age(id string) time.Duration {
	return f.lease.now().Sub(entryTime(id))
}

// lag is the age of the oldest entry this forwarder has read and not
// finished (delivered or dead-lettered), 0 when it has none in hand. The
// entries queued behind a held order count: they are in hand too.
func (f *forwarder) lag() float64 {
	sched := f.sched.Load()
	if sched == nil {
		return 0
	}
	oldest := sched.oldest()
	if oldest.IsZero() {
		return 0
	}
	return max(0, f.lease.now().Sub(oldest).Seconds())
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
