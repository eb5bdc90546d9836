package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// edged puts its database's cache epoch in every cache key, and bumps it
// on POST /cache/epoch: the keys written afterwards carry the new epoch.
func TestMainWiresCacheEpoch(t *testing.T) {
	rs, err := claimcachetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	dbURL := durabletest.NewDatabase(t)
	cfg, err := ParseConfig([]string{"-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-budget", "2s"}, []string{
		"DATABASE_URL=" + dbURL, "REDIS_URL=" + rs.URL(), "EDGE_SECRET_ACME=" + secret, "EDGE_ADMIN_TOKEN=tok",
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
	if m.cache.Epoch() == "" {
		t.Fatal("the cache does not know the epoch once edged listens")
	}
	if err := pgtemp.SeedOrders(context.Background(), dbURL, []pgtemp.Order{
		{No: "O-e1", Status: "PENDING_PAY", Amount: 5, Currency: "CNY"},
		{No: "O-e2", Status: "PENDING_PAY", Amount: 5, Currency: "CNY"},
	}); err != nil {
		t.Fatal(err)
	}
	pay := func(txn, order string) {
		t.Helper()
		body := `{"channel_txn_id":"` + txn + `","event_type":"PAY_SUCCESS","order_no":"` + order + `","amount":5,"currency":"CNY"}`
		resp, err := testClient.Do(signedPost(m.Addr(), secret, "m-"+txn, body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("pay %s: %d", txn, resp.StatusCode)
		}
	}
	client := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer client.Close()
	waitKey := func(key string) {
		t.Helper()
		wait.For(t, "key "+key, func() (bool, string) {
			if n, _ := client.Exists(context.Background(), key).Result(); n == 1 {
				return true, ""
			}
			keys, err := client.Keys(context.Background(), "*").Result()
			return false, fmt.Sprintf("keys %q %v", keys, err)
		})
	}
	epoch0 := m.cache.Epoch()
	changes := func(cause string) float64 {
		return metricValue(t, scrape(t, "http://"+m.AdminAddr()+"/metrics"), `notifyedge_cache_epoch_changes_total{cause="`+cause+`"}`)
	}
	if n := changes("counter") + changes("timeline") + changes("cluster"); n != 0 {
		t.Errorf("%v epoch changes counted at start: the first read is not a change", n)
	}
	pay("T-e1", "O-e1")
	waitKey("ne:" + epoch0 + ":{acme:T-e1:PAY_SUCCESS}")
	// The database's position was raised into the epoch's watermark
	// before the answer was cached.
	waitKey("ne:" + epoch0 + ":watermark")

	req, _ := http.NewRequest("POST", "http://"+m.AdminAddr()+"/cache/epoch", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ Epoch string }
	json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if resp.StatusCode != 200 || got.Epoch == "" || got.Epoch == epoch0 {
		t.Fatalf("POST /cache/epoch: %d %+v, want 200 and a new epoch", resp.StatusCode, got)
	}
	wait.For(t, "the cache under the new epoch "+got.Epoch, func() (bool, string) {
		e := m.cache.Epoch()
		return e == got.Epoch, "epoch " + e
	})
	pay("T-e2", "O-e2")
	waitKey("ne:" + got.Epoch + ":{acme:T-e2:PAY_SUCCESS}")
	if c, tl, cl := changes("counter"), changes("timeline"), changes("cluster"); c != 1 || tl != 0 || cl != 0 {
		t.Errorf("epoch changes counted: counter %v, timeline %v, cluster %v; want the bump once, as counter", c, tl, cl)
	}
}

func TestEpochCause(t *testing.T) {
	for _, c := range []struct{ from, to, want string }{
		{"7341-1-0", "7341-1-1733480000000000", epochCauseCounter},
		{"7341-1-0", "7341-2-0", epochCauseTimeline},
		{"7341-1-0", "9999-1-0", epochCauseCluster},
		{"7341-1-0", "garbled", epochCauseCluster},
	} {
		if got := epochCause(c.from, c.to); got != c.want {
			t.Errorf("epochCause(%q, %q) = %q, want %q", c.from, c.to, got, c.want)
		}
	}
}

// A restore this node found is logged and counted once, as restore, also
// when it is found at start; the new epoch it moved to is not counted again
// when the cache switches to it, and an epoch read again unchanged is no
// change.
func TestEpochWatchCountsRestore(t *testing.T) {
	reg := prometheus.NewRegistry()
	w, err := newEpochWatch(reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	w.restored("7341-1-0", "7341-1-5", 100, 200) // found at start
	w.seen("7341-1-5")
	w.seen("7341-1-5")
	w.seen("7341-1-6") // another node's bump
	for cause, want := range map[string]float64{epochCauseRestore: 1, epochCauseCounter: 1, epochCauseTimeline: 0, epochCauseCluster: 0} {
		if got := testutil.ToFloat64(w.changes.WithLabelValues(cause)); got != want {
			t.Errorf("changes{cause=%q} = %v, want %v", cause, got, want)
		}
	}
}
