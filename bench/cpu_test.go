package bench

import (
	"os"
	"testing"
)

// The command name may hold spaces and parentheses: fields are counted
// from its last ')'.
func TestParseProcStat(t *testing.T) {
	line := "4242 (post (gres) x) S 17 4242 4242 0 -1 4194560 100 0 0 0 11 22 33 44 20 0 1 0 31274 3133440 422\n"
	st, err := parseProcStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if st != (procStat{ppid: 17, utime: 11, stime: 22, cutime: 33, cstime: 44}) {
		t.Errorf("parsed %+v", st)
	}
	if _, err := parseProcStat([]byte("4242 (x) S 1 2")); err == nil {
		t.Error("a short line parsed")
	}
}

// A backend that exits moves its time from the running children to the
// postmaster's cutime/cstime: the tree's total does not drop.
func TestTreeTicksKeepsExitedChildren(t *testing.T) {
	before := map[int]procStat{
		10: {ppid: 1, utime: 5, stime: 5},
		11: {ppid: 10, utime: 100, stime: 50},
		12: {ppid: 10, utime: 7, stime: 3},
		99: {ppid: 1, utime: 1000}, // not ours
	}
	after := map[int]procStat{
		10: {ppid: 1, utime: 6, stime: 5, cutime: 110, cstime: 55}, // 11 exited after 10 more ticks of user, 5 of system
		12: {ppid: 10, utime: 9, stime: 3},
		99: {ppid: 1, utime: 2000},
	}
	b, _ := treeTicks(before, 10)
	a, _ := treeTicks(after, 10)
	if b != 170 || a != 188 {
		t.Errorf("tree ticks %d then %d, want 170 then 188", b, a)
	}
	if _, ok := treeTicks(after, 11); ok {
		t.Error("an exited process read")
	}
}

// A column read on one side only, or by another pid (a restart), is empty,
// not zero.
func TestCostEmptyWhenUnreadable(t *testing.T) {
	var before, after cpuSample
	before.ticks[colEdge], before.ok[colEdge], before.pids[colEdge] = 100, true, 7
	after.ticks[colEdge], after.ok[colEdge], after.pids[colEdge] = 300, true, 7
	before.ticks[colRedis], before.ok[colRedis], before.pids[colRedis] = 100, true, 8
	after.ticks[colRedis], after.ok[colRedis], after.pids[colRedis] = 300, true, 9
	after.ok[colMachine] = true
	c := cost(before, after, 1000)
	if want := 200 * 1e6 / float64(clockTicks()) / 1000; c.Edge == nil || *c.Edge != want {
		t.Errorf("edge %v, want %v", c.Edge, want)
	}
	if c.Redis != nil || c.Machine != nil || c.Postgres != nil {
		t.Errorf("redis %v, machine %v, postgres %v: want empty", c.Redis, c.Machine, c.Postgres)
	}
}

func TestReadsThisMachine(t *testing.T) {
	if _, err := machineBusyTicks(); err != nil {
		t.Fatal(err)
	}
	procs, err := readAllProcStats()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := procs[os.Getpid()]; !ok {
		t.Error("this process not found under /proc")
	}
	if n := clockTicks(); n <= 0 {
		t.Errorf("CLK_TCK %d", n)
	}
}
