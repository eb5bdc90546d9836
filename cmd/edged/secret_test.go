package main

import (
	"bytes"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/edge/edgetest"
)

// secretEnv runs edged secret with args and returns its variables.
func secretEnv(t *testing.T, args ...string) map[string]string {
	t.Helper()
	var out, errs bytes.Buffer
	if code := runSecret(args, &out, &errs); code != 0 {
		t.Fatalf("edged secret %v: exit %d: %s", args, code, errs.String())
	}
	env := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			env[k] = v
		}
	}
	return env
}

// signed runs edged sign with args and returns the callback it printed:
// its headers and body.
func signed(t *testing.T, body string, args ...string) (http.Header, string) {
	t.Helper()
	var out, errs bytes.Buffer
	if code := runSign(append(args, "-body", body), &out, &errs); code != 0 {
		t.Fatalf("edged sign %v: exit %d: %s", args, code, errs.String())
	}
	head, payload, _ := strings.Cut(out.String(), "\n\n")
	h := http.Header{}
	for _, line := range strings.Split(head, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			h.Set(k, v)
		}
	}
	if payload == "" { // generic: headers only; the body is the one given
		payload = body
		h.Set("content-type", "application/json")
	}
	return h, strings.TrimSuffix(payload, "\n")
}

// From nothing but edged's own commands: the secrets and tokens of a
// generic, a WeChat Pay and an Alipay channel (staging stand-ins for the
// channels' keys), a node configured with them, an order registered for
// each, and a signed callback of each kind that pays it.
func TestSecretAndSignEveryKind(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"DATABASE_URL": durabletest.NewDatabase(t)}
	for _, args := range [][]string{
		{"-kind", "token"},
		{"-kind", "generic", "-channel", "acme"},
		{"-kind", "wechatpay", "-channel", "wx", "-out", filepath.Join(dir, "wx.pem")},
		{"-kind", "alipay", "-channel", "ali", "-out", filepath.Join(dir, "ali.pem")},
	} {
		for k, v := range secretEnv(t, args...) {
			env[k] = v
		}
	}
	var list []string
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	m := startNode(t, nil, list, &edgetest.Log{})
	for _, no := range []string{"S-GEN", "S-WX", "S-ALI"} {
		if code, body := adminDo(t, env["EDGE_ORDERS_TOKEN"], "PUT", "http://"+m.AdminAddr()+"/orders/"+no, `{"amount":1999,"currency":"CNY"}`); code != 201 {
			t.Fatalf("PUT %s: %d %s", no, code, body)
		}
	}
	serial, _, _ := strings.Cut(env["EDGE_CHANNEL_WX_PLATFORM_KEYS"], "=")
	for _, c := range []struct {
		ch, body string
		args     []string
		want     string
	}{
		{"acme", `{"channel_txn_id":"G-1","event_type":"PAY_SUCCESS","order_no":"S-GEN","amount":1999,"currency":"CNY"}`,
			[]string{"-secret", env["EDGE_SECRET_ACME"]}, `"status":"PAID"`},
		{"wx", `{"out_trade_no":"S-WX","transaction_id":"4200000000000001","trade_state":"SUCCESS","amount":{"total":1999,"currency":"CNY"}}`,
			[]string{"-kind", "wechatpay", "-secret", env["EDGE_SECRET_WX"], "-key", filepath.Join(dir, "wx.pem"), "-serial", serial}, ""},
		{"ali", `{"trade_no":"2026120622001400000001","out_trade_no":"S-ALI","trade_status":"TRADE_SUCCESS","total_amount":"19.99"}`,
			[]string{"-kind", "alipay", "-key", filepath.Join(dir, "ali.pem")}, "success"},
	} {
		h, body := signed(t, c.body, c.args...)
		req, _ := http.NewRequest("POST", "http://"+m.Addr()+"/notify/"+c.ch, strings.NewReader(body))
		req.Header = h
		code, answer := send(t, req)
		if code != 200 || !strings.Contains(answer, c.want) {
			t.Errorf("%s: %d %s", c.ch, code, answer)
		}
	}
	for _, no := range []string{"S-GEN", "S-WX", "S-ALI"} {
		if _, body := adminDo(t, env["EDGE_ORDERS_TOKEN"], "GET", "http://"+m.AdminAddr()+"/orders/"+no, ""); !strings.Contains(body, `"status":"PAID"`) {
			t.Errorf("%s after its signed callback: %.120s", no, body)
		}
	}
}
