package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge/channel/channeltest"
)

// rotation is the load of TestReloadRotatesUnderLoad: a generic channel's
// and a WeChat Pay channel's callbacks, each signed with the credentials
// in use at the moment, every answer counted.
type rotation struct {
	addr      string
	mu        sync.Mutex
	creds     *signingKeys // what callbacks are signed with from now on
	seq       atomic.Int64
	sent, bad atomic.Int64
	firstBad  atomic.Pointer[string]
}

// signingKeys are what the load signs with: a Standard Webhooks secret and
// a WeChat Pay platform key, and how many callbacks signed with them are
// on their way (under rotation.mu).
type signingKeys struct {
	generic  string
	wechat   *channeltest.WeChatPaySigner
	inflight int
}

// use makes the load sign with c from now on and returns the keys it
// signed with until then.
func (r *rotation) use(c *signingKeys) (old *signingKeys) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old, r.creds = r.creds, c
	return old
}

// inflight is how many callbacks signed with c have not been answered.
func (r *rotation) inflight(c *signingKeys) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return c.inflight
}

func (r *rotation) send(client *http.Client) {
	r.mu.Lock()
	c := r.creds
	c.inflight++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		c.inflight--
		r.mu.Unlock()
	}()
	n := r.seq.Add(1)
	order := fmt.Sprintf("R-%06d", n%2000)
	var req *http.Request
	if n%2 == 0 {
		body := fmt.Sprintf(`{"channel_txn_id":"G%d","event_type":"PAY_SUCCESS","order_no":%q,"amount":5,"currency":"CNY"}`, n, order)
		req = signedPost(r.addr, c.generic, fmt.Sprint("m", n), body)
	} else {
		h, body, _ := c.wechat.Notify("TRANSACTION.SUCCESS", map[string]any{"mchid": "1900000109", "appid": "wxd678efh567hg6787",
			"out_trade_no": order, "transaction_id": fmt.Sprint("W", n), "trade_type": "JSAPI", "trade_state": "SUCCESS",
			"amount": map[string]any{"total": 5, "payer_total": 5, "currency": "CNY", "payer_currency": "CNY"}}, time.Now())
		req, _ = http.NewRequest("POST", "http://"+r.addr+"/notify/wx", strings.NewReader(string(body)))
		for k, v := range h {
			req.Header.Set(k, v)
		}
	}
	r.sent.Add(1)
	resp, err := client.Do(req)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// 200 applied or skipped; 404 would be an unknown order (not seeded):
	// every order is, so anything but 200 is a refusal.
	if err != nil || resp.StatusCode != 200 {
		r.bad.Add(1)
		msg := fmt.Sprint(err)
		if err == nil {
			msg = resp.Status + " on " + req.URL.Path
		}
		r.firstBad.CompareAndSwap(nil, &msg)
	}
}

// Credentials rotate without a restart: a Standard Webhooks secret file
// and a WeChat Pay certificate directory change under load; between
// reloads, old and new are both accepted while both are listed, then only
// the new; no callback of the load is refused on the way. A reload that
// fails keeps the old set and says why.
func TestReloadRotatesUnderLoad(t *testing.T) {
	dbURL := durabletest.NewDatabase(t)
	var orders []pgtemp.Order
	for i := range 2000 {
		orders = append(orders, pgtemp.Order{No: fmt.Sprintf("R-%06d", i), Status: "PENDING_PAY", Amount: 5, Currency: "CNY"})
	}
	if err := pgtemp.SeedOrders(context.Background(), dbURL, orders); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	secretA := "whsec_" + base64.StdEncoding.EncodeToString([]byte("secret A, twenty-four bytes+"))
	secretB := base64.StdEncoding.EncodeToString([]byte("secret B, without its prefix")) // bare: also a Standard Webhooks secret
	secretFile, certDir := filepath.Join(dir, "acme.secret"), filepath.Join(dir, "wx-certs")
	os.Mkdir(certDir, 0o700)
	write := func(path, s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old, _ := channeltest.NewWeChatPaySigner()
	fresh, _ := channeltest.NewWeChatPaySigner()
	fresh.APIv3Key = old.APIv3Key // one merchant: one APIv3 key, two platform certificates
	certFile := func(s *channeltest.WeChatPaySigner) string {
		return filepath.Join(certDir, "wechatpay_"+s.Serial+".pem")
	}
	for _, s := range []*channeltest.WeChatPaySigner{old} {
		der, err := s.Certificate(time.Now().Add(365 * 24 * time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		write(certFile(s), pemBlock("CERTIFICATE", der))
	}
	write(secretFile, secretA)
	env := []string{"DATABASE_URL=" + dbURL, "EDGE_ADMIN_TOKEN=tok",
		"EDGE_SECRETFILE_ACME=" + secretFile,
		"EDGE_SECRET_WX=" + old.APIv3Key, "EDGE_CHANNEL_WX_KIND=wechatpay", "EDGE_CHANNEL_WX_PLATFORM_KEYS_FILE=" + certDir,
		"EDGE_CHANNEL_WX_MCHID=1900000109"}
	cfg, err := ParseConfig([]string{"-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-budget", "2s"}, env)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMain(cfg)
	m.Env = env
	m.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	load := &rotation{addr: m.Addr(), creds: &signingKeys{generic: secretA, wechat: old}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go load.run(&wg, stop)
	}
	reload := func(wantOK bool) string {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+m.AdminAddr()+"/reload", nil)
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if (resp.StatusCode == 200) != wantOK {
			t.Fatalf("reload: %d %s", resp.StatusCode, body)
		}
		return string(body)
	}
	// settle lets the load run on under the credentials in force: 50
	// callbacks more.
	settle := func() {
		t.Helper()
		from := load.sent.Load()
		wait.For(t, "50 callbacks more of the load", func() (bool, string) {
			sent := load.sent.Load()
			return sent >= from+50, fmt.Sprintf("%d sent, %d before", sent, from)
		})
	}
	// rotate makes the load sign with c, and returns once no callback
	// signed with the credentials before is on its way: only then may
	// those be removed.
	rotate := func(c *signingKeys) {
		t.Helper()
		before := load.use(c)
		wait.For(t, "the callbacks signed with the old credentials answered", func() (bool, string) {
			n := load.inflight(before)
			return n == 0, fmt.Sprintf("%d on their way", n)
		})
	}
	refused := func(secret string) bool { // a callback signed with secret alone
		return sendOnce(t, m.Addr(), secret) == 401
	}

	settle()
	// Add the new credentials beside the old ones: both are accepted.
	write(secretFile, secretA+"\n"+secretB+"\n")
	der, _ := fresh.Certificate(time.Now().Add(365 * 24 * time.Hour))
	write(certFile(fresh), pemBlock("CERTIFICATE", der))
	reload(true)
	if refused(secretA) || refused(secretB) {
		t.Fatal("while both secrets are listed, both must be accepted")
	}
	rotate(&signingKeys{generic: secretB, wechat: fresh})
	settle()
	// Remove the old ones: only the new are accepted.
	write(secretFile, secretB)
	os.Remove(certFile(old))
	reload(true)
	if !refused(secretA) || refused(secretB) {
		t.Fatal("after the old secret went, only the new one may be accepted")
	}
	if r := sendWxOnce(t, m.Addr(), old); r != 401 {
		t.Fatalf("a callback signed by the removed certificate: %d, want 401", r)
	}
	// A broken file: the reload fails, the set in force stays.
	write(secretFile, "not a secret")
	if body := reload(false); !strings.Contains(body, "EDGE_SECRETFILE_ACME") && !strings.Contains(body, "channel acme") {
		t.Errorf("failed reload's answer names neither the variable nor the channel: %s", body)
	}
	if refused(secretB) {
		t.Fatal("a failed reload changed the set in force")
	}
	settle()
	close(stop)
	wg.Wait()
	if load.bad.Load() > 0 {
		t.Fatalf("%d of %d callbacks of the load refused during the rotation (first: %s)", load.bad.Load(), load.sent.Load(), *load.firstBad.Load())
	}
	page := scrape(t, "http://"+m.AdminAddr()+"/metrics")
	if !strings.Contains(page, `notifyedge_config_reloads_total{result="ok"} 2`) || !strings.Contains(page, `notifyedge_config_reloads_total{result="error"} 1`) {
		t.Errorf("reload counters:\n%s", grepLines(page, "config_reloads"))
	}
	if !strings.Contains(page, `notifyedge_channel_cert_not_after_seconds{channel="wx",serial="`+fresh.Serial+`"}`) ||
		strings.Contains(page, `serial="`+old.Serial+`"`) {
		t.Errorf("certificate gauge:\n%s", grepLines(page, "cert_not_after"))
	}
	t.Logf("%d callbacks through two rotations, none refused", load.sent.Load())
}

func (r *rotation) run(wg *sync.WaitGroup, stop <-chan struct{}) {
	defer wg.Done()
	client := &http.Client{Timeout: 10 * time.Second}
	for {
		select {
		case <-stop:
			return
		default:
			r.send(client)
		}
	}
}

// sendOnce posts one generic callback signed with secret and returns the
// status.
func sendOnce(t *testing.T, addr, secret string) int {
	t.Helper()
	body := `{"channel_txn_id":"probe","event_type":"PAY_SUCCESS","order_no":"R-000001","amount":5,"currency":"CNY"}`
	resp, err := testClient.Do(signedPost(addr, secret, "probe", body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// sendWxOnce posts one WeChat Pay callback signed by s.
func sendWxOnce(t *testing.T, addr string, s *channeltest.WeChatPaySigner) int {
	t.Helper()
	h, body, err := s.Notify("TRANSACTION.SUCCESS", map[string]any{"mchid": "1900000109", "appid": "x",
		"out_trade_no": "R-000001", "transaction_id": "Wprobe", "trade_type": "JSAPI", "trade_state": "SUCCESS",
		"amount": map[string]any{"total": 5, "payer_total": 5, "currency": "CNY", "payer_currency": "CNY"}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", "http://"+addr+"/notify/wx", strings.NewReader(string(body)))
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// SIGHUP reloads like POST /reload: the edged binary, a secret file
// rotated, then the signal.
func TestSIGHUPReloads(t *testing.T) {
	bin := buildEdged(t)
	dbURL := durabletest.NewDatabase(t)
	if err := pgtemp.SeedOrders(context.Background(), dbURL, []pgtemp.Order{
		{No: "R-000001", Status: "PENDING_PAY", Amount: 5, Currency: "CNY"}}); err != nil {
		t.Fatal(err)
	}
	secretA := "whsec_" + base64.StdEncoding.EncodeToString([]byte("secret A, twenty-four bytes+"))
	secretB := "whsec_" + base64.StdEncoding.EncodeToString([]byte("secret B, twenty-four bytes+"))
	file := filepath.Join(t.TempDir(), "acme.secret")
	os.WriteFile(file, []byte(secretA), 0o600)
	p := runEdged(t, bin, nil, []string{"DATABASE_URL=" + dbURL, "EDGE_SECRETFILE_ACME=" + file})
	if s := sendOnce(t, p.addr, secretA); s != 200 {
		t.Fatalf("secret A before the rotation: %d", s)
	}
	os.WriteFile(file, []byte(secretB), 0o600)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "secret B accepted after SIGHUP", func() (bool, string) {
		s := sendOnce(t, p.addr, secretB)
		return s == 200, fmt.Sprintf("HTTP %d; log:\n%s", s, p.log())
	})
	if s := sendOnce(t, p.addr, secretA); s != 401 {
		t.Errorf("secret A after the rotation: %d, want 401", s)
	}
	if !strings.Contains(p.log(), `"msg":"credentials reloaded"`) {
		t.Errorf("no reload line in the log:\n%s", p.log())
	}
}
