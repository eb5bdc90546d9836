package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge/edgetest"
)

func TestMain(m *testing.M) { durabletest.Main(m) }

// edged with REDIS_URL and EDGE_STREAM_URL: the cache answers duplicates,
// the relay runs and publishes the outbox row, /readyz reports both.
func TestMainWiresCacheAndRelay(t *testing.T) {
	rs := persistentRedis(t)
	dbURL := durabletest.NewDatabase(t)
	m := runMain(t, slog.New(slog.NewTextHandler(io.Discard, nil)),
		"DATABASE_URL="+dbURL, "REDIS_URL="+rs.URL(), "EDGE_STREAM_URL="+rs.URL(), "EDGE_SECRET_ACME="+secret)
	if err := pgtemp.SeedOrders(context.Background(), dbURL, []pgtemp.Order{{No: "O-w", Status: "PENDING_PAY", Amount: 5, Currency: "CNY"}}); err != nil {
		t.Fatal(err)
	}
	body := `{"channel_txn_id":"T-w","event_type":"PAY_SUCCESS","order_no":"O-w","amount":5,"currency":"CNY"}`
	post := func(id string) *http.Response {
		resp, err := testClient.Do(signedPost(m.Addr(), secret, id, body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if r := post("m1"); r.StatusCode != 200 {
		t.Fatalf("first: %d", r.StatusCode)
	}
	if r := post("m2"); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("duplicate not replayed")
	}
	client := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer client.Close()
	wait.For(t, "the outbox row in the stream", func() (bool, string) {
		msgs, err := client.XRange(context.Background(), redisstream.DefaultStream, "-", "+").Result()
		return len(msgs) == 1 && msgs[0].Values["topic"] == "ORDER_PAID" && msgs[0].Values["order_no"] == "O-w", fmt.Sprint(msgs, err)
	})
	resp, err := http.Get("http://" + m.AdminAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	var ready map[string]any
	json.NewDecoder(resp.Body).Decode(&ready)
	resp.Body.Close()
	if ready["postgres"] != "ok" || ready["redis"] != "ok" || ready["relay"] != "running" {
		t.Errorf("readyz %v", ready)
	}
}

// edged with EDGE_STREAM_REPLICAS=1 on a Redis without a replica: a warning
// at start names both numbers, the relay appends the row once and keeps it
// unpublished, /readyz says "relay":"degraded" (still 200) with the reason,
// and notifyedge_relay_replica_shortfall_total counts the checks. The
// stream's backlog gauges are exported.
func TestMainRelayTooFewReplicas(t *testing.T) {
	rs := persistentRedis(t)
	dbURL := durabletest.NewDatabase(t)
	logs := &edgetest.Log{}
	m := runMain(t, slog.New(slog.NewJSONHandler(logs, nil)),
		"DATABASE_URL="+dbURL, "EDGE_STREAM_URL="+rs.URL(), "EDGE_STREAM_REPLICAS=1", "EDGE_SECRET_ACME="+secret)
	if !strings.Contains(logs.String(), `"stream_replicas":1,"connected_replicas":0`) {
		t.Errorf("no start warning naming both numbers:\n%s", logs.String())
	}
	if err := pgtemp.SeedOrders(context.Background(), dbURL, []pgtemp.Order{{No: "O-r", Status: "PENDING_PAY", Amount: 5, Currency: "CNY"}}); err != nil {
		t.Fatal(err)
	}
	body := `{"channel_txn_id":"T-r","event_type":"PAY_SUCCESS","order_no":"O-r","amount":5,"currency":"CNY"}`
	resp, err := testClient.Do(signedPost(m.Addr(), secret, "r1", body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("callback: %d", resp.StatusCode)
	}
	var ready map[string]any
	wait.For(t, "the relay degraded after several checks", func() (bool, string) {
		resp, err := http.Get("http://" + m.AdminAddr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		ready = nil
		json.NewDecoder(resp.Body).Decode(&ready)
		resp.Body.Close()
		checks := metricValue(t, scrape(t, "http://"+m.AdminAddr()+"/metrics"), "notifyedge_relay_replica_shortfall_total")
		return resp.StatusCode == 200 && ready["relay"] == "degraded" && checks >= 3, fmt.Sprint(resp.StatusCode, ready, checks)
	})
	if d, _ := ready["relay_detail"].(string); !strings.Contains(d, "0 of 1") {
		t.Errorf("relay_detail %q, want the replicas counted", d)
	}
	client := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer client.Close()
	if n, err := client.XLen(context.Background(), redisstream.DefaultStream).Result(); err != nil || n != 1 {
		t.Errorf("stream length %d %v for one row checked again and again, want 1", n, err)
	}
	if n := metricValue(t, scrape(t, "http://"+m.AdminAddr()+"/metrics"), "notifyedge_stream_entries"); n != 1 {
		t.Errorf("notifyedge_stream_entries %v, want 1", n)
	}
	if c := strings.Count(logs.String(), "outbox relay degraded"); c != 1 {
		t.Errorf("%d degraded log lines, want one for the spell", c)
	}
}

// persistentRedis starts a redis-server that persists (appendonly), as the
// outbox stream's must; it stops with the test.
func persistentRedis(t *testing.T) *claimcachetest.Server {
	t.Helper()
	rs, err := claimcachetest.Start("--appendonly", "yes")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	return rs
}

// runMain runs edged in this process on loopback ports with a 2 s budget
// and env, logging to log; it closes with the test.
func runMain(t *testing.T, log *slog.Logger, env ...string) *Main {
	t.Helper()
	cfg, err := ParseConfig([]string{"-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-budget", "2s"}, env)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMain(cfg)
	m.Logger = log
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}
