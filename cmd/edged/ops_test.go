package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge/channel"
)

// proc is an edged process whose stderr is kept whole.
type proc struct {
	cmd         *exec.Cmd
	addr, admin string
	// exited is closed when the process has exited, with its error in
	// exitErr: any number of waiters may watch it.
	exited  chan struct{}
	exitErr error

	mu     sync.Mutex
	stderr bytes.Buffer
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// spawnEdged starts bin with cmdArgs and env (beside a clean environment)
// and returns at once: the process, and its start line's two addresses on
// ready once it listens.
func spawnEdged(t *testing.T, bin string, cmdArgs, env []string) (*proc, <-chan [2]string) {
	t.Helper()
	cmd := exec.Command(bin, cmdArgs...)
	cmd.Env = append(cleanEnv(), env...)
	pipe, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	ready := make(chan [2]string, 1)
	go p.scan(pipe, ready)
	go p.wait()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exited
	})
	return p, ready
}

// runEdged starts bin on free loopback ports with args and env and returns
// once it listens, with its two addresses from its start line.
func runEdged(t *testing.T, bin string, args, env []string) *proc {
	t.Helper()
	p, ready := spawnEdged(t, bin, append([]string{"-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0"}, args...), env)
	select {
	case a := <-ready:
		p.addr, p.admin = a[0], a[1]
	case <-p.exited:
		t.Fatalf("edged exited before listening: %v\n%s", p.exitErr, p.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("edged did not start\n%s", p.log())
	}
	return p
}

// scan keeps every stderr line and hands over the two addresses of the
// start line.
func (p *proc) scan(pipe io.Reader, ready chan<- [2]string) {
	sc := bufio.NewScanner(pipe)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		p.mu.Lock()
		p.stderr.WriteString(line + "\n")
		p.mu.Unlock()
		var start struct{ Msg, Listen, Admin string }
		if json.Unmarshal([]byte(line), &start) == nil && start.Msg == "edged listening" {
			ready <- [2]string{start.Listen, start.Admin}
		}
	}
}

// wait records the exit and closes exited.
func (p *proc) wait() {
	p.exitErr = p.cmd.Wait()
	close(p.exited)
}

// testClient is the client of these tests' requests to edged. It drops a
// keep-alive connection once it has been idle for half the public
// listener's default idle timeout (5 s): a POST sent on a connection the
// server is closing at that moment fails with EOF, and the transport does
// not retry a POST.
var testClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{IdleConnTimeout: 2500 * time.Millisecond}}

// signedPost is the POST of body to channel acme at addr, signed with
// secret now under webhook-id id. Every signed request of these tests is
// built here: the clock is read once, since the signature and the
// webhook-timestamp header must name the same second (read twice, they
// differ across a second boundary, and the edge answers 401).
func signedPost(addr, secret, id, body string) *http.Request {
	ts := time.Now().Unix()
	sig, _ := channel.SignWebhook(secret, id, ts, []byte(body))
	req, _ := http.NewRequest("POST", "http://"+addr+"/notify/acme", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", sig)
	return req
}

// callback delivers a fresh signed payment of order no on a connection of
// its own (a new connection is what a load balancer would refuse).
func callback(client *http.Client, addr, txn, no string) (int, error) {
	body := fmt.Sprintf(`{"channel_txn_id":%q,"event_type":"PAY_SUCCESS","order_no":%q,"amount":100,"currency":"CNY"}`, txn, no)
	resp, err := client.Do(signedPost(addr, secret, "m-"+txn, body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// A SIGTERM under traffic: /readyz turns 503 at once, the public listener
// refuses nothing until the drain delay ends, every request it took is
// answered, and the process exits cleanly. When the listener closed is
// what edged logged just before closing it: a refusal seen earlier is one
// it must not have made, however late a loaded machine ran the request.
func TestDrainUnderTraffic(t *testing.T) {
	bin := buildEdged(t)
	dbURL := durabletest.NewDatabase(t)
	const n = 20000
	seedPending(t, dbURL, "D-%05d", n)
	const delay = 1500 * time.Millisecond
	p := runEdged(t, bin, []string{"-drain-delay", delay.String(), "-drain", "5s", "-budget", "2s"},
		[]string{"DATABASE_URL=" + dbURL, "EDGE_SECRET_ACME=" + secret})
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

	// failure is a request that got no answer, and when the client saw so.
	type failure struct {
		i   int64
		at  time.Time
		err error
	}
	var next atomic.Int64
	var mu sync.Mutex
	var failed []failure
	var inflight []string // taken but not answered 200
	answered := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := next.Add(1) - 1
				if i >= n {
					return
				}
				code, err := callback(client, p.addr, fmt.Sprintf("TD%05d", i), fmt.Sprintf("D-%05d", i))
				at := time.Now()
				mu.Lock()
				switch {
				case err == nil && code == 200:
					answered++
				case err == nil:
					inflight = append(inflight, fmt.Sprintf("request %d: HTTP %d", i, code))
				default:
					failed = append(failed, failure{i, at, err})
				}
				mu.Unlock()
			}
		}()
	}
	wait.For(t, "100 callbacks answered before the SIGTERM", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return answered >= 100, fmt.Sprintf("%d answered, %d failed", answered, len(failed))
	})
	if code := readyz(t, p.admin); code != 200 {
		t.Fatalf("readyz before SIGTERM: %d", code)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	wait.For(t, "readyz 503 after SIGTERM (load balancers must stop routing first)", func() (bool, string) {
		code := readyz(t, p.admin)
		return code == 503, fmt.Sprint("readyz ", code)
	})
	select {
	case <-p.exited:
		if p.exitErr != nil {
			t.Errorf("edged exited with %v", p.exitErr)
		}
	case <-time.After(wait.Timeout):
		t.Fatalf("edged did not exit within %v of SIGTERM", wait.Timeout)
	}
	close(stop)
	wg.Wait()
	readinessOff, closed := logTime(t, p.log(), "draining: readiness off, still serving"), logTime(t, p.log(), "draining: listener closed, finishing in-flight requests")
	if served := closed.Sub(readinessOff); served < delay {
		t.Errorf("the listener closed %v after readiness went off, want the %v drain delay", served, delay)
	}
	for _, f := range failed {
		switch {
		case f.at.Before(closed):
			t.Errorf("request %d refused %v before the listener closed: %v", f.i, closed.Sub(f.at), f.err)
		// After the delay the listener closes: a new connection is
		// refused, and one still in the kernel's accept queue (never
		// taken by the server) is reset, which a client still writing
		// its request sees as a broken pipe. Load balancers stopped
		// routing during the delay, so none reaches a real node.
		case !errors.Is(f.err, syscall.ECONNREFUSED) && !errors.Is(f.err, syscall.ECONNRESET) && !errors.Is(f.err, syscall.EPIPE):
			t.Errorf("not answered: request %d: %v", f.i, f.err)
		}
	}
	for _, e := range inflight {
		t.Error("not answered: " + e)
	}
	t.Logf("%d callbacks answered around a SIGTERM with a %v drain delay, %d refused once the listener closed", answered, delay, len(failed))
}

// logTime returns the time of the first line of edged's JSON log whose
// msg is msg, failing the test without one.
func logTime(t *testing.T, log, msg string) time.Time {
	t.Helper()
	times := logTimes(log, msg)
	if len(times) == 0 {
		t.Fatalf("no %q line in the log:\n%s", msg, log)
	}
	return times[0]
}

// logTimes returns the times of the lines of edged's JSON log whose msg
// is msg.
func logTimes(log, msg string) []time.Time {
	var times []time.Time
	for _, line := range strings.Split(log, "\n") {
		var l struct {
			Time time.Time
			Msg  string
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg {
			times = append(times, l.Time)
		}
	}
	return times
}

func readyz(t *testing.T, admin string) int {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/readyz")
	if err != nil {
		return 0 // the admin listener is gone: not ready either
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Redis dies under traffic: everything edged writes to stderr, go-redis's
// own complaints included, is a JSON line.
func TestOneJSONLogStream(t *testing.T) {
	bin := buildEdged(t)
	rs, err := claimcachetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	dbURL := durabletest.NewDatabase(t)
	const n = 600
	seedPending(t, dbURL, "J-%04d", n)
	p := runEdged(t, bin, []string{"-drain-delay", "0s", "-budget", "2s"},
		[]string{"DATABASE_URL=" + dbURL, "REDIS_URL=" + rs.URL(), "EDGE_SECRET_ACME=" + secret})
	client := &http.Client{Timeout: 10 * time.Second}
	for i := range n {
		if i == n/3 {
			rs.Kill()
		}
		if code, err := callback(client, p.addr, fmt.Sprintf("TJ%04d", i), fmt.Sprintf("J-%04d", i)); err != nil || code != 200 {
			t.Fatalf("callback %d with Redis down: %d %v", i, code, err)
		}
	}
	// go-redis complains of the dead server on a callback's dial or the
	// readiness probe's PING (at most one a second): both go on until it
	// has said something.
	wait.For(t, "go-redis's complaint in the log", func() (bool, string) {
		readyz(t, p.admin)
		return strings.Contains(p.log(), `"msg":"redis client"`), p.log()
	})
	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.exited
	out := p.log()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	sawRedis := false
	for _, l := range lines {
		var v map[string]any
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Errorf("not a JSON line: %q", l)
			continue
		}
		if v["msg"] == "redis client" {
			sawRedis = true
		}
	}
	if !sawRedis {
		t.Errorf("go-redis said nothing while Redis was dead, or not through the JSON log:\n%s", out)
	}
}

// seedPending seeds n PENDING_PAY orders of 100 CNY named by format.
func seedPending(t *testing.T, dbURL, format string, n int) {
	t.Helper()
	if _, err := pgtemp.SeedPending(context.Background(), dbURL, format, n, 100); err != nil {
		t.Fatal(err)
	}
}
