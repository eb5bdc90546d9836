package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/bench/procstat"
)

// The bench measures cost as well as speed: the CPU time each part used
// during an attack, divided by the requests answered in it. Every figure is
// a difference of two /proc readings taken just before and just after the
// attack, so set-up, scrapes and invariant checks fall outside it.

// CPUCost is the CPU time, in microseconds per answered request, that each
// part used during one attack. A nil field could not be read: a part this
// run does not own (against an existing deployment only the machine, the
// driver and, if its data directory is on this machine, Postgres are
// readable), or one that restarted during the attack.
type CPUCost struct {
	// Machine is all CPUs' busy time (/proc/stat), whatever ran on them:
	// the machine the bench runs on, which is the deployment's only when
	// the target runs here.
	Machine *float64 `json:"machine"`
	// Edge is the edge process (all three edge servers; one is attacked).
	Edge *float64 `json:"edge"`
	// Postgres is the postmaster and all its backends (see treeTicks).
	Postgres *float64 `json:"postgres"`
	// PostgresEdge is the part of Postgres that serves the edge's own
	// connections (our own stack only): deciding the deliveries, without
	// the relay's and the shipper's work, which follows the deliveries at
	// its own pace (a consumer that lags behind an attack does its share
	// after it, outside the Postgres figure).
	PostgresEdge *float64 `json:"postgres_edge,omitempty"`
	// PostgresShip is the part of Postgres that serves the reference
	// shipper's connections (our own stack only): shipping the paid
	// orders, which keeps pace with the deliveries.
	PostgresShip *float64 `json:"postgres_ship,omitempty"`
	// PostgresRelay is the part of Postgres that serves the outbox relay's
	// connection (our own stack only): reading the unpublished rows and
	// marking them published. What Postgres spends beyond it, PostgresEdge
	// and PostgresShip is other sessions' (the bench's own: the raw pgx
	// ceiling, retention, the incident) and the server's background work.
	PostgresRelay *float64 `json:"postgres_relay,omitempty"`
	// Redis is the cache's redis-server process (and the stream's, unless
	// the stream has one of its own).
	Redis *float64 `json:"redis"`
	// Forwarder is the webhook forwarder's process, where a run starts one
	// (the soak).
	Forwarder *float64 `json:"forwarder,omitempty"`
	// StreamRedis is the outbox stream's own redis-server, when the run
	// gave it one (Config.StreamRedis).
	StreamRedis *float64 `json:"stream_redis,omitempty"`
	// Relay is the process running the outbox relay and the reference
	// shipper, which work off the first deliveries in the background.
	Relay *float64 `json:"relay_shipper"`
	// Driver is the bench process itself: the load generator, plus, for
	// the ceilings, the servers they run in it.
	Driver *float64 `json:"driver"`
}

// The columns of a CPU sample, in CPUCost's order.
const (
	colMachine = iota
	colEdge
	colPostgres
	colRedis
	colRelay
	colDriver
	colPostgresEdge
	colStreamRedis
	colPostgresShip
	colPostgresRelay
	colForwarder
	nCols
)

// cpuSample is one reading of every column, in clock ticks.
type cpuSample struct {
	ticks [nCols]uint64
	ok    [nCols]bool
	// who was read: a process's pid, or a session's backends' pids, to
	// tell a restarted process or a reconnected session (its ticks start
	// again from zero, and the old one's are lost) from the same one.
	who [nCols]string
}

// cpuProbe knows where each part runs. A zero pid is a part not read.
type cpuProbe struct {
	edge, relay, postgres, forwarder int
	// redis is the address of our own stack's redis-server ("": not
	// ours); its pid is asked at every sample, because the redis-down
	// scenario restarts it. streamRedis is the stream's own, if any.
	redis, streamRedis string
	// db finds the backends of the edge's, the shipper's and the relay's
	// sessions, application_name edgeApp, shipApp and relayApp, at every
	// sample ("": not told apart).
	db                         *pgxpool.Pool
	edgeApp, shipApp, relayApp string
}

// sample reads every column the probe knows of.
func (p *cpuProbe) sample() cpuSample {
	var s cpuSample
	redisPID := 0
	if p.redis != "" {
		// Asked before any tick is read, so that this INFO's own cost falls
		// outside the "before" reading (it is inside the "after" one: a few
		// microseconds over a whole attack).
		redisPID = redisServerPID(p.redis)
	}
	streamPID := 0
	if p.streamRedis != "" {
		streamPID = redisServerPID(p.streamRedis)
	}
	// The sessions' backends are asked before the ticks are read, as
	// redis's pid is.
	sessions := map[int][]int{}
	for col, app := range map[int]string{colPostgresEdge: p.edgeApp, colPostgresShip: p.shipApp, colPostgresRelay: p.relayApp} {
		if app == "" {
			continue
		}
		if pids, err := p.backendsOf(app); err == nil {
			sessions[col] = pids
		}
	}
	procs, err := readAllProcStats()
	if err != nil {
		return s
	}
	for col, pids := range sessions {
		// A backend's own time: the pools keep their connections, so the
		// same backends are read before and after an attack. The relay's
		// reconnects after a failure (Redis down): a changed set of
		// backends leaves the figure empty.
		slices.Sort(pids)
		for _, pid := range pids {
			if st, ok := procs[pid]; ok {
				s.ticks[col] += st.UTime + st.STime
			}
		}
		s.ok[col], s.who[col] = true, fmt.Sprint(pids)
	}
	if t, err := machineBusyTicks(); err == nil {
		s.ticks[colMachine], s.ok[colMachine] = t, true
	}
	for col, pid := range map[int]int{colEdge: p.edge, colPostgres: p.postgres, colRedis: redisPID, colRelay: p.relay, colStreamRedis: streamPID, colForwarder: p.forwarder} {
		if pid == 0 {
			continue
		}
		if t, ok := treeTicks(procs, pid); ok {
			s.ticks[col], s.ok[col], s.who[col] = t, true, strconv.Itoa(pid)
		}
	}
	// The driver is this process's own time only: its cutime and cstime
	// collect the children it reaps (Postgres, redis-server, the parts),
	// which are other columns.
	if self, ok := procs[os.Getpid()]; ok {
		s.ticks[colDriver], s.ok[colDriver] = self.UTime+self.STime, true
	}
	return s
}

// cost turns two samples around an attack of n answered requests into
// microseconds per request.
func cost(before, after cpuSample, n int) CPUCost {
	var out [nCols]*float64
	if n > 0 {
		us := 1e6 / float64(procstat.ClockTicks())
		for col := range nCols {
			if !before.ok[col] || !after.ok[col] || before.who[col] != after.who[col] || after.ticks[col] < before.ticks[col] {
				continue
			}
			v := float64(after.ticks[col]-before.ticks[col]) * us / float64(n)
			out[col] = &v
		}
	}
	return CPUCost{Machine: out[colMachine], Edge: out[colEdge], Postgres: out[colPostgres],
		Redis: out[colRedis], Relay: out[colRelay], Driver: out[colDriver], PostgresEdge: out[colPostgresEdge],
		StreamRedis: out[colStreamRedis], PostgresShip: out[colPostgresShip], PostgresRelay: out[colPostgresRelay],
		Forwarder: out[colForwarder]}
}

// backendsOf returns the pids of the backends whose application_name is
// app.
func (p *cpuProbe) backendsOf(app string) ([]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := p.db.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

// procStat is what the bench reads of one /proc/<pid>/stat.
type procStat = procstat.Stat

// readAllProcStats reads every process's stat at once: one scan of /proc
// serves all columns of a sample.
func readAllProcStats() (map[int]procStat, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("bench: read /proc: %w", err)
	}
	out := make(map[int]procStat, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := procstat.Read(pid); err == nil { // gone meanwhile: skip it
			out[pid] = st
		}
	}
	return out, nil
}

// treeTicks is the CPU a server process has used, with its children: its
// own utime+stime, plus cutime+cstime (the children it has waited for),
// plus the same four fields of each child still running.
//
// Why: Postgres serves every connection in a backend of its own, and a
// backend that exits between two readings takes its utime and stime out of
// /proc with it. The postmaster waits for every backend, and the kernel
// then adds the backend's time (and its own waited-for children's) to the
// postmaster's cutime and cstime. So the sum above moves a backend's time
// from the "running children" term to the "waited for" term when it exits,
// and nothing is lost or counted twice, except for a backend reaped within
// the scan itself (between the reads of its stat and the postmaster's: a
// window of microseconds, while the pools keep their connections);
// grandchildren still running are not seen (Postgres backends start
// none). The same holds for redis-server's rewrite and save forks. Matching
// children by parent pid, rather than by data directory (/proc/<pid>/cwd),
// needs no privilege over the server's user.
func treeTicks(procs map[int]procStat, root int) (uint64, bool) {
	r, ok := procs[root]
	if !ok {
		return 0, false
	}
	t := r.UTime + r.STime + r.CUTime + r.CSTime
	for pid, st := range procs {
		if st.PPID == root && pid != root {
			t += st.UTime + st.STime + st.CUTime + st.CSTime
		}
	}
	return t, true
}

// machineBusyTicks is the busy time of all CPUs, from /proc/stat's "cpu"
// line: user, nice, system, irq and softirq. Idle and iowait are idle;
// steal is time the hypervisor gave to other guests, not work done here;
// guest and guest_nice are already inside user and nice.
func machineBusyTicks() (uint64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("bench: /proc/stat: unexpected first line %q", line)
	}
	var busy uint64
	for _, i := range []int{1, 2, 3, 6, 7} { // user nice system _ _ irq softirq
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bench: /proc/stat: %w", err)
		}
		busy += v
	}
	return busy, nil
}

// postmasterPID finds the Postgres server behind db on this machine, or
// returns 0. The pid in postmaster.pid under the server's data directory
// must be the parent of the backend serving this very query: a database on
// another machine (its data directory absent here, or another server's
// there) or a role not allowed to read data_directory gives 0, and the
// Postgres column stays empty.
func postmasterPID(ctx context.Context, db *pgxpool.Pool) int {
	var backend int
	var dataDir string
	if err := db.QueryRow(ctx, `SELECT pg_backend_pid(), current_setting('data_directory')`).Scan(&backend, &dataDir); err != nil {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0
	}
	if st, err := procstat.Read(backend); err != nil || st.PPID != pid {
		return 0
	}
	return pid
}

// redisServerPID asks the redis-server at addr its pid (INFO server), and
// checks that this machine runs a redis-server under it; 0 if not (down,
// or elsewhere). It speaks RESP itself on a fresh connection: a go-redis
// client would retry, and print to stderr, while redis-down has the server
// killed.
func redisServerPID(addr string) int {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return 0
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return 0
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n') // "$<length>\r\n", then the text
	if err != nil || !strings.HasPrefix(head, "$") {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil || n <= 0 {
		return 0
	}
	text := make([]byte, n)
	if _, err := io.ReadFull(r, text); err != nil {
		return 0
	}
	pid := 0
	for _, line := range strings.Split(string(text), "\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			pid, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	if pid <= 0 {
		return 0
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || !strings.HasPrefix(string(comm), "redis-server") {
		return 0
	}
	return pid
}

// peakRSSMiB is a process's peak resident set (VmHWM), 0 if unreadable.
func peakRSSMiB(pid int) float64 {
	return statusMiB(fmt.Sprintf("/proc/%d/status", pid), "VmHWM:")
}
