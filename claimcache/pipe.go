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
// finds a slot free goes at once with whatever waits (alone, it waits for
// nothing and is a plain command); while every slot is busy, calls queue,
// and the batch that ends next takes them, up to pipeMax. No timer ever
// holds a call back. Each call still answers to its own node's breaker
// (the caller asks it before, and feeds it after), and go-redis's call
// timeouts bound a pipeline as they bound a single command.
type pipe struct {
	client Client
	slots  int

	mu       sync.Mutex
	queue    []*op
	inFlight int
}

// pipeSlots is how many pipelines may be in flight at once; pipeMax caps
// the calls one carries.
const (
	pipeSlots = 2
	pipeMax   = 128
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
// signalled; a caller that gives up before (its context ended) leaves it to
// the pipe and never reuses it.
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

func newPipe(c Client) *pipe { return &pipe{client: c, slots: pipeSlots} }

// do sends os (in one pipeline when they fit, with whatever else waits) and
// waits until each has its answer or ctx ends. It reports whether every op
// was answered: when not, the caller must not reuse the ops.
func (p *pipe) do(ctx context.Context, os ...*op) bool {
	p.mu.Lock()
	p.queue = append(p.queue, os...)
	if p.inFlight == p.slots {
		p.mu.Unlock() // the next batch to end takes them
	} else {
		p.inFlight++
		batch := p.take()
		p.mu.Unlock()
		p.send(batch)
		p.next()
	}
	for _, o := range os {
		select {
		case <-o.done:
		case <-ctx.Done():
			return false
		}
	}
	return true
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

// take removes the next batch from the queue (p.mu held).
func (p *pipe) take() []*op {
	n := min(len(p.queue), pipeMax)
	if n == 0 {
		return nil
	}
	batch := make([]*op, n)
	copy(batch, p.queue)
	rest := copy(p.queue, p.queue[n:])
	clear(p.queue[rest:])
	p.queue = p.queue[:rest]
	return batch
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
