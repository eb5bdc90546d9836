package claimcache

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// pipe sends the calls that arrive while others are in flight to Redis
// together, in one pipeline: under load the claims of concurrent first
// deliveries, and the completions of those answered before them, share one
// write and one read, for this process and for Redis, instead of costing a
// round trip each. Profiling the first-delivery path showed the claim's own
// round trip as a quarter of the node's CPU, mostly syscalls.
//
// Batching is natural, as in the durable store's group commit: a call that
// finds nothing in flight goes at once with whatever waits (alone, it waits
// for nothing and is a plain command); behind a pipeline in flight, the
// second slot is taken as soon as two calls wait (a lone call there waits
// for the pipeline's end: one round trip at most, and without it most calls
// under load went alone); while every slot is busy, calls queue, and the
// pipeline that ends next takes them, up to pipeMax. No timer ever holds a
// call back. Completions (carry) are riders instead: no answer waits for
// them, so they wait up to carryWait for the next calls and go in their
// pipeline. Each call still answers to its own node's breaker (the caller
// asks it before, and feeds it after), and go-redis's call timeouts bound a
// pipeline as they bound a single command.
type pipe struct {
	client Client
	slots  int

	mu       sync.Mutex
	queue    []*op // calls a caller waits for
	riders   []*op // completions: they go with the next calls
	flush    bool  // riders have waited carryWait: send them alone
	inFlight int

	carryWait time.Duration
}

// pipeSlots is how many pipelines may be in flight at once; pipeMax caps
// the calls one carries.
// carryWait is how long a completion waits for calls to ride along with.
const (
	pipeSlots = 2
	pipeMax   = 128
	carryWait = 2 * time.Millisecond
)

// opKind is what an op sends.
type opKind uint8

const (
	// opClaim: SET key value NX GET PX ttl.
	opClaim opKind = iota + 1
	// opSet: SET key value PX ttl.
	opSet
)

// op is one call through the pipe. The caller owns it until done is
// signalled; a caller that gives up before (its context ended, or it waited
// its limit) leaves it to the pipe and never reuses it.
type op struct {
	kind opKind
	rk   string
	val  []byte // owned by the op: a pipeline holds its arguments until sent
	ttl  time.Duration

	reply string
	err   error // redis.Nil: a claim found no old value (it set its own)
	done  chan struct{}
}

var ops = sync.Pool{New: func() any { return &op{val: make([]byte, 0, 128), done: make(chan struct{}, 1)} }}

func getOp(kind opKind, rk string, ttl time.Duration) *op {
	o := ops.Get().(*op)
	o.kind, o.rk, o.ttl, o.val = kind, rk, ttl, o.val[:0]
	return o
}

func putOp(o *op) {
	o.rk, o.reply, o.err = "", "", nil
	ops.Put(o)
}

func newPipe(c Client) *pipe { return &pipe{client: c, slots: pipeSlots, carryWait: carryWait} }

// do sends os (in one pipeline when they fit, with whatever else waits) and
// waits until each has its answer, ctx ends, or limit passes (a Redis too
// slow to serve its queue must not spend a request's budget). It reports
// whether every op was answered: when not, the caller must not reuse the
// ops.
func (p *pipe) do(ctx context.Context, limit time.Duration, os ...*op) bool {
	p.mu.Lock()
	p.queue = append(p.queue, os...)
	if p.inFlight == p.slots || p.inFlight > 0 && len(p.queue) < 2 {
		p.mu.Unlock() // the next batch to end takes them
	} else {
		p.lead()
	}
	var late <-chan time.Time
	for _, o := range os {
		select {
		case <-o.done:
			continue
		default:
		}
		if late == nil {
			t := time.NewTimer(limit)
			defer t.Stop()
			late = t.C
		}
		select {
		case <-o.done:
		case <-ctx.Done():
			return false
		case <-late:
			return false
		}
	}
	return true
}

// carry sends os with the next calls that go, or on their own once they
// waited carryWait (or enough of them wait to fill a pipeline), and waits
// until each has its answer or ctx ends; it reports as do does. It is for
// completions: no answer waits for them, so instead of a round trip of
// their own they ride in the pipeline of the next claims.
func (p *pipe) carry(ctx context.Context, os ...*op) bool {
	p.mu.Lock()
	p.riders = append(p.riders, os...)
	full := len(p.riders) >= pipeMax
	p.mu.Unlock()
	if full {
		p.kick()
	}
	t := time.NewTimer(p.carryWait)
	defer t.Stop()
	for _, o := range os {
	wait:
		for {
			select {
			case <-o.done:
				break wait
			case <-ctx.Done():
				return false
			case <-t.C: // fires once
				p.kick()
			}
		}
	}
	return true
}

// kick has the riders sent now: in a free slot, or by the pipeline in
// flight when it ends.
func (p *pipe) kick() {
	p.mu.Lock()
	if len(p.riders) == 0 {
		p.mu.Unlock()
		return
	}
	p.flush = true
	if p.inFlight == p.slots {
		p.mu.Unlock()
		return
	}
	p.lead()
}

// lead takes a free slot (p.mu held, and released here), sends the next
// batch on the caller's goroutine, then hands on what queued meanwhile.
func (p *pipe) lead() {
	p.inFlight++
	batch := p.take()
	p.mu.Unlock()
	p.send(batch)
	p.next()
}

// next hands what queued meanwhile to a runner of its own, keeping the
// slot, or frees the slot.
func (p *pipe) next() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if batch := p.take(); len(batch) > 0 {
		go p.run(batch)
		return
	}
	p.inFlight--
}

// run sends batch, then whatever queued meanwhile, until nothing waits.
func (p *pipe) run(batch []*op) {
	for len(batch) > 0 {
		p.send(batch)
		p.mu.Lock()
		batch = p.take()
		if len(batch) == 0 {
			p.inFlight--
		}
		p.mu.Unlock()
	}
}

// take removes the next batch (p.mu held): the waiting calls, up to
// pipeMax, with riders in the room left; riders alone only once flushed.
func (p *pipe) take() []*op {
	n := min(len(p.queue), pipeMax)
	if n == 0 && !p.flush {
		return nil
	}
	r := min(len(p.riders), pipeMax-n)
	if n+r == 0 {
		p.flush = false
		return nil
	}
	batch := make([]*op, 0, n+r)
	batch = append(batch, p.queue[:n]...)
	batch = append(batch, p.riders[:r]...)
	p.queue = shift(p.queue, n)
	p.riders = shift(p.riders, r)
	if len(p.riders) == 0 {
		p.flush = false
	}
	return batch
}

// shift drops the first n of q, keeping its array.
func shift(q []*op, n int) []*op {
	rest := copy(q, q[n:])
	clear(q[rest:])
	return q[:rest]
}

// send runs batch against Redis and signals each op.
func (p *pipe) send(batch []*op) {
	ctx := context.Background() // the client's call timeouts bound it
	if len(batch) == 1 {
		o := batch[0]
		o.reply, o.err = p.command(ctx, p.client, o).Result()
		o.done <- struct{}{}
		return
	}
	cmds := make([]*redis.StatusCmd, len(batch))
	_, _ = p.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i, o := range batch {
			cmds[i] = p.command(ctx, pl, o)
		}
		return nil
	})
	for i, o := range batch {
		o.reply, o.err = cmds[i].Result()
		o.done <- struct{}{}
	}
}

// setter is a client or a pipeline: what an op's command is queued on.
type setter interface {
	SetArgs(ctx context.Context, key string, value any, a redis.SetArgs) *redis.StatusCmd
}

func (p *pipe) command(ctx context.Context, s setter, o *op) *redis.StatusCmd {
	if o.kind == opClaim {
		return s.SetArgs(ctx, o.rk, o.val, redis.SetArgs{Mode: "NX", Get: true, TTL: o.ttl})
	}
	return s.SetArgs(ctx, o.rk, o.val, redis.SetArgs{TTL: o.ttl})
}
