package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/edge/edgetest"
)

// The real binary, SIGKILLed mid-run with a second instance already
// waiting, then restarted beside it: nothing is lost, every event reaches
// the receiver at least once and, per order, in outbox order (after
// dropping duplicates by webhook-id).
func TestBinarySIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := filepath.Join(t.TempDir(), "forwarder")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	e := newTestEnv(t)
	e.recv.setBehave(func(string, int64, int) verdict { return verdict{status: http.StatusOK, delay: 5 * time.Millisecond} })
	var orders []string
	for i := range 30 {
		orders = append(orders, fmt.Sprintf("kill-%02d", i))
	}
	e.publish(7, orders...) // 210 now, 90 more while the instances change

	logDir := t.TempDir()
	type proc struct {
		cmd    *exec.Cmd
		admin  string
		exited <-chan struct{}
	}
	startProc := func(name string) proc {
		t.Helper()
		admin := freeAddr(t)
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(),
			"EDGE_STREAM_URL="+e.redis.URL(), "EDGE_STREAM_NAME="+e.stream,
			"FORWARD_URL="+e.recv.srv.URL+"/hook", "FORWARD_SECRET="+e.secret,
			"FORWARD_NAME="+name, "FORWARD_LEASE_TTL=1s", "FORWARD_PARTITIONS=4",
			"FORWARD_BACKOFF_MAX=200ms", "FORWARD_ADMIN_LISTEN="+admin)
		logFile, err := os.Create(filepath.Join(logDir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logFile, logFile
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := waitClosed(cmd, logFile)
		t.Cleanup(func() { cmd.Process.Kill(); <-exited })
		return proc{cmd: cmd, admin: admin, exited: exited}
	}
	a := startProc("A")
	waitFor(t, "A's first deliveries", func() bool { return e.recv.unique() >= 60 })
	b := startProc("B") // overlapping: waits for the lease
	bAdmin := b.admin
	waitFor(t, "B's admin listener", func() bool { return httpGet(bAdmin, "/healthz") == "ok\n" })
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := e.recv.unique()
	if killedAt >= 210 {
		t.Fatalf("A delivered everything (%d) before it was killed: slow the receiver", killedAt)
	}
	e.publish(3, orders...)
	waitFor(t, "B taking over", func() bool { return metric(bAdmin, "notifyedge_forward_active") == "1" })
	c := startProc("A-restarted")
	cAdmin := c.admin
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every event", func() bool { return e.recv.unique() == 300 })
	waitFor(t, "every entry acknowledged", func() bool { return e.pending() == 0 })
	if got := metric(cAdmin, "notifyedge_forward_active"); got != "1" {
		t.Errorf("restarted instance active = %q, want 1", got)
	}
	if got := metric(cAdmin, `notifyedge_forward_total{result="delivered"}`); got == "" || got == "0" {
		t.Errorf("restarted instance delivered = %q", got)
	}
	if got := metric(cAdmin, "notifyedge_forward_lag_seconds"); got == "" {
		t.Error("no notifyedge_forward_lag_seconds")
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]proc{"B": b, "A-restarted": c} {
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s still running 10 s after SIGTERM", name)
		}
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("%s exited %d after SIGTERM", name, code)
		}
	}

	e.recv.checkNoProblems()
	got := e.recv.snapshot()
	e.checkOrder(got)
	t.Logf("A killed after %d events; %d deliveries of 300 events (%d duplicates)", killedAt, len(got), len(got)-300)

	// Logs: one JSON object a line, and never the secret.
	key := strings.TrimPrefix(e.secret, "whsec_")
	for _, name := range []string{"A", "B", "A-restarted"} {
		raw, err := os.ReadFile(filepath.Join(logDir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(raw, []byte(key)) {
			t.Errorf("%s's log holds the secret", name)
		}
		sc := bufio.NewScanner(bytes.NewReader(raw))
		for sc.Scan() {
			if !json.Valid(sc.Bytes()) {
				t.Errorf("%s logged a line that is not JSON: %s", name, sc.Text())
			}
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func httpGet(addr, path string) string {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metric returns the value of the series named exactly so, or "".
func metric(addr, series string) string {
	v, ok := edgetest.Value(httpGet(addr, "/metrics"), series)
	if !ok {
		return ""
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// waitClosed waits for cmd on a goroutine of its own, then closes log; the
// returned channel closes when both are done.
func waitClosed(cmd *exec.Cmd, log io.Closer) <-chan struct{} {
	exited := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(exited) }()
	return exited
}
