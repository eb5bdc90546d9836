package bench

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestHAWindows(t *testing.T) {
	s := time.Second
	at := func(x float64) time.Duration { return time.Duration(x * float64(s)) }
	acks := []*haAck{
		{at: at(5), again: at(35)}, // acknowledged before A, applied anew after it: lost to A
		{at: at(12)},
		{at: at(25)},
	}
	attempts := []haAttempt{
		{sent: at(10.4), done: at(10.5), code: http.StatusServiceUnavailable, retryAfter: true}, // edged's 503 to a re-delivery
		{sent: at(10.6), done: at(10.7), code: http.StatusServiceUnavailable, retryAfter: true}, // and another
		{sent: at(10.9), done: at(11), first: true, code: http.StatusServiceUnavailable},        // haproxy's
		{sent: at(11.9), done: at(12), code: http.StatusOK, replayed: true, success: true},      // a replay in the outage
		{sent: at(12.4), done: at(12.5), first: true},                                           // no answer
		{sent: at(13), done: at(13.1), first: true, code: http.StatusOK, success: true},         // the outage ends
	}
	for sec := 14; sec < 50; sec++ {
		attempts = append(attempts, haAttempt{sent: at(float64(sec)), done: at(float64(sec) + 0.1), first: true, code: http.StatusOK, success: true})
	}
	// A's procedure began at 9 s (one refusal before its moment, counted
	// in its window but not timing its outage).
	attempts = append(attempts, haAttempt{sent: at(9.4), done: at(9.5), code: http.StatusServiceUnavailable, retryAfter: true})
	marks := []haMark{{what: "A", begin: at(9), at: at(10)}, {what: "B", begin: at(30), at: at(30)}}
	got := haWindows(attempts, acks, marks, at(50))
	if len(got) != 2 {
		t.Fatalf("%d windows, want 2", len(got))
	}
	a, b := got[0], got[1]
	want := HAFault{What: "A", At: at(10), End: at(30), Acked: 2, Lost: 1, LBRefused: 1, EdgeRefused: 3, Failed: 1,
		ReplaysInOutage: 1, RefusedInOutage: 2, OutageAt: at(0.5), Outage: at(2.6), FullRate: 3 * s}
	if a != want {
		t.Errorf("A:\n got %+v\nwant %+v", a, want)
	}
	// B: nothing failed, every second answered.
	want = HAFault{What: "B", At: at(30), End: at(50), OutageAt: -1, Outage: -1}
	if b != want {
		t.Errorf("B:\n got %+v\nwant %+v", b, want)
	}
}

// The configuration files the docs show render with every placeholder
// filled, hold the settings the failover window is explained by, and are
// valid to haproxy and Patroni where they are installed.
func TestHAConfigsRender(t *testing.T) {
	dir := t.TempDir()
	h := &haStack{dir: dir}
	for i := range 3 {
		h.etcd = append(h.etcd, &haEtcd{Name: "etcd" + string(rune('1'+i)), DataDir: filepath.Join(dir, "e"), ClientAddr: freeAddr(), PeerAddr: freeAddr(), InitialCluster: "etcd1=http://127.0.0.1:1"})
		h.patroni = append(h.patroni, &haPatroni{Name: "pg" + string(rune('1'+i)), RestAddr: "127.0.0.1:8008", RestPort: "8008", PgAddr: "127.0.0.1:5432",
			Dir: dir, DataDir: filepath.Join(dir, "data"), BinDir: "/usr/lib/postgresql/15/bin", EtcdHosts: "127.0.0.1:2379", Synchronous: true})
		h.edged = append(h.edged, &haEdged{Name: "edged" + string(rune('1'+i)), Addr: "127.0.0.1:8080", AdminPort: "9090"})
	}
	files := map[string]struct {
		data any
		want []string
	}{
		"etcd.yml":    {h.etcd[0], []string{"name: etcd1", "enable-grpc-gateway: true", "election-timeout: 1000"}},
		"patroni.yml": {h.patroni[0], []string{"ttl: 20", "loop_wait: 2", "retry_timeout: 5", "synchronous_mode: true", "etcd3:", "use_pg_rewind: true"}},
		"haproxy.cfg": {haProxyConfig{PgFront: "127.0.0.1:5000", EdgeFront: "127.0.0.1:8000", Patroni: h.patroni, Edged: h.edged},
			[]string{"option httpchk OPTIONS /primary", "inter 1s fall 2 rise 1 on-marked-down shutdown-sessions", "server pg3 127.0.0.1:5432 check port 8008", "http-check expect status 200"}},
	}
	for name, f := range files {
		path := filepath.Join(dir, name)
		if err := renderHA(name, path, f.data); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "{{") || strings.Contains(string(b), "<no value>") {
			t.Errorf("%s: a placeholder left:\n%s", name, b)
		}
		for _, w := range f.want {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s lacks %q", name, w)
			}
		}
	}
	if err := renderHA("patroni.yml", filepath.Join(dir, "x"), h.etcd[0]); err == nil {
		t.Error("patroni.yml rendered from an etcd member: want an error for the fields it lacks")
	}
	// The check of the readiness before shared outages were told apart.
	before := filepath.Join(dir, "before.cfg")
	if err := renderHA("haproxy.cfg", before, haProxyConfig{PgFront: "127.0.0.1:5000", EdgeFront: "127.0.0.1:8000",
		Patroni: h.patroni, Edged: h.edged, LeaveOnAnyOutage: true}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(before); !strings.Contains(string(b), `http-check expect string '"postgres":"ok"'`) {
		t.Errorf("the before check is missing:\n%s", b)
	}
	for _, cfg := range []string{filepath.Join(dir, "haproxy.cfg"), before} {
		if _, err := exec.LookPath("haproxy"); err == nil {
			if out, err := exec.Command("haproxy", "-c", "-f", cfg).CombinedOutput(); err != nil {
				t.Errorf("haproxy -c %s: %v\n%s", filepath.Base(cfg), err, out)
			}
		}
	}
}

// childPIDs finds a process's children by command line: the WAL senders
// the HA scenario stops are found this way.
func TestChildPIDs(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	got := childPIDs(os.Getpid(), "sleep")
	if len(got) != 1 || got[0] != cmd.Process.Pid {
		t.Errorf("childPIDs(us, sleep) = %v, want [%d]", got, cmd.Process.Pid)
	}
	if got := childPIDs(os.Getpid(), "walsender"); len(got) != 0 {
		t.Errorf("childPIDs(us, walsender) = %v, want none", got)
	}
	if got := childPIDs(0, "sleep"); got != nil {
		t.Errorf("childPIDs(0) = %v, want nil", got)
	}
}
