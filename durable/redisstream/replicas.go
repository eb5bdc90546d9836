package redisstream

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable/outbox"
)

// held remembers the entries this Publisher appended that too few replicas
// held yet: by outbox id, each entry's stream id and the master's
// replication offset right after it. The relay hands such rows over again
// (they stay unpublished), and they are then checked again, not appended
// again: without it, a Redis with fewer replicas than asked got the same
// row appended at every retry. A relay that restarts forgets them, and
// appends them once more.
type held struct {
	mu      sync.Mutex
	entries map[int64]heldEntry
}

type heldEntry struct {
	streamID string
	offset   int64
}

// split returns the messages of msgs that are not held, and of the held
// ones the one appended last (streamID "" when none is held).
func (h *held) split(msgs []outbox.Message) (fresh []outbox.Message, last heldEntry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range msgs {
		e, ok := h.entries[m.ID]
		switch {
		case !ok:
			fresh = append(fresh, m)
		case e.offset > last.offset:
			last = e
		}
	}
	return fresh, last
}

// keep records msgs as appended, with their stream ids, before offset.
func (h *held) keep(msgs []outbox.Message, ids []*redis.StringCmd, offset int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.entries == nil {
		h.entries = map[int64]heldEntry{}
	}
	for i, m := range msgs {
		h.entries[m.ID] = heldEntry{streamID: ids[i].Val(), offset: offset}
	}
}

// drop forgets msgs: replicas hold them, or the stream lost them.
func (h *held) drop(msgs []outbox.Message) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range msgs {
		delete(h.entries, m.ID)
	}
}

// publishReplicated appends the messages not held yet and returns nil once
// Replicas replicas hold all of msgs. The XADDs, a WAIT for them, a look
// for the last held entry and an INFO replication go in one pipeline on
// one connection to the stream's master (WAIT counts the replicas that
// hold this connection's writes). The replication stream is one log in
// order, so a replica whose acknowledged offset reached the last held
// entry's holds every earlier one, and a master that still has that entry
// (after a restart or a failover) has every earlier one too; a master that
// lost it gets the rows appended again at the next call.
func (p *Publisher) publishReplicated(ctx context.Context, msgs []outbox.Message) error {
	conn, err := p.master(ctx)
	if err != nil {
		return fmt.Errorf("xadd: %w", err)
	}
	fresh, last := p.held.split(msgs)
	timeout := cmp.Or(p.ReplicaTimeout, time.Second)
	pipe := conn.Pipeline()
	cmds := p.xadd(ctx, pipe, fresh)
	var wait *redis.Cmd
	if len(fresh) > 0 {
		wait = pipe.Do(ctx, "WAIT", p.Replicas, timeout.Milliseconds())
	}
	var probe *redis.XMessageSliceCmd
	if last.streamID != "" {
		probe = pipe.XRange(ctx, p.stream, last.streamID, last.streamID)
	}
	info := pipe.Info(ctx, "replication")
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("xadd: %w", err)
	}
	if err := xaddErr(fresh, cmds); err != nil {
		return err
	}
	rep, err := parseReplication(info.Val())
	if err != nil {
		return err
	}
	p.held.keep(fresh, cmds, rep.offset)
	if probe != nil && len(probe.Val()) == 0 {
		p.held.drop(msgs)
		return fmt.Errorf("%w: outbox ids %d..%d are no longer in the stream (its Redis restarted or failed over without them): they go again",
			ErrReplicas, msgs[0].ID, msgs[len(msgs)-1].ID)
	}
	// The offset a replica must have acknowledged: the last held entry's,
	// or this INFO's for entries just appended; never more than the
	// master's own (a master whose offsets started again after a restart
	// holds the entries now, and a replica level with it has them).
	need := last.offset
	if len(fresh) > 0 {
		need = rep.offset
	}
	need = min(need, rep.offset)
	have := rep.holding(need)
	if wait != nil {
		if n, err := wait.Int64(); err == nil {
			have = max(have, int(n))
		}
	}
	if have >= p.Replicas {
		p.held.drop(msgs)
		return nil
	}
	return fmt.Errorf("%w: %d of %d asked hold outbox ids %d..%d (%d appended now, %d before; they stay unpublished and are checked again, not appended again)",
		ErrReplicas, have, p.Replicas, msgs[0].ID, msgs[len(msgs)-1].ID, len(fresh), len(msgs)-len(fresh))
}

// replication is what INFO replication says of a master and its replicas.
type replication struct {
	offset   int64   // master_repl_offset
	replicas []int64 // each online replica's acknowledged offset
}

// holding counts the replicas that acknowledged offset.
func (r replication) holding(offset int64) int {
	n := 0
	for _, o := range r.replicas {
		if o >= offset {
			n++
		}
	}
	return n
}

// parseReplication reads INFO replication: role, master_repl_offset and the lines slaveN:ip=..,port=..,state=online,
// offset=..,lag=.. (Redis 7 still names them so).
func parseReplication(info string) (replication, error) {
	var r replication
	master := false
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		switch {
		case !ok:
		case k == "role":
			master = v == "master"
		case k == "master_repl_offset":
			r.offset, _ = strconv.ParseInt(v, 10, 64)
		case strings.HasPrefix(k, "slave") && k != "slave_read_only" && strings.Contains(v, "state="):
			f := map[string]string{}
			for _, kv := range strings.Split(v, ",") {
				if a, b, ok := strings.Cut(kv, "="); ok {
					f[a] = b
				}
			}
			if f["state"] == "online" {
				o, err := strconv.ParseInt(f["offset"], 10, 64)
				if err == nil {
					r.replicas = append(r.replicas, o)
				}
			}
		}
	}
	if !master {
		return r, fmt.Errorf("redisstream: the stream's Redis is not a master (INFO replication role)")
	}
	return r, nil
}

// ConnectedReplicas is how many replicas the stream's master has online:
// edged compares it with -stream-replicas at start.
func (p *Publisher) ConnectedReplicas(ctx context.Context) (int, error) {
	conn, err := p.master(ctx)
	if err != nil {
		return 0, err
	}
	info, err := conn.Info(ctx, "replication").Result()
	if err != nil {
		return 0, fmt.Errorf("info replication: %w", err)
	}
	rep, err := parseReplication(info)
	if err != nil {
		return 0, err
	}
	return len(rep.replicas), nil
}
