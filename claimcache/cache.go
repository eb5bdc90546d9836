package claimcache

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Config configures a Cache. Zero fields take the defaults noted.
type Config struct {
	// Client talks to Redis (required). Build it with NewClient: go-redis's
	// defaults take seconds against a dead server.
	Client Client
	// PendingTTL bounds how long a crashed owner's claim blocks others
	// (default 200ms, the latency budget).
	PendingTTL time.Duration
	// ResultTTL is how long a done entry answers duplicates (default 24h).
	ResultTTL time.Duration
	// WaitBudget bounds Wait (default 50ms), and how long a call waits for
	// its turn in a pipeline (ErrSlow); after it, Postgres answers.
	WaitBudget time.Duration
	// BreakerFailures consecutive errors open the breaker (default 5);
	// BreakerCooldown later a probe may close it (default 1s).
	BreakerFailures int
	BreakerCooldown time.Duration
	// Now is the clock the breakers' cooldowns and the local table's TTL
	// run on (default time.Now): a test steps a clock of its own through
	// them instead of sleeping.
	Now func() time.Time
	// LocalEntries, when > 0, keeps that many done entries in this process
	// as well and answers their duplicates without a Redis round trip
	// (about 350 bytes each). A done entry never changes, so the copy is
	// always the first answer; LocalTTL (default min(ResultTTL, 10m)) bounds
	// how long it is kept.
	LocalEntries int
	LocalTTL     time.Duration
	// Epoch, when set, names the database the entries mirror (Postgres is
	// the authority; durable.Store.CacheEpoch): it is part of every Redis
	// key, "ne:<epoch>:{<biz_key>}", so that entries written against a
	// database that has since been restored, promoted or repaired by hand
	// never answer for its successor. New reads it once; then it is read
	// about once a second in the background (requests only load it
	// atomically), and when it changes the local table is emptied and new
	// keys carry the new epoch (the old entries expire by their TTL). A
	// failed read keeps the last epoch and goes to OnError (wrapping
	// ErrEpoch); until a first read succeeds, every call returns
	// ErrNoEpoch. nil: no epoch, keys are "ne:{<biz_key>}". An epoch may not
	// hold braces (they would move the cluster hash tag). Call Close to
	// stop the reads.
	Epoch func(ctx context.Context) (string, error)
	// OnEpoch is called with the epoch when the cache first knows it and
	// whenever it changes (for a log line).
	OnEpoch func(epoch string)
	// Position, when set with Epoch, reads how far the database the epoch
	// names has written (durable.Store.CachePosition: its flushed WAL
	// position, which only a restore takes back). CompleteMany then raises
	// the epoch's watermark in Redis, before it writes a done entry, to the
	// completions' positions (Completion.Position), reading this one only
	// for a completion that carries none; and every epoch read checks the
	// database against the watermark: one behind it (restored from a
	// snapshot or a base backup, which keep the epoch) gets the epoch
	// OnBehind returns. It costs a completion batch a Redis call when the
	// position moved; nothing else.
	Position func(ctx context.Context) (uint64, error)
	// OnBehind is called when the database is at pos, behind epoch's
	// watermark mark, and returns the epoch to run under instead, never one
	// used before (durable.Store.BumpCacheEpochFrom). Required with
	// Position. Until it succeeds, the cache answers nothing (every call
	// returns ErrNoEpoch) and the next epoch read tries again.
	OnBehind func(ctx context.Context, epoch string, pos, mark uint64) (string, error)
	// OnError is called with every Redis error or timeout, and every failed
	// read of the epoch (for a metric).
	OnError func(error)
	// OnBreaker is called when a breaker opens (true) or closes (false).
	// node is "" for a single Redis; on a Redis Cluster each master has a
	// breaker of its own, named by its address (a breaker of "" then stands
	// for calls made while no master was known).
	OnBreaker func(node string, open bool)
}

// Cache is the claim-and-result cache. It is safe for concurrent use.
type Cache struct {
	client     Client
	pendingTTL time.Duration
	resultTTL  time.Duration
	resultMS   string
	waitBudget time.Duration
	onError    func(error)
	breakers   *nodeBreakers
	pipe       *pipe   // claims and owned completions, batched
	local      *local  // nil: off
	node       [8]byte // random per process: owner tokens are node + counter
	seq        atomic.Uint64

	// The cache epoch: nil until known (then calls return ErrNoEpoch).
	epoch       atomic.Pointer[epochState]
	epochMu     sync.Mutex // serializes switches
	epochFn     func(context.Context) (string, error)
	onEpoch     func(string)
	gens        uint64             // the epochs switched to so far (under epochMu)
	marker      *marker            // nil: no watermark
	stopRefresh context.CancelFunc // nil without Config.Epoch
	refreshDone chan struct{}
	closeOnce   sync.Once

	// The readiness probe: a PING at most once a second, so that /readyz
	// tells a dead Redis before traffic trips the breaker.
	probedAt atomic.Int64 // unix nanos of the last probe
	probeBad atomic.Bool  // the last probe failed
}

// probeEvery is how often State may PING Redis; probeTimeout bounds a PING.
const (
	probeEvery   = time.Second
	probeTimeout = 100 * time.Millisecond
)

// New returns a Cache for cfg. With Config.Epoch it reads the epoch once
// (for at most a second) and starts reading it in the background: Close
// the cache when done.
func New(cfg Config) (*Cache, error) {
	if cfg.Client == nil {
		return nil, errors.New("claimcache: no Client")
	}
	c := &Cache{
		client:     cfg.Client,
		pendingTTL: cmp.Or(cfg.PendingTTL, 200*time.Millisecond),
		resultTTL:  cmp.Or(cfg.ResultTTL, 24*time.Hour),
		waitBudget: cmp.Or(cfg.WaitBudget, 50*time.Millisecond),
		onError:    cfg.OnError,
	}
	threshold, cooldown := cmp.Or(cfg.BreakerFailures, 5), cmp.Or(cfg.BreakerCooldown, time.Second)
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	c.breakers = newNodeBreakers(cfg.Client, func(node string) *breaker {
		var onChange func(bool)
		if cfg.OnBreaker != nil {
			onChange = func(open bool) { cfg.OnBreaker(node, open) }
		}
		return newBreaker(threshold, cooldown, now, onChange)
	})
	if c.pendingTTL < time.Millisecond || c.resultTTL < time.Millisecond {
		return nil, errors.New("claimcache: TTLs must be at least 1ms")
	}
	c.resultMS = strconv.FormatInt(c.resultTTL.Milliseconds(), 10)
	c.pipe = newPipe(cfg.Client)
	if cfg.LocalEntries > 0 {
		c.local = newLocal(cfg.LocalEntries, min(cmp.Or(cfg.LocalTTL, 10*time.Minute), c.resultTTL), now)
	}
	if _, err := rand.Read(c.node[:]); err != nil {
		return nil, fmt.Errorf("claimcache: node id: %w", err)
	}
	if cfg.Epoch == nil {
		c.epoch.Store(noEpoch)
		return c, nil
	}
	c.epochFn, c.onEpoch = cfg.Epoch, cfg.OnEpoch
	if cfg.Position != nil {
		if cfg.OnBehind == nil {
			return nil, errors.New("claimcache: Position without OnBehind")
		}
		c.marker = &marker{position: cfg.Position, onBehind: cfg.OnBehind}
	}
	ctx, stop := context.WithCancel(context.Background())
	c.stopRefresh, c.refreshDone = stop, make(chan struct{})
	_ = c.readEpoch(ctx) // a failure went to OnError; the refresher tries again
	go c.refreshEpoch(ctx)
	return c, nil
}

// Claim claims key for a delivery with digest d, or finds what is there, in
// one round trip (SET NX GET). key is read during the call only.
func (c *Cache) Claim(ctx context.Context, key []byte, d Digest) (Result, error) {
	st, err := c.state()
	if err != nil {
		return Result{}, fmt.Errorf("claim: %w", err)
	}
	if c.local != nil {
		if e, ok := c.local.get(key, st.gen); ok {
			if e.digest == d {
				return Result{Verdict: Done, Response: e.response}, nil
			}
			return Result{Verdict: Mismatch}, nil // a done entry never changes
		}
	}
	tok := c.newToken()
	rk := st.key(key)
	var old string
	var found bool
	err = c.call(ctx, rk, func() error {
		o := getOp(opClaim, rk, c.pendingTTL)
		o.val = pendingValue(o.val, d, tok)
		if !c.pipe.do(ctx, c.waitBudget, o) {
			// The op stays the pipe's. A call given up on is a failed
			// call, as its timeout was: the breaker hears it (and a
			// half-open probe ends).
			return cmp.Or(ctx.Err(), ErrSlow)
		}
		v, err := o.reply, o.err
		putOp(o)
		if err == nil {
			old, found = v, true
		}
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("claim: %w", err)
	}
	if !found {
		return Result{Verdict: Won, Token: tok, Epoch: st.gen}, nil
	}
	r := classify(old, d)
	if r.Verdict == Busy && old[headerSize:] == string(tok[:]) {
		return Result{Verdict: Won, Token: tok, Epoch: st.gen}, nil // our own write, seen again
	}
	if r.Verdict == Done && c.local != nil {
		c.local.put(key, st.gen, d, r.Response)
	}
	return r, nil
}

// Wait polls a Busy key (1 ms, doubling, within WaitBudget and ctx) until
// the owner's result is there (Done), another digest is (Mismatch), or the
// owner is gone or slow (Busy: go to Postgres, which blocks on its unique
// index and replays).
func (c *Cache) Wait(ctx context.Context, key []byte, d Digest) (Result, error) {
	st, err := c.state()
	if err != nil {
		return Result{}, fmt.Errorf("wait: %w", err)
	}
	deadline := time.Now().Add(c.waitBudget)
	rk := st.key(key)
	for pause := time.Millisecond; ; pause = min(2*pause, 16*time.Millisecond) {
		if time.Until(deadline) < pause {
			return Result{Verdict: Busy}, nil
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return Result{Verdict: Busy}, nil
		case <-t.C:
		}
		var v string
		var found bool
		err := c.call(ctx, rk, func() error {
			s, err := c.client.Get(ctx, rk).Result()
			v, found = s, err == nil
			return err
		})
		if err != nil {
			return Result{}, fmt.Errorf("wait: %w", err)
		}
		if !found {
			return Result{Verdict: Busy}, nil // the owner aborted or expired
		}
		if r := classify(v, d); r.Verdict != Busy {
			return r, nil
		}
	}
}

// Completion is one key's answer for CompleteMany.
type Completion struct {
	Key      []byte
	Digest   Digest
	Response []byte
	// Owned says the caller won the key's claim: the entry is its own
	// pending one, unless the pending TTL passed. Its answer is then written
	// with a plain SET, which costs Redis a fraction of the check-and-set
	// script. Overwriting is safe there: besides its own pending entry, the
	// only entry it can meet is one written after that TTL by the next
	// claimant, whose done entry holds the same committed answer (Postgres
	// replays its first result to every duplicate). It counts only under
	// the epoch the claim was won under (Epoch, from Result.Epoch): after
	// a change the key is another, whose entry the script guards.
	Owned bool
	Epoch uint64
	// Position is how far the database had written when it decided or
	// read the answer (durable.Result.Position), for the watermark
	// (Config.Position); 0: unknown, and CompleteMany reads the database's
	// position itself.
	Position uint64
}

// CompleteMany stores each of cs as its key's answer, unless a done entry
// exists (the first answer is never replaced), in one round trip (a
// pipeline); call it only after Postgres committed a DONE result for each.
// The completions that pile up under load cost Redis and the
// node one exchange instead of one each, and owned ones (Completion.Owned)
// share it with concurrent claims. cs is read during the call only.
// An error means some may not be written (each is then what a lost
// Complete is: the next duplicate goes to Postgres).
func (c *Cache) CompleteMany(ctx context.Context, cs []Completion) error {
	called := time.Now()
	st, err := c.state()
	if err != nil {
		return fmt.Errorf("complete: %w", err)
	}
	if c.marker != nil && len(cs) > 0 {
		// No entry in Redis ahead of its watermark: nothing is written
		// unless it was raised.
		if err := c.raise(ctx, st, called, cs); err != nil {
			return fmt.Errorf("complete: %w", err)
		}
	}
	// Each completion goes to its key's node and answers to that node's
	// breaker: one whose breaker is open is skipped (a lost Complete).
	type ownedCall struct {
		o *op
		b *breaker
		i int // in cs
	}
	var first error
	var owned []ownedCall
	var scripted []int
	for i := range cs {
		if !cs[i].Owned || cs[i].Epoch != st.gen {
			scripted = append(scripted, i)
			continue
		}
		rk := st.key(cs[i].Key)
		b := c.breakers.forKey(ctx, rk)
		if !b.allow() {
			first = cmp.Or(first, ErrBreakerOpen)
			continue
		}
		o := getOp(opSet, rk, c.resultTTL)
		o.val = doneValue(o.val, cs[i].Digest, cs[i].Response)
		owned = append(owned, ownedCall{o, b, i})
	}
	if len(owned) > 0 {
		ops := make([]*op, len(owned))
		for j := range owned {
			ops[j] = owned[j].o
		}
		if !c.pipe.carry(ctx, ops...) {
			for _, w := range owned {
				c.record(w.b, ctx.Err()) // given up on: a failed call (see Claim)
			}
			return fmt.Errorf("complete: %w", ctx.Err()) // the ops stay the pipe's
		}
		for _, w := range owned {
			err := w.o.err
			putOp(w.o)
			c.record(w.b, err)
			if err != nil {
				first = cmp.Or(first, err)
				continue
			}
			if c.local != nil {
				c.local.put(cs[w.i].Key, st.gen, cs[w.i].Digest, string(cs[w.i].Response))
			}
		}
	}
	if err := c.completeScripted(ctx, st, cs, scripted); err != nil {
		first = cmp.Or(first, err)
	}
	if first != nil {
		return fmt.Errorf("complete: %w", first)
	}
	return nil
}

// completeScripted runs the check-and-set script for cs[i] of each i in
// idx, in one pipeline.
func (c *Cache) completeScripted(ctx context.Context, st *epochState, cs []Completion, idx []int) error {
	if len(idx) == 0 {
		return nil
	}
	size := 0
	for _, i := range idx {
		size += 1 + len(cs[i].Digest) + len(cs[i].Response)
	}
	// One buffer for every value: a pipeline holds its arguments until it
	// is sent, so none may be reused before.
	buf := make([]byte, 0, size)
	values := make([][]byte, len(cs))
	keys := make([]string, len(cs))
	brk := make([]*breaker, len(cs))
	sent := make([]int, 0, len(idx)) // indexes of cs in the pipeline
	for _, i := range idx {
		from := len(buf)
		buf = doneValue(buf, cs[i].Digest, cs[i].Response)
		values[i] = buf[from:len(buf):len(buf)]
		keys[i] = st.key(cs[i].Key)
		brk[i] = c.breakers.forKey(ctx, keys[i])
		if brk[i].allow() {
			sent = append(sent, i)
		}
	}
	if len(sent) == 0 {
		return ErrBreakerOpen
	}
	cmds, _ := c.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, i := range sent {
			completeScript.EvalSha(ctx, p, []string{keys[i]}, values[i], c.resultMS)
		}
		return nil
	})
	var first error
	for j, i := range sent {
		err := ErrBreakerOpen // no answer for it at all
		if j < len(cmds) {
			err = cmds[j].Err()
			// A script Redis lost (restart, SCRIPT FLUSH) is loaded by
			// running it alone.
			if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				err = completeScript.Run(ctx, c.client, []string{keys[i]}, values[i], c.resultMS).Err()
			}
		}
		c.record(brk[i], err)
		if errors.Is(err, redis.Nil) {
			err = nil
		}
		if err != nil {
			first = cmp.Or(first, err)
			continue
		}
		if c.local != nil {
			c.local.put(cs[i].Key, st.gen, cs[i].Digest, string(cs[i].Response))
		}
	}
	if first == nil && len(sent) < len(idx) {
		first = ErrBreakerOpen
	}
	return first
}

// Abort deletes the key if it still holds this owner's pending entry.
func (c *Cache) Abort(ctx context.Context, key []byte, d Digest, t Token) error {
	st, err := c.state()
	if err != nil {
		return fmt.Errorf("abort: %w", err)
	}
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	*bp = pendingValue((*bp)[:0], d, t)
	rk := st.key(key)
	err = c.call(ctx, rk, func() error {
		return abortScript.Run(ctx, c.client, []string{rk}, *bp).Err()
	})
	if err != nil {
		return fmt.Errorf("abort: %w", err)
	}
	return nil
}

// State is "ok", or "degraded" while a breaker is open (on a Redis
// Cluster, any master's), Redis does not answer a PING or no epoch is known
// yet. The PING is sent at most once a second, whoever asks how often (the
// caller is a readiness probe); in between the last answer stands. On a
// cluster the same probe forgets the breakers of nodes that are no longer
// masters (a failed-over master's keys are served by its replica now).
func (c *Cache) State() string {
	now := time.Now().UnixNano()
	if last := c.probedAt.Load(); now-last >= int64(probeEvery) && c.probedAt.CompareAndSwap(last, now) {
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		err := c.client.Ping(ctx).Err()
		if err == nil {
			err = c.breakers.prune(ctx)
		}
		cancel()
		c.probeBad.Store(err != nil)
	}
	if c.breakers.anyOpen() || c.epoch.Load() == nil {
		return "degraded"
	}
	if c.probeBad.Load() {
		return "degraded"
	}
	return "ok"
}
