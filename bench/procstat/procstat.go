// Package procstat reads the CPU time Linux charges to a process, from
// proc(5)'s /proc/<pid>/stat: what the benches divide by the requests or
// deliveries a process served. It imports the standard library only, so a
// package's own benchmarks can use it too.
package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
)

// Stat is what is read of one /proc/<pid>/stat, in clock ticks
// (ClockTicks a second).
type Stat struct {
	PPID                         int
	UTime, STime, CUTime, CSTime uint64
}

// Read parses /proc/<pid>/stat.
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Stat{}, err
	}
	return Parse(b)
}

// Parse reads fields 4 (ppid) and 14-17 (utime, stime, cutime, cstime) of
// a stat line. The command name (field 2) may hold spaces and parentheses:
// the fields are counted from its last ')'.
func Parse(b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, errors.New("procstat: no command name")
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3, the state
	if len(f) < 15 {
		return Stat{}, fmt.Errorf("procstat: %d fields after the name", len(f))
	}
	var st Stat
	var err error
	if st.PPID, err = strconv.Atoi(f[1]); err != nil {
		return Stat{}, fmt.Errorf("procstat: ppid: %w", err)
	}
	for j, dst := range []*uint64{&st.UTime, &st.STime, &st.CUTime, &st.CSTime} {
		if *dst, err = strconv.ParseUint(f[11+j], 10, 64); err != nil {
			return Stat{}, fmt.Errorf("procstat: field %d: %w", 14+j, err)
		}
	}
	return st, nil
}

// ClockTicks is the number of /proc clock ticks per second.
func ClockTicks() int { return clkTck() }

var clkTck = sync.OnceValue(func() int {
	// /proc counts in USER_HZ clock ticks. Go cannot call sysconf without
	// cgo, so ask getconf; Linux fixes USER_HZ at 100 on every architecture
	// Go runs on, which is the fallback.
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && n > 0 {
			return n
		}
	}
	return 100
})
