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

// heldEntry is one appended entry: its row's outbox id, its stream id and
// the master's replication offset right after it.
type heldEntry struct {
	outboxID int64
	streamID string
	offset   int64
}

// split returns the messages of msgs that are not held, and the entries of
// those that are.
func (h *held) split(msgs []outbox.Message) (fresh []outbox.Message, old []heldEntry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range msgs {
		if e, ok := h.entries[m.ID]; ok {
			old = append(old, e)
		} else {
			fresh = append(fresh, m)
		}
	}
	return fresh, old
}

// keep records msgs as appended, with their stream ids, before offset.
func (h *held) keep(msgs []outbox.Message, ids []*redis.StringCmd, offset int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.entries == nil {
		h.entries = map[int64]heldEntry{}
	}
	for i, m := range msgs {
		h.entries[m.ID] = heldEntry{outboxID: m.ID, streamID: ids[i].Val(), offset: offset}
	}
}

// drop forgets the entries of these outbox ids: replicas hold them, or the
// stream lost them.
func (h *held) drop(ids ...int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range ids {
		delete(h.entries, id)
	}
}

// lowest is the smallest stream id held ("" when none): the trim keeps it
// and every entry after it, so that an entry consumers acknowledged is
// still there to be checked (a trimmed one would look lost and go again).
func (h *held) lowest() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	low := ""
	for _, e := range h.entries {
		if low == "" || lessID(e.streamID, low) {
			low = e.streamID
		}
	}
	return low
}

// publishReplicated appends the messages not held yet and returns nil once
// Replicas replicas hold all of msgs. The XADDs, a WAIT for them, a look
// at each held entry and an INFO replication go in one pipeline on one
// connection to the stream's master (WAIT counts the replicas that hold
// this connection's writes). The replication stream is one log in order:
// a replica whose acknowledged offset reached a held entry's holds it. A
// held entry the master no longer has (it restarted, or failed over,
// without it) is forgotten, and its row appended again at the next call.
func (p *Publisher) publishReplicated(ctx context.Context, msgs []outbox.Message) error {
	conn, err := p.master(ctx)
	if err != nil {
		return fmt.Errorf("xadd: %w", err)
	}
	fresh, old := p.held.split(msgs)
	timeout := cmp.Or(p.ReplicaTimeout, time.Second)
	pipe := conn.Pipeline()
	cmds := p.xadd(ctx, pipe, fresh)
	var wait *redis.Cmd
	if len(fresh) > 0 {
		wait = pipe.Do(ctx, "WAIT", p.Replicas, timeout.Milliseconds())
	}
	probes := make([]*redis.XMessageSliceCmd, len(old))
	for i, e := range old {
		probes[i] = pipe.XRange(ctx, p.stream, e.streamID, e.streamID)
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
	// The offset a replica must have acknowledged: the held entries', or
	// this INFO's for entries just appended; never more than the master's
	// own (a master whose offsets started again after a restart holds the
	// entries now, and a replica level with it has them).
	var need int64
	var lost []int64
	for i, e := range old {
		got := probes[i].Val()
		if len(got) != 1 || fmt.Sprint(got[0].Values[FieldOutboxID]) != strconv.FormatInt(e.outboxID, 10) {
			lost = append(lost, e.outboxID)
			continue
		}
		need = max(need, e.offset)
	}
	if len(lost) > 0 {
		p.held.drop(lost...)
		return fmt.Errorf("%w: the entries of outbox ids %v are no longer in the stream (its Redis restarted or failed over without them): they go again",
			ErrReplicas, lost)
	}
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
		ids := make([]int64, len(msgs))
		for i, m := range msgs {
			ids[i] = m.ID
		}
		p.held.drop(ids...)
		return nil
	}
	return fmt.Errorf("%w: %d of %d asked hold outbox ids %d..%d (%d appended now, %d before; they stay unpublished and are checked again, not appended again)",
		ErrReplicas, have, p.Replicas, msgs[0].ID, msgs[len(msgs)-1].ID, len(fresh), len(old))
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

// lessID orders stream ids "ms-seq" as Redis does.
func lessID(a, b string) bool {
	am, as := splitID(a)
	bm, bs := splitID(b)
	return am < bm || am == bm && as < bs
}

func splitID(id string) (ms, seq uint64) {
	m, s, _ := strings.Cut(id, "-")
	ms, _ = strconv.ParseUint(m, 10, 64)
	seq, _ = strconv.ParseUint(s, 10, 64)
	return ms, seq
}
