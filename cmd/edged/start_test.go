package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
)

func freeAddr(t *testing.T) (string, int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String(), l.Addr().(*net.TCPAddr).Port
}

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// edged started before its Postgres: the admin listener answers at once
// (healthz 200, readyz 503 "starting", notifyedge_starting 1), and once
// Postgres accepts, edged migrates, opens the public listener and serves a
// signed callback: its back-off is capped, so the first attempt after
// Postgres accepts (or the one then under way) is the one that succeeds,
// however long it waited before.
func TestStartWaitsForPostgres(t *testing.T) {
	bin := buildEdged(t)
	_, pgPort := freeAddr(t)
	adminAddr, _ := freeAddr(t)
	dbURL := fmt.Sprintf("postgres://postgres:s3cret-pw@127.0.0.1:%d/postgres?sslmode=disable", pgPort)
	p, ready := spawnEdged(t, bin, []string{"-listen", "127.0.0.1:0", "-admin-listen", adminAddr, "-start-timeout", "60s", "-drain-delay", "0s"},
		[]string{"DATABASE_URL=" + dbURL, "EDGE_SECRET_ACME=" + secret})

	wait.For(t, "healthz 200 while waiting for Postgres", func() (bool, string) {
		code, body := get("http://" + adminAddr + "/healthz")
		return code == 200, fmt.Sprint(code, " ", body)
	})
	if code, body := get("http://" + adminAddr + "/readyz"); code != 503 || !strings.Contains(body, `"postgres":"starting"`) {
		t.Errorf("readyz while waiting: %d %s", code, body)
	}
	if _, body := get("http://" + adminAddr + "/metrics"); !strings.Contains(body, "notifyedge_starting 1") {
		t.Errorf("metrics while waiting lack notifyedge_starting 1")
	}
	// Postgres comes up late: once the back-off reached its cap (100,
	// 200, 400, then 500 ms).
	wait.For(t, "5 attempts to reach Postgres", func() (bool, string) {
		n := len(logTimes(p.log(), "waiting for postgres"))
		return n >= 5, fmt.Sprintf("%d attempts", n)
	})
	c, err := pgtemp.Start(context.Background(), pgtemp.Options{TCP: true, Port: pgPort})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	accepting := time.Now()
	var addr string
	select {
	case a := <-ready:
		addr = a[0]
	case <-time.After(wait.Timeout):
		t.Fatalf("edged did not start after Postgres came up\n%s", p.log())
	}
	conn, err := pgx.Connect(context.Background(), c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `INSERT INTO biz_order (order_no, status, amount, currency) VALUES ('S-1', 'PENDING_PAY', 100, 'CNY')`); err != nil {
		t.Fatal(err)
	}
	if code, err := callback(&http.Client{Timeout: 5 * time.Second}, addr, "TS-1", "S-1"); err != nil || code != 200 {
		t.Fatalf("callback: %d %v", code, err)
	}
	served := time.Since(accepting)
	var late []time.Time
	for _, at := range logTimes(p.log(), "waiting for postgres") {
		if at.After(accepting) {
			late = append(late, at)
		}
	}
	if len(late) > 1 {
		t.Errorf("%d attempts failed after Postgres accepted, want at most the one under way:\n%s", len(late), p.log())
	}
	if code, body := get("http://" + adminAddr + "/readyz"); code != 200 {
		t.Errorf("readyz once ready: %d %s", code, body)
	}
	if _, body := get("http://" + adminAddr + "/metrics"); !strings.Contains(body, "notifyedge_starting 0") {
		t.Errorf("metrics once ready lack notifyedge_starting 0")
	}
	if strings.Contains(p.log(), "s3cret-pw") {
		t.Errorf("the password reached the log")
	}
	if !strings.Contains(p.log(), `"msg":"waiting for postgres"`) {
		t.Errorf("no waiting line logged:\n%s", p.log())
	}
	t.Logf("served a signed callback %v after Postgres accepted", served.Round(time.Millisecond))
}

// A Postgres that never comes: exit non-zero after -start-timeout with one
// message naming DATABASE_URL (password masked), the hosts and the last
// error; a malformed DATABASE_URL exits at once.
func TestStartTimeout(t *testing.T) {
	bin := buildEdged(t)
	_, p1 := freeAddr(t)
	_, p2 := freeAddr(t)
	dbURL := fmt.Sprintf("postgres://edge:s3cret-pw@127.0.0.1:%d,127.0.0.1:%d/notifyedge?sslmode=disable&target_session_attrs=read-write", p1, p2)
	cmd := exec.Command(bin, "-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-start-timeout", "3s")
	cmd.Env = append(cleanEnv(), "DATABASE_URL="+dbURL, "EDGE_SECRET_ACME="+secret)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err == nil {
		t.Fatalf("edged exited 0 without Postgres:\n%s", out)
	}
	if took < 2*time.Second || took > 15*time.Second {
		t.Errorf("exited after %v, want just past the 3 s start timeout", took)
	}
	text := string(out)
	for _, want := range []string{"DATABASE_URL=postgres://edge:xxxxx@", fmt.Sprintf("127.0.0.1:%d, 127.0.0.1:%d", p1, p2), "last error"} {
		if !strings.Contains(text, want) {
			t.Errorf("the exit message lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "s3cret-pw") {
		t.Errorf("the password reached the output:\n%s", text)
	}

	cmd = exec.Command(bin, "-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-start-timeout", "30s")
	cmd.Env = append(cleanEnv(), "DATABASE_URL=postgres://edge:s3cret-pw@host:notaport/db", "EDGE_SECRET_ACME="+secret)
	start = time.Now()
	out, err = cmd.CombinedOutput()
	// At once: not after the 30 s start timeout, nor any part of it.
	if err == nil || time.Since(start) > 15*time.Second || !strings.Contains(string(out), "malformed") || strings.Contains(string(out), "s3cret-pw") {
		t.Errorf("malformed DATABASE_URL: %v after %v:\n%s", err, time.Since(start), out)
	}
}

func TestRedactURL(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://u:pw@h:5432/db?sslmode=disable", "postgres://u:xxxxx@h:5432/db?sslmode=disable"},
		{"postgres://u:pw@h1:5432,h2:5432/db?target_session_attrs=read-write", "postgres://u:xxxxx@h1:5432,h2:5432/db?target_session_attrs=read-write"},
		{"postgres://u:pw@h:notaport/db", "postgres://u:xxxxx@h:notaport/db"},
		{"postgres://h/db?password=pw&user=u", "postgres://h/db?password=xxxxx&user=u"},
		{"host=h user=u password=pw dbname=d", "host=h user=u password=xxxxx dbname=d"},
		{"postgres://u@h/db", "postgres://u@h/db"},
	} {
		if got := redactURL(c.in); got != c.want || strings.Contains(got, "pw@") || strings.Contains(got, "=pw") {
			t.Errorf("redactURL(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// edged started with a two-host DATABASE_URL while the primary is down and
// its standby is being promoted: it keeps trying, finds the promoted one
// (target_session_attrs=read-write) and serves, without a restart.
func TestStartDuringPromotion(t *testing.T) {
	bin := buildEdged(t)
	ctx := context.Background()
	primary, err := pgtemp.Start(ctx, pgtemp.Options{TCP: true})
	if err != nil {
		t.Fatal(err)
	}
	standby, err := pgtemp.StartStandby(ctx, primary, pgtemp.Options{TCP: true})
	if err != nil {
		primary.Stop()
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() })
	if err := primary.Stop(); err != nil {
		t.Fatal(err)
	}
	dbURL := fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&target_session_attrs=read-write",
		primary.TCPAddr(), standby.TCPAddr())
	p, ready := spawnEdged(t, bin, []string{"-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-start-timeout", "60s", "-drain-delay", "0s"},
		[]string{"DATABASE_URL=" + dbURL, "EDGE_SECRET_ACME=" + secret})
	wait.For(t, "an attempt while the standby is read-only", func() (bool, string) {
		return strings.Contains(p.log(), `"msg":"waiting for postgres"`), p.log()
	})
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	var addr string
	select {
	case a := <-ready:
		addr = a[0]
	case <-p.exited:
		t.Fatalf("edged exited: %v\n%s", p.exitErr, p.log())
	case <-time.After(wait.Timeout):
		t.Fatalf("edged did not come up on the promoted standby\n%s", p.log())
	}
	conn, err := pgx.Connect(ctx, standby.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO biz_order (order_no, status, amount, currency) VALUES ('P-1', 'PENDING_PAY', 100, 'CNY')`); err != nil {
		t.Fatal(err)
	}
	if code, err := callback(&http.Client{Timeout: 5 * time.Second}, addr, "TP-1", "P-1"); err != nil || code != 200 {
		t.Fatalf("callback on the promoted standby: %d %v", code, err)
	}
	if n := strings.Count(p.log(), `"msg":"waiting for postgres"`); n == 0 {
		t.Errorf("edged did not wait: it must have tried while the standby was read-only")
	}
}

// Errors no wait fixes end the start at once, non-zero, with one sentence
// that says what to fix: a role that does not exist, a database that does
// not exist, a user that may not create the schema's tables, a schema
// migrated by a newer build. None waits for -start-timeout.
func TestPermanentStartErrors(t *testing.T) {
	bin := buildEdged(t)
	ctx := context.Background()
	cluster, err := pgtemp.Start(ctx, pgtemp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.Stop() })
	admin, err := pgx.Connect(ctx, cluster.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, q := range []string{`CREATE ROLE lowpriv LOGIN`, `CREATE DATABASE owned`, `CREATE DATABASE newer`} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := durable.Migrate(ctx, cluster.URL("newer")); err != nil {
		t.Fatal(err)
	}
	newer, err := pgx.Connect(ctx, cluster.URL("newer"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newer.Exec(ctx, `UPDATE notifyedge_schema_version SET version = 99`); err != nil {
		t.Fatal(err)
	}
	newer.Close(ctx)
	asUser := func(user, db string) string {
		return strings.Replace(cluster.URL(db), "postgres://postgres@", "postgres://"+user+"@", 1)
	}
	for _, c := range []struct {
		name, url string
		want      []string
	}{
		{"a role that does not exist", asUser("nobody", "postgres"), []string{"28000", "nobody", "DATABASE_URL"}},
		{"a database that does not exist", cluster.URL("nosuchdb"), []string{"3D000", "does not exist", "CREATE DATABASE"}},
		{"no privilege on schema public", asUser("lowpriv", "owned"), []string{"42501", "lowpriv", "GRANT CREATE, USAGE ON SCHEMA public TO lowpriv"}},
		{"a schema from a newer build", cluster.URL("newer"), []string{"newer build", "99"}},
	} {
		cmd := exec.Command(bin, "-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-start-timeout", "120s")
		cmd.Env = append(cleanEnv(), "DATABASE_URL="+c.url, "EDGE_SECRET_ACME="+secret)
		start := time.Now()
		out, err := cmd.CombinedOutput()
		took := time.Since(start)
		if err == nil {
			t.Errorf("%s: edged exited 0", c.name)
			continue
		}
		if took > 60*time.Second {
			t.Errorf("%s: exited after %v: it waited", c.name, took)
		}
		for _, w := range c.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s: the exit message lacks %q:\n%s", c.name, w, out)
			}
		}
		t.Logf("%s:\n%s", c.name, out)
		if strings.Contains(string(out), "waiting for postgres") {
			t.Errorf("%s: waited as if Postgres would change its mind:\n%s", c.name, out)
		}
	}
}
