package bench

import (
	"os"
	"testing"

	"github.com/notifyedge/notifyedge/bench/procstat"
)

// A backend that exits moves its time from the running children to the
// postmaster's cutime/CSTime: the tree's total does not drop.
func TestTreeTicksKeepsExitedChildren(t *testing.T) {
	before := map[int]procStat{
		10: {PPID: 1, UTime: 5, STime: 5},
		11: {PPID: 10, UTime: 100, STime: 50},
		12: {PPID: 10, UTime: 7, STime: 3},
		99: {PPID: 1, UTime: 1000}, // not ours
	}
	after := map[int]procStat{
		10: {PPID: 1, UTime: 6, STime: 5, CUTime: 110, CSTime: 55}, // 11 exited after 10 more ticks of user, 5 of system
		12: {PPID: 10, UTime: 9, STime: 3},
		99: {PPID: 1, UTime: 2000},
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
	before.ticks[colEdge], before.ok[colEdge], before.who[colEdge] = 100, true, "7"
	after.ticks[colEdge], after.ok[colEdge], after.who[colEdge] = 300, true, "7"
	before.ticks[colRedis], before.ok[colRedis], before.who[colRedis] = 100, true, "8"
	after.ticks[colRedis], after.ok[colRedis], after.who[colRedis] = 300, true, "9"
	after.ok[colMachine] = true
	c := cost(before, after, 1000)
	if want := 200 * 1e6 / float64(procstat.ClockTicks()) / 1000; c.Edge == nil || *c.Edge != want {
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
	if n := procstat.ClockTicks(); n <= 0 {
		t.Errorf("CLK_TCK %d", n)
	}
}
