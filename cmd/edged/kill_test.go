package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable/durabletest"
)

// startEdged runs the binary on dbURL and redisURL and returns its address
// once it listens.
func startEdged(t *testing.T, bin, dbURL, redisURL string) (*exec.Cmd, string) {
	t.Helper()
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "-listen", addr, "-admin-listen", "127.0.0.1:0", "-budget", "2s")
	cmd.Env = append(cleanEnv(), "DATABASE_URL="+dbURL, "REDIS_URL="+redisURL, "EDGE_SECRET_ACME="+secret)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "edged listening") {
				close(ready)
				io.Copy(io.Discard, stderr)
				return
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatal("edged did not start")
	}
	return cmd, addr
}

// A node killed with SIGKILL mid-load: every SUCCESS it answered is
// committed, nothing moved twice, and a new node answers every retry.
func TestNodeKilledMidLoad(t *testing.T) {
	bin := buildEdged(t)
	rs, err := claimcachetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	dbURL := durabletest.NewDatabase(t)
	const n = 3000
	seedPending(t, dbURL, "K-%05d", n)
	cmd, addr := startEdged(t, bin, dbURL, rs.URL())
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	deliver := func(addr string, i int) (int, string, error) {
		body := fmt.Sprintf(`{"channel_txn_id":"T%05d","event_type":"PAY_SUCCESS","order_no":"K-%05d","amount":100,"currency":"CNY"}`, i, i)
		id := fmt.Sprintf("m%d-%d", i, time.Now().UnixNano())
		resp, err := client.Do(signedPost(addr, secret, id, body))
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	var mu sync.Mutex
	succeeded := map[string]bool{}
	var sent atomic.Int64
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				code, body, err := deliver(addr, i)
				sent.Add(1)
				if err == nil && code == 200 && strings.HasPrefix(body, `{"code":"SUCCESS"`) {
					mu.Lock()
					succeeded[fmt.Sprintf("acme:T%05d:PAY_SUCCESS", i)] = true
					mu.Unlock()
				}
			}
		}()
	}
	go func() {
		for sent.Load() < n/3 {
			time.Sleep(time.Millisecond)
		}
		cmd.Process.Signal(syscall.SIGKILL) // mid-load, no drain
	}()
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	cmd.Wait()
	if len(succeeded) == 0 || len(succeeded) == n {
		t.Fatalf("%d of %d answered SUCCESS: the kill did not land mid-load", len(succeeded), n)
	}
	db, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	keys := make([]string, 0, len(succeeded))
	for k := range succeeded {
		keys = append(keys, k)
	}
	check := func(when string) {
		t.Helper()
		// Every SUCCESS answered is committed (a lost payment otherwise), no
		// order moved twice, one outbox row per applied claim.
		if err := durabletest.Invariants(context.Background(), db, "", keys); err != nil {
			t.Errorf("%s: %v", when, err)
		}
	}
	check("after the kill")

	// The channel retries everything on a new node: every key ends applied once.
	_, addr2 := startEdged(t, bin, dbURL, rs.URL())
	for i := range n {
		code, body, err := deliver(addr2, i)
		if err != nil || code != 200 || !strings.HasPrefix(body, `{"code":"SUCCESS","outcome":"applied"`) {
			t.Fatalf("retry %d: %d %s %v", i, code, body, err)
		}
	}
	var paid int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM biz_order WHERE status = 'PAID'`).Scan(&paid); err != nil {
		t.Fatal(err)
	}
	if paid != n {
		t.Errorf("%d of %d orders PAID after the retries", paid, n)
	}
	check("after the retries")
	t.Logf("%d of %d answered SUCCESS before the SIGKILL", len(keys), n)
}
