package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge/edgetest"
)

// quickStart is the production quick start's text, read from the page.
func quickStart(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "\n## Production quick start\n")
	if start < 0 {
		t.Fatal("README.md has no Production quick start")
	}
	end := strings.Index(text[start+1:], "\n## ")
	return text[start : start+1+end]
}

// block returns the fenced block of the quick start whose first line is
// first (a "# /etc/..." label), or that holds marker.
func block(t *testing.T, text, marker string) string {
	t.Helper()
	for _, m := range regexp.MustCompile("(?ms)^```[a-z]*\n(.*?)^```").FindAllStringSubmatch(text, -1) {
		if strings.Contains(m[1], marker) {
			return m[1]
		}
	}
	t.Fatalf("the quick start has no block with %q", marker)
	return ""
}

// envFile reads a systemd EnvironmentFile: KEY=VALUE lines, # comments.
func envFile(text string) []string {
	var env []string
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || !strings.Contains(line, "=") {
			continue
		}
		env = append(env, line)
	}
	return env
}

// TestQuickStart follows the production quick start with its own words:
// the SQL that makes the role and database, the environment file, both
// services' units (their EnvironmentFile and ExecStart, run as systemd
// would), the forwarder's environment, and the page's first check. What
// this machine has not got is put in by name, and only that: the hosts
// (db1.internal, the two Redis, 10.0.1.5, orders.internal,
// notify.example.com) become loopback servers the test starts (two
// redis-server with the page's passwords, a Postgres, the example
// receiver), /etc/notifyedge a temporary directory, /usr/local/bin the
// binaries built from this tree, the Postgres TLS settings plain TCP (the
// test Postgres has no certificate), and the channels' keys staging
// stand-ins from edged secret. It ends with an order of each channel kind
// registered, paid by a signed callback, and its ORDER_PAID received and
// verified by the receiver.
func TestQuickStart(t *testing.T) {
	page := quickStart(t)
	ctx := context.Background()
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc")
	bin := filepath.Join(dir, "bin")
	for _, d := range []string{etc, filepath.Join(etc, "secrets"), bin} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []struct{ out, pkg string }{{"edged", "."}, {"forwarder", "../forwarder"}, {"examplereceiver", "../forwarder/examplereceiver"}} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, b.out), b.pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}

	// 2. The database: the page's SQL, as a superuser.
	cluster, err := pgtemp.Start(ctx, pgtemp.Options{TCP: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.Stop() })
	super, err := pgx.Connect(ctx, cluster.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range strings.Split(block(t, page, "CREATE ROLE notifyedge"), ";") {
		if stmt = strings.TrimSpace(regexp.MustCompile(`(?m)^--.*$`).ReplaceAllString(stmt, "")); stmt != "" {
			if _, err := super.Exec(ctx, stmt); err != nil {
				t.Fatalf("the page's SQL %q: %v", stmt, err)
			}
		}
	}
	if _, err := super.Exec(ctx, `CREATE DATABASE receiver`); err != nil {
		t.Fatal(err)
	}
	super.Close(ctx)

	// 3. Redis: the claim cache and the outbox stream, with the page's
	// passwords.
	cache, err := claimcachetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cache.Stop)
	stream, err := claimcachetest.Start("--appendonly", "yes")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stream.Stop)
	for srv, pw := range map[*claimcachetest.Server]string{cache: "cache-password", stream: "stream-password"} {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		err := c.ConfigSet(ctx, "requirepass", pw).Err()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}

	_, pub := freeAddr(t)
	_, adm := freeAddr(t)
	_, fwdAdm := freeAddr(t)
	_, recv := freeAddr(t)
	_, deadDB := freeAddr(t)
	hosts := strings.NewReplacer(
		"db1.internal:5432", cluster.TCPAddr(), "db2.internal:5432", fmt.Sprintf("127.0.0.1:%d", deadDB),
		"sslmode=verify-full&sslrootcert=/etc/notifyedge/pg-ca.crt", "sslmode=disable",
		"cache-redis.internal:6379", cache.Addr(), "stream-redis.internal:6379", stream.Addr(),
		"10.0.1.5:8080", fmt.Sprintf("127.0.0.1:%d", pub), "10.0.1.5:9090", fmt.Sprintf("127.0.0.1:%d", adm),
		"10.0.1.5:9091", fmt.Sprintf("127.0.0.1:%d", fwdAdm),
		"https://orders.internal/notifyedge", fmt.Sprintf("http://127.0.0.1:%d/notifyedge", recv),
		"https://notify.example.com", fmt.Sprintf("http://127.0.0.1:%d", pub),
		"/etc/notifyedge", etc, "/usr/local/bin/", bin+"/",
	)

	// 4. The environment, and the secrets its files hold: what the page
	// says edged secret makes, and the channels' stand-ins.
	env := envFile(hosts.Replace(block(t, page, "# /etc/notifyedge/edged.env")))
	get := func(k string) string {
		for _, kv := range env {
			if key, v, _ := strings.Cut(kv, "="); key == k {
				return v
			}
		}
		t.Fatalf("the environment file sets no %s", k)
		return ""
	}
	tokens := secretEnv(t, "-kind", "token")
	for i, kv := range env { // the page's placeholders "3f0c..." become real tokens
		if k, _, _ := strings.Cut(kv, "="); tokens[k] != "" {
			env[i] = k + "=" + tokens[k]
		}
	}
	acme := secretEnv(t, "-kind", "generic", "-channel", "acme")["EDGE_SECRET_ACME"]
	wx := secretEnv(t, "-kind", "wechatpay", "-channel", "wx", "-out", filepath.Join(dir, "wx.pem"))
	ali := secretEnv(t, "-kind", "alipay", "-channel", "ali", "-out", filepath.Join(dir, "ali.pem"))
	if err := os.MkdirAll(filepath.Dir(get("EDGE_CHANNEL_WX_PLATFORM_KEYS_FILE")), 0o750); err != nil {
		t.Fatal(err)
	}
	for path, content := range map[string]string{
		get("EDGE_SECRETFILE_ACME"): acme, get("EDGE_SECRETFILE_WX"): wx["EDGE_SECRET_WX"],
		get("EDGE_CHANNEL_WX_PLATFORM_KEYS_FILE"): wx["EDGE_CHANNEL_WX_PLATFORM_KEYS"], get("EDGE_SECRETFILE_ALI"): ali["EDGE_SECRET_ALI"],
	} {
		if err := os.WriteFile(path, []byte(content+"\n"), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	envPath := filepath.Join(etc, "edged.env")
	os.WriteFile(envPath, []byte(strings.Join(env, "\n")+"\n"), 0o640)

	// 5. The edged service, as systemd runs it: its EnvironmentFile, its
	// ExecStart.
	runUnit := func(unit string) *exec.Cmd {
		t.Helper()
		u := hosts.Replace(block(t, page, unit))
		file := regexp.MustCompile(`(?m)^EnvironmentFile=(.+)$`).FindStringSubmatch(u)
		start := regexp.MustCompile(`(?m)^ExecStart=(.+)$`).FindStringSubmatch(u)
		if file == nil || start == nil {
			t.Fatalf("%s: no EnvironmentFile or ExecStart", unit)
		}
		text, err := os.ReadFile(file[1])
		if err != nil {
			t.Fatal(err)
		}
		argv := strings.Fields(start[1])
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(cleanEnv(), envFile(string(text))...)
		logs := &edgetest.Log{}
		cmd.Stdout, cmd.Stderr = logs, logs
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
			if t.Failed() {
				t.Logf("%s's log:\n%s", unit, logs.String())
			}
		})
		return cmd
	}
	runUnit("# /etc/systemd/system/notifyedge.service")

	// 6. The forwarder: its environment, its secret from forwarder secret,
	// its unit; the receiver at FORWARD_URL checks every signature.
	fenv := hosts.Replace(block(t, page, "# /etc/notifyedge/forwarder.env"))
	secretOut, err := exec.Command(filepath.Join(bin, "forwarder"), "secret").Output()
	if err != nil {
		t.Fatal(err)
	}
	forwardSecret := strings.TrimSpace(string(secretOut))
	for _, kv := range envFile(fenv) {
		if k, v, _ := strings.Cut(kv, "="); k == "FORWARD_SECRET_FILE" {
			os.WriteFile(v, []byte(forwardSecret+"\n"), 0o640)
		}
	}
	os.WriteFile(filepath.Join(etc, "forwarder.env"), []byte(fenv), 0o640)
	receiver := exec.Command(filepath.Join(bin, "examplereceiver"))
	receiver.Env = append(cleanEnv(), "DATABASE_URL="+cluster.URL("receiver"), "RECEIVER_SECRETS="+forwardSecret,
		fmt.Sprintf("RECEIVER_LISTEN=127.0.0.1:%d", recv))
	receiver.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := receiver.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { receiver.Process.Kill(); receiver.Wait() })
	runUnit("# /etc/systemd/system/notifyedge-forwarder.service")

	// 8. Start and check: the page's readiness check, then its first
	// check end to end, each command run as written.
	shell := func(script string) string {
		t.Helper()
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
		cmd.Env = append(cleanEnv(), "PATH="+bin+":"+os.Getenv("PATH"), "EDGE_ORDERS_TOKEN="+tokens["EDGE_ORDERS_TOKEN"])
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
		return string(out)
	}
	readyz := regexp.MustCompile(`(?m)^curl -s http://\S+/readyz.*$`).FindString(hosts.Replace(block(t, page, "systemctl daemon-reload")))
	if readyz == "" {
		t.Fatal("the quick start's check has no readyz line")
	}
	readyz = strings.SplitN(readyz, "#", 2)[0]
	wait.For(t, "edged ready, as the page checks it", func() (bool, string) {
		cmd := exec.Command("bash", "-c", readyz)
		out, _ := cmd.CombinedOutput()
		return strings.Contains(string(out), `"postgres":"ok"`) && strings.Contains(string(out), `"redis":"ok"`), string(out)
	})
	first := hosts.Replace(block(t, page, "CHECK-1"))
	if out := shell(first); !strings.Contains(out, `"status":"PAID"`) || !strings.Contains(out, "ORDER_PAID") {
		t.Fatalf("the page's first check ended:\n%s", out)
	}

	// A callback of each other kind, made by edged sign from the staging
	// keys, for orders registered as the page says.
	serial, _, _ := strings.Cut(wx["EDGE_CHANNEL_WX_PLATFORM_KEYS"], "=")
	admin := fmt.Sprintf("http://127.0.0.1:%d", adm)
	public := fmt.Sprintf("http://127.0.0.1:%d", pub)
	for _, c := range []struct{ no, sign string }{
		{"QS-WX-1", fmt.Sprintf(`edged sign -kind wechatpay -secret %s -key %s -serial %s -url %s/notify/wx -body '{"mchid":"%s","appid":"%s","out_trade_no":"QS-WX-1","transaction_id":"4200000000009001","trade_state":"SUCCESS","amount":{"total":1,"currency":"CNY"}}'`,
			wx["EDGE_SECRET_WX"], filepath.Join(dir, "wx.pem"), serial, public, get("EDGE_CHANNEL_WX_MCHID"), get("EDGE_CHANNEL_WX_APPID"))},
		{"QS-ALI-1", fmt.Sprintf(`edged sign -kind alipay -key %s -url %s/notify/ali -body '{"trade_no":"2026120622009001","out_trade_no":"QS-ALI-1","trade_status":"TRADE_SUCCESS","total_amount":"0.01","app_id":"%s","seller_id":"%s"}'`,
			filepath.Join(dir, "ali.pem"), public, get("EDGE_CHANNEL_ALI_APP_ID"), get("EDGE_CHANNEL_ALI_SELLER_ID"))},
	} {
		out := shell(fmt.Sprintf(`curl -sf -X PUT -H "Authorization: Bearer $EDGE_ORDERS_TOKEN" %s/orders/%s -d '{"amount":1,"currency":"CNY"}' >/dev/null
eval "$(%s)"; echo
curl -s -H "Authorization: Bearer $EDGE_ORDERS_TOKEN" %s/orders/%s`, admin, c.no, c.sign, admin, c.no))
		if !strings.Contains(out, `"status":"PAID"`) {
			t.Errorf("%s:\n%s", c.no, out)
		}
	}

	// Every ORDER_PAID reached the receiver, which verified its signature.
	rdb, err := pgx.Connect(ctx, cluster.URL("receiver"))
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close(ctx)
	wait.For(t, "the three ORDER_PAID at the receiver", func() (bool, string) {
		var n int
		rdb.QueryRow(ctx, `SELECT count(*) FROM webhook_inbox WHERE type = 'ORDER_PAID' AND order_no IN ('CHECK-1', 'QS-WX-1', 'QS-ALI-1')`).Scan(&n)
		return n == 3, fmt.Sprintf("%d received", n)
	})
}
