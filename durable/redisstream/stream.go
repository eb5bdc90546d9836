// Package redisstream is the outbox relay's Redis Streams broker: an
// outbox.Publisher that XADDs outbox rows, and the consumer loop a
// downstream service runs (consumer group, acknowledge after its own commit,
// claim what dead consumers left pending).
//
// The stream must live on a Redis that persists (appendonly yes): outbox
// rows leave Postgres's care once XADD is acknowledged (and, with
// Publisher.Replicas, once that many replicas hold the entries). The
// stream is trimmed only below the oldest id that every consumer group has
// both read and acknowledged.
package redisstream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable/outbox"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// DefaultStream is the stream name unless configured.
const DefaultStream = "notifyedge:outbox"

// The message fields.
const (
	FieldOutboxID = "outbox_id"
	FieldEventID  = "event_id" // absent on entries of rows written before event ids
	// FieldTraceparent is the W3C traceparent of the sampled callback the
	// event came from (absent for the others).
	FieldTraceparent = "traceparent"
	FieldTopic       = "topic"
	FieldOrderNo     = "order_no"
	FieldPayload     = "payload"
)

// Publisher publishes outbox rows to one stream.
type Publisher struct {
	// Replicas, when > 0, is how many replicas of the stream's master must
	// hold a published batch before Publish returns nil, so that an entry
	// Redis acknowledged cannot vanish in a failover after its row was
	// marked published. Fewer within ReplicaTimeout (default 1s) is an
	// error wrapping ErrReplicas: the rows stay unpublished, and when the
	// relay hands them over again they are checked again, not appended
	// again (see held).
	Replicas       int
	ReplicaTimeout time.Duration
	// OnTrimError hears a trim that failed. The entries it follows are
	// published all the same (a failed trim must not send them again);
	// the next trim tries again.
	OnTrimError func(error)

	client    redis.UniversalClient
	stream    string
	trimEvery time.Duration
	mu        sync.Mutex
	lastTrim  time.Time
	held      held
}

// ErrReplicas is returned (wrapped) by Publish when fewer replicas than
// Publisher.Replicas hold the entries: the broker has them, unconfirmed
// (errors.Is(err, outbox.ErrUnconfirmed) holds too).
var ErrReplicas error = replicasError{}

type replicasError struct{}

func (replicasError) Error() string { return "too few replicas hold the stream's entries" }

// Is makes ErrReplicas an outbox.ErrUnconfirmed without repeating its text.
func (replicasError) Is(target error) bool { return target == outbox.ErrUnconfirmed }

var _ outbox.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher on stream (default DefaultStream) that
// trims at most every trimEvery (default 10s).
func NewPublisher(client redis.UniversalClient, stream string, trimEvery time.Duration) *Publisher {
	return &Publisher{client: client, stream: cmp.Or(stream, DefaultStream), trimEvery: cmp.Or(trimEvery, 10*time.Second)}
}

// Publish XADDs msgs in order in one pipeline and returns nil once Redis
// acknowledged every one (and, with Replicas, once that many replicas hold
// them: see publishReplicated).
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) error {
	if p.Replicas > 0 {
		if err := p.publishReplicated(ctx, msgs); err != nil {
			return err
		}
	} else {
		pipe := p.client.Pipeline()
		cmds := p.xadd(ctx, pipe, msgs)
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("xadd: %w", err)
		}
		if err := xaddErr(msgs, cmds); err != nil {
			return err
		}
	}
	p.trimIfDue(ctx)
	return nil
}

// xadd queues one XADD a message on pipe.
func (p *Publisher) xadd(ctx context.Context, pipe redis.Pipeliner, msgs []outbox.Message) []*redis.StringCmd {
	cmds := make([]*redis.StringCmd, len(msgs))
	for i, m := range msgs {
		values := []any{FieldOutboxID, m.ID, FieldTopic, m.Topic, FieldOrderNo, m.OrderNo, FieldPayload, m.Payload}
		if m.EventID != "" {
			values = append(values, FieldEventID, m.EventID)
		}
		if m.Traceparent != "" {
			values = append(values, FieldTraceparent, m.Traceparent)
		}
		cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: p.stream, Values: values})
	}
	return cmds
}

// xaddErr is the first XADD of cmds that failed, naming its outbox id.
func xaddErr(msgs []outbox.Message, cmds []*redis.StringCmd) error {
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			return fmt.Errorf("xadd outbox id %d: %w", msgs[i].ID, err)
		}
	}
	return nil
}

// trimIfDue trims when trimEvery has passed since the last trim.
func (p *Publisher) trimIfDue(ctx context.Context) {
	p.mu.Lock()
	due := time.Since(p.lastTrim) >= p.trimEvery
	if due {
		p.lastTrim = time.Now()
	}
	p.mu.Unlock()
	if !due {
		return
	}
	if err := p.Trim(ctx); err != nil && p.OnTrimError != nil {
		p.OnTrimError(err)
	}
}

// master returns a client of the stream's master: on a Redis Cluster the
// node that serves the stream's key, else the one server.
func (p *Publisher) master(ctx context.Context) (redis.Cmdable, error) {
	if cc, ok := p.client.(*redis.ClusterClient); ok {
		return cc.MasterForKey(ctx, p.stream)
	}
	return p.client, nil
}

// trimScript trims KEYS[1] below the oldest id that every consumer group
// has both read and acknowledged: a group's oldest pending id, or with none
// pending its last delivered id; without groups, or with a group that has
// read nothing, it trims nothing. It reads the groups and trims in one
// script, so no group moves between the reads: read one by one, a group
// that acknowledged its last pending entry between XINFO GROUPS and its
// XPENDING answered with no lowest id, and a group created meanwhile was
// missed, and entries a group had not read were trimmed. ARGV[1], when not
// "", is a ceiling: nothing from that id on is trimmed. It returns the
// entries trimmed.
var trimScript = redis.NewScript(`
local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[1])
if not ok then
  local msg = tostring(type(groups) == 'table' and groups.err or groups)
  if string.find(msg, 'no such key', 1, true) then return 0 end
  return redis.error_reply(msg)
end
if #groups == 0 then return 0 end
local floor, floorMs, floorSeq
for _, g in ipairs(groups) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  local keep = f['last-delivered-id']
  if f['pending'] > 0 then
    keep = redis.call('XPENDING', KEYS[1], f['name'])[2]
  end
  local ms, seq = string.match(keep, '^(%d+)-(%d+)$')
  ms, seq = tonumber(ms), tonumber(seq)
  if floor == nil or ms < floorMs or (ms == floorMs and seq < floorSeq) then
    floor, floorMs, floorSeq = keep, ms, seq
  end
end
if ARGV[1] ~= '' then
  local ms, seq = string.match(ARGV[1], '^(%d+)-(%d+)$')
  ms, seq = tonumber(ms), tonumber(seq)
  if ms < floorMs or (ms == floorMs and seq < floorSeq) then
    floor, floorMs, floorSeq = ARGV[1], ms, seq
  end
end
if floorMs == 0 and floorSeq == 0 then return 0 end
return redis.call('XTRIM', KEYS[1], 'MINID', floor)
`)

// Trim drops the entries every consumer group has read and acknowledged,
// whatever the groups do meanwhile (see trimScript), short of the first
// entry the Publisher holds for replicas to confirm. Without groups
// nothing is acknowledged: no trim.
func (p *Publisher) Trim(ctx context.Context) error {
	if err := trimScript.Run(ctx, p.client, []string{p.stream}, p.held.lowest()).Err(); err != nil {
		return fmt.Errorf("trim %s: %w", p.stream, err)
	}
	return nil
}

// Message is one outbox row as a consumer reads it.
type Message struct {
	StreamID string
	OutboxID int64
	EventID  string // "" on an entry of a row written before event ids
	Topic    string
	OrderNo  string
	Payload  string
	// Traceparent is the sampled callback's W3C traceparent ("" for none).
	Traceparent string
}

// ConsumerConfig configures RunConsumer. Zero fields take the defaults noted.
type ConsumerConfig struct {
	Client redis.UniversalClient // required
	Stream string                // default DefaultStream
	Group  string                // required: the consumer group
	Name   string                // required: this consumer within the group
	// Handle processes one message; it must commit its effect before it
	// returns nil (the message is acknowledged then) and be idempotent on
	// OutboxID (a message may come again). An error leaves it pending.
	Handle func(ctx context.Context, m Message) error
	// HandleBatch, instead of Handle, processes the messages of one read
	// together (a transaction for all of them costs one commit): it returns
	// one error per message, in order, under Handle's rules for each; the
	// answered ones are acknowledged in one XACK.
	HandleBatch func(ctx context.Context, ms []Message) []error
	// Batch is how many messages one read takes (default 100).
	Batch int64
	// Block is how long a read waits for new messages (default 1s).
	Block time.Duration
	// ClaimIdle is how long a message may sit pending with a consumer before
	// another claims it (default 30s): a dead consumer's messages move on.
	ClaimIdle time.Duration
	// OnError hears failures the loop recovers from.
	OnError func(error)
}

// RunConsumer consumes the stream until ctx ends: first this consumer's
// own pending messages (after a restart), then new ones, and every
// ClaimIdle/2 the messages idle longer than ClaimIdle with others (XAUTOCLAIM).
func RunConsumer(ctx context.Context, cfg ConsumerConfig) error {
	if cfg.Client == nil || cfg.Group == "" || cfg.Name == "" || (cfg.Handle == nil) == (cfg.HandleBatch == nil) {
		return errors.New("redisstream: consumer needs Client, Group, Name and one of Handle and HandleBatch")
	}
	cfg.Stream = cmp.Or(cfg.Stream, DefaultStream)
	cfg.Batch = cmp.Or(cfg.Batch, 100)
	cfg.Block = cmp.Or(cfg.Block, time.Second)
	cfg.ClaimIdle = cmp.Or(cfg.ClaimIdle, 30*time.Second)
	fail := func(err error) {
		if cfg.OnError != nil && ctx.Err() == nil {
			cfg.OnError(err)
		}
	}
	for ctx.Err() == nil {
		err := cfg.Client.XGroupCreateMkStream(ctx, cfg.Stream, cfg.Group, "0").Err()
		if err == nil || strings.Contains(err.Error(), "BUSYGROUP") {
			break
		}
		fail(fmt.Errorf("create group: %w", err))
		wait.Sleep(ctx, time.Second)
	}
	c := consumer{cfg: cfg, fail: fail}
	c.read(ctx, "0") // our own pending, from before a restart
	lastClaim := time.Now()
	for ctx.Err() == nil {
		if time.Since(lastClaim) >= cfg.ClaimIdle/2 {
			c.claim(ctx)
			lastClaim = time.Now()
		}
		if !c.read(ctx, ">") {
			wait.Sleep(ctx, 100*time.Millisecond)
		}
	}
	return nil
}

type consumer struct {
	cfg  ConsumerConfig
	fail func(error)
}

// read reads and handles one batch from id (">" new, "0" own pending).
func (c *consumer) read(ctx context.Context, id string) bool {
	block := c.cfg.Block
	if id != ">" {
		block = -1 // no BLOCK
	}
	streams, err := c.cfg.Client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: c.cfg.Group, Consumer: c.cfg.Name, Streams: []string{c.cfg.Stream, id},
		Count: c.cfg.Batch, Block: block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return true
	}
	if err != nil {
		c.fail(fmt.Errorf("xreadgroup: %w", err))
		return false
	}
	for _, s := range streams {
		c.handle(ctx, s.Messages)
	}
	return true
}

// claim takes over messages other consumers left pending too long.
func (c *consumer) claim(ctx context.Context) {
	start := "0-0"
	for ctx.Err() == nil {
		msgs, next, err := c.cfg.Client.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Name,
			MinIdle: c.cfg.ClaimIdle, Start: start, Count: c.cfg.Batch,
		}).Result()
		if err != nil {
			c.fail(fmt.Errorf("xautoclaim: %w", err))
			return
		}
		c.handle(ctx, msgs)
		if next == "0-0" || len(msgs) == 0 {
			return
		}
		start = next
	}
}

// handle processes messages in order and acknowledges each after its
// handler committed.
func (c *consumer) handle(ctx context.Context, msgs []redis.XMessage) {
	if c.cfg.HandleBatch != nil {
		c.handleBatch(ctx, msgs)
		return
	}
	for _, xm := range msgs {
		m, err := decode(xm)
		if err != nil {
			c.fail(err) // not ours to judge: leave it pending for a human
			continue
		}
		if err := c.cfg.Handle(ctx, m); err != nil {
			c.fail(fmt.Errorf("handle outbox id %d: %w", m.OutboxID, err))
			continue
		}
		if err := c.cfg.Client.XAck(ctx, c.cfg.Stream, c.cfg.Group, xm.ID).Err(); err != nil {
			c.fail(fmt.Errorf("xack %s: %w", xm.ID, err))
		}
	}
}

// handleBatch hands the decodable messages to HandleBatch at once and
// acknowledges the ones it answered in one XACK.
func (c *consumer) handleBatch(ctx context.Context, msgs []redis.XMessage) {
	ms := make([]Message, 0, len(msgs))
	for _, xm := range msgs {
		m, err := decode(xm)
		if err != nil {
			c.fail(err) // not ours to judge: leave it pending for a human
			continue
		}
		ms = append(ms, m)
	}
	if len(ms) == 0 {
		return
	}
	errs := c.cfg.HandleBatch(ctx, ms)
	if len(errs) != len(ms) {
		c.fail(fmt.Errorf("handle %d messages: %d answers", len(ms), len(errs)))
		return
	}
	ids := make([]string, 0, len(ms))
	for i, m := range ms {
		if errs[i] != nil {
			c.fail(fmt.Errorf("handle outbox id %d: %w", m.OutboxID, errs[i]))
			continue
		}
		ids = append(ids, m.StreamID)
	}
	if len(ids) == 0 {
		return
	}
	if err := c.cfg.Client.XAck(ctx, c.cfg.Stream, c.cfg.Group, ids...).Err(); err != nil {
		c.fail(fmt.Errorf("xack %d messages from %s: %w", len(ids), ids[0], err))
	}
}

func decode(xm redis.XMessage) (Message, error) {
	str := func(k string) string { s, _ := xm.Values[k].(string); return s }
	id, err := strconv.ParseInt(str(FieldOutboxID), 10, 64)
	if err != nil {
		return Message{}, fmt.Errorf("message %s: bad %s %q", xm.ID, FieldOutboxID, str(FieldOutboxID))
	}
	return Message{StreamID: xm.ID, OutboxID: id, EventID: str(FieldEventID), Topic: str(FieldTopic), OrderNo: str(FieldOrderNo),
		Payload: str(FieldPayload), Traceparent: str(FieldTraceparent)}, nil
}

// NewClient returns a go-redis client for a stream URL (the cache's URL
// forms), with timeouts fit for a background relay rather than a request.
func NewClient(url string) (redis.UniversalClient, error) {
	if strings.Contains(url, "addr=") {
		o, err := redis.ParseClusterURL(url)
		if err != nil {
			return nil, fmt.Errorf("redisstream: parse cluster url: %w", err)
		}
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 2*time.Second, 5*time.Second, 5*time.Second
		// The slot map is read again once it is a second old (go-redis's
		// default is a minute): after a failover the stream's key moves to
		// the promoted replica, and the relay must follow it in seconds.
		o.ClusterStateReloadInterval = time.Second
		return redis.NewClusterClient(o), nil
	}
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redisstream: parse url: %w", err)
	}
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 2*time.Second, 5*time.Second, 5*time.Second
	return redis.NewClient(o), nil
}
