package procstat

import (
	"os"
	"testing"
)

// The command name may hold spaces and parentheses: fields are counted
// from its last ')'.
func TestParse(t *testing.T) {
	line := "4242 (post (gres) x) S 17 4242 4242 0 -1 4194560 100 0 0 0 11 22 33 44 20 0 1 0 31274 3133440 422\n"
	st, err := Parse([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if st != (Stat{PPID: 17, UTime: 11, STime: 22, CUTime: 33, CSTime: 44}) {
		t.Errorf("parsed %+v", st)
	}
	if _, err := Parse([]byte("4242 (x) S 1 2")); err == nil {
		t.Error("a short line parsed")
	}
}

func TestReadsThisProcess(t *testing.T) {
	if _, err := Read(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if n := ClockTicks(); n <= 0 {
		t.Errorf("CLK_TCK %d", n)
	}
}
