package edge

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/trace"

	"github.com/notifyedge/notifyedge/claimcache"
)

// cacheCleanup runs the cache's Complete and Abort after the answer, never
// before it: they are bookkeeping for later duplicates, and a Redis that
// hangs at the wrong moment must not hold an answer past its budget. Each
// call is bounded by the cache client's own call timeout. When the queue is
// full a job is dropped: a lost Abort leaves a pending entry that its short
// TTL removes, a lost Complete sends the next duplicate to Postgres, which
// answers it and fills the cache again. Both are correct, only slower.
type cacheCleanup struct {
	cache  Cache
	tracer trace.Tracer // nil: tracing off
	jobs   chan *cleanupJob
	free   sync.Pool
	wg     sync.WaitGroup
	once   sync.Once
}

// cleanupJob is one Complete (response set) or Abort, with its own copies
// of the request-scoped bytes.
type cleanupJob struct {
	key      []byte
	digest   claimcache.Digest
	token    claimcache.Token
	response []byte
	complete bool
	owned    bool   // the request won the claim (claimcache.Completion.Owned)
	epoch    uint64 // the cache epoch it won it under
	position uint64 // the database's position with the answer (durable.Result.Position)
	// span is the request's server span when it is sampled (zero
	// otherwise): the completion's span links it.
	span trace.SpanContext
}

// cleanupWorkers run the calls; cleanupQueue bounds what waits for them;
// cleanupBatch caps the completions one pipeline carries.
const (
	cleanupWorkers = 4
	cleanupQueue   = 4096
	cleanupBatch   = 64
)

func newCacheCleanup(c Cache, tracer trace.Tracer) *cacheCleanup {
	cc := &cacheCleanup{cache: c, tracer: tracer, jobs: make(chan *cleanupJob, cleanupQueue)}
	cc.free.New = func() any { return new(cleanupJob) }
	for range cleanupWorkers {
		cc.wg.Add(1)
		go cc.run()
	}
	return cc
}

func (cc *cacheCleanup) run() {
	defer cc.wg.Done()
	batch := make([]*cleanupJob, 0, cleanupBatch)
	completions := make([]claimcache.Completion, 0, cleanupBatch)
	for j := range cc.jobs {
		batch = cc.drain(append(batch[:0], j))
		completions = completions[:0]
		for _, j := range batch {
			if j.complete {
				completions = append(completions, claimcache.Completion{Key: j.key, Digest: j.digest, Response: j.response, Owned: j.owned, Epoch: j.epoch,
					Position: j.position})
			} else {
				_ = cc.cache.Abort(context.Background(), j.key, j.digest, j.token)
			}
		}
		if len(completions) > 0 {
			// What queued meanwhile goes in one round trip.
			ctx, span := cc.completeSpan(batch)
			err := cc.cache.CompleteMany(ctx, completions)
			endChild(span, err != nil)
		}
		clear(completions) // the jobs go back to the pool: drop their bytes
		for _, j := range batch {
			cc.free.Put(j)
		}
	}
}

// completeSpan starts the span of a round trip of completions when any of
// them is a sampled callback's: a child of the first one's server span,
// linking every one's. Otherwise (tracing off included) it starts nothing.
func (cc *cacheCleanup) completeSpan(batch []*cleanupJob) (context.Context, trace.Span) {
	if cc.tracer == nil {
		return context.Background(), nil
	}
	var first trace.SpanContext
	var links []trace.Link
	for _, j := range batch {
		if j.complete && j.span.IsSampled() {
			if !first.IsValid() {
				first = j.span
			}
			links = append(links, trace.Link{SpanContext: j.span})
		}
	}
	if links == nil {
		return context.Background(), nil
	}
	return cc.tracer.Start(trace.ContextWithSpanContext(context.Background(), first), "cache complete", trace.WithLinks(links...))
}

// drain adds to batch the jobs already queued, up to cleanupBatch.
func (cc *cacheCleanup) drain(batch []*cleanupJob) []*cleanupJob {
	for len(batch) < cleanupBatch {
		select {
		case j, ok := <-cc.jobs:
			if !ok {
				return batch
			}
			batch = append(batch, j)
		default:
			return batch
		}
	}
	return batch
}

// complete queues a Complete of key with response (both copied); owned
// says the request won the key's claim, under epoch; position is the
// database's with the answer; span is the request's server span if it is
// sampled.
func (cc *cacheCleanup) complete(key []byte, d claimcache.Digest, response []byte, owned bool, epoch, position uint64, span trace.SpanContext) {
	j := cc.free.Get().(*cleanupJob)
	j.key, j.digest, j.complete, j.owned, j.epoch, j.span = append(j.key[:0], key...), d, true, owned, epoch, span
	j.position = position
	j.response = append(j.response[:0], response...)
	cc.enqueue(j)
}

// abort queues an Abort of the pending claim key/token (key copied).
func (cc *cacheCleanup) abort(key []byte, d claimcache.Digest, t claimcache.Token) {
	j := cc.free.Get().(*cleanupJob)
	j.key, j.digest, j.token, j.complete, j.owned, j.span = append(j.key[:0], key...), d, t, false, false, trace.SpanContext{}
	cc.enqueue(j)
}

func (cc *cacheCleanup) enqueue(j *cleanupJob) {
	select {
	case cc.jobs <- j:
	default:
		cc.free.Put(j) // full: see the type's comment
	}
}

// close stops taking jobs and waits for the queued ones until ctx ends.
// Nothing may enqueue after it.
func (cc *cacheCleanup) close(ctx context.Context) {
	cc.once.Do(func() { close(cc.jobs) })
	done := make(chan struct{})
	go func() { cc.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
