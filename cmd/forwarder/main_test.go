package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

func TestOptions(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	const secret = "whsec_c2VjcmV0LWtleS1tYXRlcmlhbC1mb3ItdGVzdHM="
	base := map[string]string{
		"EDGE_STREAM_URL": "redis://127.0.0.1:1/0", "FORWARD_URL": "https://user:pw@example.test/hook",
		"FORWARD_SECRET": secret, "FORWARD_MAX_AGE": "2h", "FORWARD_GROUP": "g1", "FORWARD_PARTITIONS": "3",
		"FORWARD_MAX_HELD": "500",
	}
	o, err := parseOptions(nil, env(base), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := o.cfg
	if c.Stream != "notifyedge:outbox" || c.Group != "g1" || c.MaxAge != 2*time.Hour || c.Partitions != 3 || c.MaxHeld != 500 ||
		c.Timeout != 10*time.Second || o.adminListen != "127.0.0.1:9091" || c.Name == "" || o.redrive {
		t.Errorf("defaults and environment: %+v admin %s", c, o.adminListen)
	}
	o, err = parseOptions([]string{"-group", "g2", "-timeout", "3s", "-redrive-dead"}, env(base), io.Discard)
	if err != nil || o.cfg.Group != "g2" || o.cfg.Timeout != 3*time.Second || !o.redrive {
		t.Errorf("flags over environment: %+v %v", o.cfg, err)
	}

	_, err = parseOptions(nil, env(map[string]string{}), io.Discard)
	for _, name := range []string{"EDGE_STREAM_URL", "FORWARD_URL", "FORWARD_SECRET"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("without %s: %v", name, err)
		}
	}
	bad := map[string]string{}
	for k, v := range base {
		bad[k] = v
	}
	bad["FORWARD_SECRET"] = "whsec_not base64 but key material"
	bad["FORWARD_MAX_AGE"] = "tomorrow"
	_, err = parseOptions(nil, env(bad), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "FORWARD_SECRET") || !strings.Contains(err.Error(), "FORWARD_MAX_AGE") {
		t.Errorf("bad values: %v", err)
	}
	if err != nil && strings.Contains(err.Error(), "key material") {
		t.Errorf("the error quotes the secret: %v", err)
	}
	// A bad configuration exits 2 before touching Redis.
	if code := run(context.Background(), nil, env(bad), io.Discard, io.Discard); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
}

// forwarder secret prints a secret the forwarder and the Standard Webhooks
// library both take, a new one each time.
func TestSecretCommand(t *testing.T) {
	secrets := map[string]bool{}
	for range 2 {
		var out strings.Builder
		if code := run(context.Background(), []string{"secret"}, func(string) string { return "" }, &out, io.Discard); code != 0 {
			t.Fatalf("exit %d", code)
		}
		s := strings.TrimSpace(out.String())
		if _, err := standardwebhooks.NewWebhook(s); err != nil || !strings.HasPrefix(s, "whsec_") {
			t.Errorf("secret %q: %v", s, err)
		}
		if _, err := parseOptions(nil, func(k string) string {
			return map[string]string{"FORWARD_URL": "https://x.example/", "FORWARD_SECRET": s, "EDGE_STREAM_URL": "redis://127.0.0.1:1/0"}[k]
		}, io.Discard); err != nil {
			t.Errorf("the forwarder refuses its own secret: %v", err)
		}
		secrets[s] = true
	}
	if len(secrets) != 2 {
		t.Error("two runs printed the same secret")
	}
}
