package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// Fields a dead-letter entry adds to the original entry's.
const (
	FieldError    = "error"     // the last failure
	FieldAttempts = "attempts"  // POSTs tried; 0 when it followed an earlier dead event of its order
	FieldSourceID = "source_id" // the entry's id in the outbox stream
	FieldDeadAt   = "dead_at"   // RFC 3339, when it was dead-lettered
)

// deadOrders is the term's copy of the set of orders with an event in the
// dead-letter stream. Only the lease holder changes the Redis set, so the
// copy read at the start of a term stays true for the term.
type deadOrders struct {
	mu  sync.RWMutex
	set map[string]struct{}
}

func (d *deadOrders) load(ctx context.Context, client redis.UniversalClient, key string) error {
	members, err := client.SMembers(ctx, key).Result()
	if err != nil {
		return fmt.Errorf("read dead orders %s: %w", key, err)
	}
	set := make(map[string]struct{}, len(members))
	for _, o := range members {
		set[o] = struct{}{}
	}
	d.mu.Lock()
	d.set = set
	d.mu.Unlock()
	return nil
}

func (d *deadOrders) has(order string) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	_, ok := d.set[order]
	return ok
}

func (d *deadOrders) add(order string) {
	d.mu.Lock()
	d.set[order] = struct{}{}
	d.mu.Unlock()
}

// bury moves an entry to the dead-letter stream: the order joins the dead
// set first (so after a crash anywhere below, the still-pending entry and
// every later one of its order follow it), then the entry is added, then
// acknowledged. It gives up only when the lease is lost; the entry is then
// still pending and the next term buries it again.
func (f *forwarder) bury(work context.Context, xm redis.XMessage, reason string, attempts int) {
	cfg := f.cfg
	order := orderOf(xm)
	if order != "" && !f.dead.has(order) {
		ok := f.retryRedis(work, "sadd dead order", func(ctx context.Context) error {
			return cfg.Client.SAdd(ctx, cfg.DeadStream+deadOrdersSuffix, order).Err()
		})
		if !ok {
			return
		}
		f.dead.add(order)
	}
	ok := f.retryRedis(work, "xadd dead", func(ctx context.Context) error {
		return f.addDead(ctx, xm, reason, attempts)
	})
	if !ok || !f.ack(work, xm.ID) {
		return
	}
	cfg.Metrics.forward.WithLabelValues(resultDead).Inc()
	cfg.Logger.Warn("dead-lettered", "stream_id", xm.ID, "outbox_id", xm.Values[redisstream.FieldOutboxID],
		"order_no", order, "attempts", attempts, "error", reason, "dead_stream", cfg.DeadStream)
}

// addDead XADDs the entry to the dead-letter stream under its own id, so a
// second try after a crash or a lost reply finds it there instead of
// adding it twice. When the dead stream is already past that id (workers
// bury concurrently) it is added under a fresh id.
func (f *forwarder) addDead(ctx context.Context, xm redis.XMessage, reason string, attempts int) error {
	cfg := f.cfg
	vals := deadValues(xm, reason, attempts)
	err := cfg.Client.XAdd(ctx, &redis.XAddArgs{Stream: cfg.DeadStream, ID: xm.ID, Values: vals}).Err()
	if err == nil || !strings.Contains(err.Error(), "equal or smaller") {
		if err != nil {
			return fmt.Errorf("xadd %s: %w", cfg.DeadStream, err)
		}
		return nil
	}
	got, err := cfg.Client.XRangeN(ctx, cfg.DeadStream, xm.ID, xm.ID, 1).Result()
	if err != nil {
		return fmt.Errorf("xrange %s: %w", cfg.DeadStream, err)
	}
	if len(got) == 1 && got[0].Values[redisstream.FieldOutboxID] == xm.Values[redisstream.FieldOutboxID] {
		return nil
	}
	if err := cfg.Client.XAdd(ctx, &redis.XAddArgs{Stream: cfg.DeadStream, Values: vals}).Err(); err != nil {
		return fmt.Errorf("xadd %s: %w", cfg.DeadStream, err)
	}
	return nil
}

// deadValues is the original entry's fields (the relay's first, in its
// order, then any others sorted) plus why it died.
func deadValues(xm redis.XMessage, reason string, attempts int) []any {
	known := []string{redisstream.FieldOutboxID, redisstream.FieldEventID, redisstream.FieldTopic, redisstream.FieldOrderNo, redisstream.FieldPayload,
		redisstream.FieldTraceparent}
	var vals []any
	for _, k := range known {
		if v, ok := xm.Values[k]; ok {
			vals = append(vals, k, v)
		}
	}
	var other []string
	for k := range xm.Values {
		if !slices.Contains(known, k) && k != FieldError && k != FieldAttempts && k != FieldSourceID && k != FieldDeadAt {
			other = append(other, k)
		}
	}
	slices.Sort(other)
	for _, k := range other {
		vals = append(vals, k, xm.Values[k])
	}
	return append(vals, FieldError, reason, FieldAttempts, strconv.Itoa(attempts),
		FieldSourceID, xm.ID, FieldDeadAt, time.Now().UTC().Format(time.RFC3339Nano))
}

// RedriveResult is what Redrive did.
type RedriveResult struct {
	// Delivered counts entries delivered and removed from the dead stream.
	Delivered int
	// Remaining counts entries left in the dead stream.
	Remaining int
	// StillDead lists the orders that stay dead (their first dead entry
	// still fails).
	StillDead []string
}

// Redrive delivers the dead-letter stream to the receiver, in its order,
// under the group's lease (so no forwarder runs meanwhile): each entry is
// retried for RedriveGiveUp and removed once answered 2xx; an order whose
// entry still fails keeps that entry and all its later ones, and stays in
// the dead set. Orders fully delivered leave the set, and the forwarder
// goes on with their newer events, which all sit behind the lease in the
// outbox stream: so the receiver still sees every order in outbox order.
//
// It delivers directly rather than appending the entries back to the
// outbox stream: appended at the tail they would come after newer events
// of the same order that were published but not yet forwarded.
func Redrive(ctx context.Context, cfg Config) (RedriveResult, error) {
	var res RedriveResult
	cfg, err := cfg.withDefaults()
	if err != nil {
		return res, err
	}
	f := newForwarder(cfg)
	// A SIGKILLed holder's lease lapses within one TTL; a live forwarder
	// renews it for ever, so waiting longer than this is pointless.
	deadline := time.Now().Add(cfg.LeaseTTL + cfg.LeaseTTL/2)
	var start time.Time
	for {
		s, holder, err := f.lease.try(ctx)
		if err == nil && holder == "" {
			start = s
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				return res, fmt.Errorf("redrive: %w", err)
			}
			return res, fmt.Errorf("redrive: a running forwarder holds the lease (%s): stop it, re-drive, start it again", holder)
		}
		wait.Sleep(ctx, cfg.LeaseTTL/4)
	}
	held := f.lease.hold(start, cfg.Logger)
	defer func() {
		lapsed := held.ctx.Err() != nil
		held.stop()
		if !lapsed {
			rctx, cancel := context.WithTimeout(context.Background(), time.Second)
			f.lease.release(rctx)
			cancel()
		}
	}()
	work := held.ctx
	stopped := func() error {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("redrive: %w", err)
		}
		if work.Err() != nil {
			return fmt.Errorf("redrive: %w", context.Cause(work))
		}
		return nil
	}
	blocked := map[string]bool{}
	cursor := "-"
	for {
		page, err := cfg.Client.XRangeN(work, cfg.DeadStream, cursor, "+", cfg.Batch).Result()
		if err != nil {
			if s := stopped(); s != nil {
				return res, s
			}
			return res, fmt.Errorf("redrive: xrange %s: %w", cfg.DeadStream, err)
		}
		if len(page) == 0 {
			break
		}
		for _, d := range page {
			cursor = "(" + d.ID
			order := orderOf(d)
			if blocked[order] {
				res.Remaining++
				continue
			}
			m, err := decode(d)
			var body []byte
			if err == nil {
				body, err = buildBody(m)
			}
			if err == nil {
				err = f.redeliver(ctx, work, m, body)
			}
			if s := stopped(); s != nil {
				return res, s
			}
			if err != nil {
				blocked[order] = true
				res.Remaining++
				cfg.Logger.Warn("re-drive: left in the dead-letter stream with the rest of its order",
					"stream_id", d.ID, "order_no", order, "error", err.Error())
				continue
			}
			// Removed only after the 2xx: a crash in between sends it
			// again, a duplicate the receiver drops by webhook-id.
			ok := f.retryRedis(work, "xdel dead", func(ctx context.Context) error {
				return cfg.Client.XDel(ctx, cfg.DeadStream, d.ID).Err()
			})
			if !ok {
				return res, stopped()
			}
			res.Delivered++
		}
	}
	key := cfg.DeadStream + deadOrdersSuffix
	members, err := cfg.Client.SMembers(work, key).Result()
	if err != nil {
		return res, fmt.Errorf("redrive: read %s: %w", key, err)
	}
	slices.Sort(members)
	for _, o := range members {
		if blocked[o] {
			res.StillDead = append(res.StillDead, o)
			continue
		}
		if err := cfg.Client.SRem(work, key, o).Err(); err != nil {
			return res, fmt.Errorf("redrive: srem %s: %w", key, err)
		}
	}
	cfg.Logger.Info("re-drive done", "delivered", res.Delivered, "remaining", res.Remaining, "still_dead_orders", len(res.StillDead))
	return res, nil
}

// redeliver POSTs one dead entry with backoff until a 2xx, RedriveGiveUp,
// or the run stops.
func (f *forwarder) redeliver(ctx, work context.Context, m redisstream.Message, body []byte) error {
	cfg := f.cfg
	giveUp := time.Now().Add(cfg.RedriveGiveUp)
	for attempt := 1; ; attempt++ {
		err := f.send(work, m, attempt, body)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || work.Err() != nil {
			return errors.Join(err, ctx.Err(), work.Err())
		}
		left := time.Until(giveUp)
		if left <= 0 {
			return fmt.Errorf("after %d attempts: %w", attempt, err)
		}
		wait := min(backoff(attempt, cfg.BackoffMin, cfg.BackoffMax), left)
		if ok, suppressed := f.retryLog.allow(); ok {
			cfg.Logger.Warn("re-drive: delivery failed, will retry", "outbox_id", m.OutboxID, "order_no", m.OrderNo,
				"attempt", attempt, "backoff", wait.String(), "error", err.Error(), "suppressed", suppressed)
		}
		select {
		case <-ctx.Done():
		case <-work.Done():
		case <-time.After(wait):
		}
	}
}
