package durable

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// group decides concurrent deliveries together: one transaction and one
// round trip for a batch (see "Why batches" in the package doc).
//
// Batching is natural: a delivery that finds no batch in flight and a slot
// free starts one at once with whatever waits (alone, it waits for nothing
// and takes the one-at-a-time statement); while a batch is in flight,
// deliveries queue, and the batch takes them all, up to size, when it
// ends. One batch at a time gathers twice the deliveries two would, and a
// batch's commit and set-up are most of what it costs Postgres. A batch
// never waits for a lock (past its short lock_timeout), so nothing waits
// long behind it; a lone delivery may (as long as its budget), so behind
// lone deliveries the free slots are taken at once.
//
// One timer: a batch of two or more that ends with nobody queued behind it
// keeps its slot for up to linger, until as many deliveries as it decided
// have queued (its callers coming back), and decides them together. Under
// load that turns the lone transactions that would start the next round
// into members of one batch; at one caller at a time (batches of one)
// nothing ever waits.
type group struct {
	s           *Store
	slots       int           // batches in flight at most
	size        int           // deliveries per batch at most
	lockTimeout string        // the batch's lock_timeout, in ms
	linger      time.Duration // <= 0: a batch that ends never waits

	mu       sync.Mutex
	queue    []*member
	inFlight int
	lones    int        // of inFlight, lone deliveries (which may wait on a lock)
	waiting  *lingering // the run that lingers, if one does

	stats GroupStats
}

// GroupStats counts what group commit did since the Store opened.
type GroupStats struct {
	// Batches counts batch transactions (two or more deliveries).
	Batches atomic.Uint64
	// Batched counts the deliveries decided in them.
	Batched atomic.Uint64
	// Alone counts deliveries decided in a transaction of their own: a lone
	// delivery, one whose key or order another transaction held (Busy), or
	// one of a batch that failed (Retried).
	Alone atomic.Uint64
	// Busy counts deliveries a batch handed back because another
	// transaction held their key or order.
	Busy atomic.Uint64
	// Retried counts deliveries decided again alone after their batch
	// failed.
	Retried atomic.Uint64
}

// member is one delivery waiting for its batch. Its fields are its own
// (RawBody copied): the caller may give up at its deadline and reuse its
// bytes while the batch still runs.
type member struct {
	n   Notification
	ctx context.Context
	out chan answer // buffered: the batch never waits for the caller
}

type answer struct {
	res Result
	err error
}

func newGroup(s *Store, cfg Config) *group {
	return &group{s: s, slots: cfg.GroupBatches, size: cfg.GroupSize,
		lockTimeout: strconv.FormatInt(max(cfg.GroupLockTimeout.Milliseconds(), 1), 10),
		linger:      cfg.GroupLinger}
}

// process queues n and waits for its decision or ctx's end, whichever
// comes first: it returns by ctx's deadline whatever the database does.
func (g *group) process(ctx context.Context, n Notification) (Result, error) {
	n.RawBody = bytes.Clone(textSafe(n.RawBody))
	m := &member{n: n, ctx: ctx, out: make(chan answer, 1)}
	g.submit(m)
	select {
	case a := <-m.out:
		return a.res, a.err
	case <-ctx.Done():
		return Result{}, wrap(ctx, "process "+n.BizKey, ctx.Err())
	}
}

func (g *group) submit(m *member) {
	g.mu.Lock()
	if len(g.queue) >= g.size {
		// A run may hold its slot long (a commit waiting for its standby,
		// up to CommitWait): members whose callers have gone leave the
		// queue here too, not only when a batch is taken, so that it
		// stays as long as the callers still waiting.
		g.queue = slices.DeleteFunc(g.queue, func(q *member) bool { return q.ctx.Err() != nil })
	}
	g.queue = append(g.queue, m)
	if g.inFlight == g.slots || g.inFlight > g.lones {
		if l := g.waiting; l != nil && len(g.queue) >= l.want {
			g.waiting = nil
			l.wake <- struct{}{} // buffered, and sent once
		}
		g.mu.Unlock()
		return // the batch in flight (or lingering) takes it when it ends
	}
	g.inFlight++
	batch := g.take()
	if len(batch) == 1 {
		g.lones++
	}
	g.mu.Unlock()
	go g.run(batch)
}

// run decides batch, then whatever queued meanwhile, until nothing waits.
func (g *group) run(batch []*member) {
	for {
		g.decide(batch)
		g.mu.Lock()
		if len(batch) == 1 {
			g.lones--
		}
		ended := len(batch)
		batch = g.take()
		if len(batch) == 0 && ended > 1 && g.linger > 0 && g.waiting == nil {
			batch = g.gather(min(ended, g.size))
		}
		if len(batch) == 0 {
			g.inFlight--
			g.mu.Unlock()
			return
		}
		if len(batch) == 1 {
			g.lones++
		}
		g.mu.Unlock()
	}
}

// lingering is a run waiting for the next batch's deliveries.
type lingering struct {
	want int           // how many queued end the wait
	wake chan struct{} // buffered: submit never waits for the run
}

// gather (g.mu held, released while it waits) waits up to g.linger for
// want deliveries to queue, then takes them, or whatever queued by then.
func (g *group) gather(want int) []*member {
	l := &lingering{want: want, wake: make(chan struct{}, 1)}
	g.waiting = l
	g.mu.Unlock()
	t := time.NewTimer(g.linger)
	select {
	case <-l.wake:
	case <-t.C:
	}
	t.Stop()
	g.mu.Lock()
	if g.waiting == l { // timed out: nobody woke it
		g.waiting = nil
	}
	return g.take()
}

// take removes the next batch from the queue (g.mu held): up to size
// members, never two of one key or one order (those wait for the next
// batch), none whose caller has given up.
func (g *group) take() []*member {
	var batch []*member
	keep := g.queue[:0]
	for _, m := range g.queue {
		if m.ctx.Err() != nil {
			continue // its caller has returned
		}
		if len(batch) == g.size || slices.ContainsFunc(batch, func(b *member) bool {
			return b.n.BizKey == m.n.BizKey || b.n.OrderNo == m.n.OrderNo
		}) {
			keep = append(keep, m)
			continue
		}
		batch = append(batch, m)
	}
	clear(g.queue[len(keep):])
	g.queue = keep
	return batch
}

// decide runs one batch and answers its members. A lone member takes the
// one-at-a-time statement: nothing to share, and it is the cheaper one.
func (g *group) decide(batch []*member) {
	if len(batch) == 1 {
		g.alone(batch[0])
		return
	}
	// The global lock order: keys sorted; the function sorts the orders.
	slices.SortFunc(batch, func(a, b *member) int { return strings.Compare(a.n.BizKey, b.n.BizKey) })
	ctx, cancel := batchContext(batch)
	defer cancel()
	ctx, span := batchSpan(ctx, batch)
	results, busy, err := g.s.processBatch(ctx, batch)
	endBatchSpan(span, len(batch), busy, err)
	if err != nil {
		// Nothing of the batch committed, or its fate is unknown: each
		// member is decided again alone (a committed one then replays).
		g.stats.Retried.Add(uint64(len(batch)))
		for _, m := range batch {
			go g.alone(m)
		}
		return
	}
	g.stats.Batches.Add(1)
	applied := false
	for i, m := range batch {
		if busy[i] {
			continue
		}
		g.stats.Batched.Add(1)
		applied = applied || results[i].err == nil && results[i].res.Outcome == Applied
		m.out <- results[i]
	}
	if applied {
		g.s.poke()
	}
	for i, m := range batch {
		if busy[i] {
			g.stats.Busy.Add(1)
			go g.alone(m) // it waits for its lock there, holding no batch
		}
	}
}

// alone decides m in a transaction of its own.
func (g *group) alone(m *member) {
	g.stats.Alone.Add(1)
	res, err := g.s.processOn(m.ctx, g.s.pool, &m.n)
	if err == nil && res.Outcome == Applied {
		g.s.poke()
	}
	m.out <- answer{res: res, err: err}
}

// batchContext ends when the last member's deadline passes: a member whose
// deadline came earlier has had its answer (the caller's own deadline) and
// the rest still want theirs. It bounds the wait for a connection; the
// statement itself runs through Store.commit, past it if its commit waits
// for a standby.
func batchContext(batch []*member) (context.Context, context.CancelFunc) {
	var last time.Time
	for _, m := range batch {
		d, ok := m.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.Background())
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(context.Background(), last)
}

// processBatch runs one batch in one statement (one transaction) and
// returns each member's answer, with busy[i] for a member the batch did not
// decide. err means the batch did not commit (or its fate is unknown): no
// answer may be given from it.
func (s *Store) processBatch(ctx context.Context, batch []*member) ([]answer, []bool, error) {
	n := len(batch)
	keys, orders, hashes, bodies := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	events, currencies, trades, refundIDs := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	amounts, refundAmounts := make([]int64, n), make([]int64, n)
	cumulative := make([]bool, n)
	for i, m := range batch {
		keys[i], orders[i], hashes[i], bodies[i] = m.n.BizKey, m.n.OrderNo, m.n.Digest, string(m.n.RawBody)
		events[i], currencies[i], trades[i], refundIDs[i] = string(m.n.Event), m.n.Currency, m.n.Trade, m.n.RefundID
		amounts[i], refundAmounts[i], cumulative[i] = m.n.Amount, m.n.RefundAmount, m.n.Cumulative
	}
	sql, args := sqlProcessBatch, []any{keys, orders, hashes, bodies, events,
		amounts, currencies, trades, refundIDs, refundAmounts, cumulative, s.group.lockTimeout}
	if tps := traceparents(batch); tps != nil {
		sql, args = sqlProcessBatchTraced, append(args, tps)
	}
	results := make([]answer, n)
	busy := make([]bool, n)
	seen := 0
	err := s.commit(ctx, s.pool, func(ctx context.Context, conn *pgxpool.Conn) error {
		rows, err := conn.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var idx int32
			var outcome, status, result, review *string
			var position int64
			if err := rows.Scan(&idx, &outcome, &status, &result, &review, &position); err != nil {
				return err
			}
			i := int(idx) - 1
			if i < 0 || i >= n {
				return fmt.Errorf("member %d of %d", idx, n)
			}
			seen++
			if outcome != nil && *outcome == busyOutcome {
				busy[i] = true
				continue
			}
			res, err := decodeDecision(keys[i], outcome, status, result, review)
			res.Position = uint64(position)
			results[i] = answer{res: res, err: err}
		}
		// rows.Err is only known once the statement's transaction has
		// ended: answers are given after the commit, never before.
		rows.Close()
		return rows.Err()
	})
	if err != nil {
		return nil, nil, wrap(ctx, "process batch", err)
	}
	if seen != n {
		return nil, nil, fmt.Errorf("process batch: %d answers for %d members", seen, n)
	}
	return results, busy, nil
}

// traceparents is the batch's members' traceparents, in order, or nil
// when none is sampled.
func traceparents(batch []*member) []string {
	var tps []string
	for i, m := range batch {
		if m.n.Traceparent == "" {
			continue
		}
		if tps == nil {
			tps = make([]string, len(batch))
		}
		tps[i] = m.n.Traceparent
	}
	return tps
}

// sqlProcessBatchTraced is sqlProcessBatch for a batch with sampled
// callbacks: the same decisions, and the traceparents ($13) of the members
// that applied kept in notify_trace by the same statement (after the
// batch's function, from its answers: a busy member, decided again alone,
// writes its own).
var sqlProcessBatchTraced = `WITH d AS MATERIALIZED (
` + sqlProcessBatch + `
), tr AS (
  INSERT INTO notify_trace (biz_key, traceparent)
  SELECT ($1::text[])[d.o_idx], ($13::text[])[d.o_idx] FROM d
   WHERE d.o_outcome = 'applied' AND ($13::text[])[d.o_idx] <> ''
  ON CONFLICT DO NOTHING)
SELECT * FROM d`

// busyOutcome is the batch's answer for a member whose key or order another
// transaction held.
const busyOutcome = "busy"

// sqlProcessBatch calls notifyedge_process_batch with every channel event's
// rules as constants (see processSQL for why constants).
var sqlProcessBatch = buildBatchSQL()

func buildBatchSQL() string {
	var evs, lo, hi, partial, adopt []string
	var from, party, act, to, topic, review []string
	for _, e := range Events {
		if _, ok := ParseChannelEvent([]byte(e)); !ok {
			continue
		}
		r := eventRules[e]
		evs = append(evs, string(e))
		lo = append(lo, strconv.Itoa(len(from)+1))
		from = append(from, r.from...)
		party = append(party, r.party...)
		act = append(act, r.act...)
		to = append(to, r.to...)
		topic = append(topic, r.topic...)
		review = append(review, r.review...)
		hi = append(hi, strconv.Itoa(len(from)))
		partial = append(partial, r.partial)
		adopt = append(adopt, strconv.FormatBool(r.adopt))
	}
	return `SELECT o_idx, o_outcome, o_status, o_result, o_review, ` + sqlPosition + ` AS o_position
  FROM notifyedge_process_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,
       ` + strings.Join([]string{sqlTextArray(evs),
		"ARRAY[" + strings.Join(lo, ", ") + "]::int[]", "ARRAY[" + strings.Join(hi, ", ") + "]::int[]",
		sqlTextArray(from), sqlTextArray(party), sqlTextArray(act), sqlTextArray(to), sqlTextArray(topic),
		sqlTextArray(review), sqlTextArray(partial),
		"ARRAY[" + strings.Join(adopt, ", ") + "]::boolean[]"}, ",\n       ") + `)`
}
