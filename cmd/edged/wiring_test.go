package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/redisstream"
)

func TestMain(m *testing.M) { durabletest.Main(m) }

// edged with REDIS_URL and EDGE_STREAM_URL: the cache answers duplicates,
// the relay runs and publishes the outbox row, /readyz reports both.
func TestMainWiresCacheAndRelay(t *testing.T) {
	rs, err := claimcachetest.Start("--appendonly", "yes")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	dbURL := durabletest.NewDatabase(t)
	cfg, err := ParseConfig([]string{"-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-budget", "2s"}, []string{
		"DATABASE_URL=" + dbURL, "REDIS_URL=" + rs.URL(), "EDGE_STREAM_URL=" + rs.URL(), "EDGE_SECRET_ACME=" + secret,
	})
	if err != nil {
		t.Fatal(err)
	}
	m := NewMain(cfg)
	m.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := durabletest.SeedOrders(context.Background(), dbURL, []durabletest.Order{{No: "O-w", Status: "PENDING_PAY", Amount: 5, Currency: "CNY"}}); err != nil {
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
	claimcachetest.WaitFor(t, "the outbox row in the stream", func() (bool, string) {
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
