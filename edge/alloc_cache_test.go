//go:build !race

package edge

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/notifyedge/notifyedge/claimcache"
	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge/channel"
)

type noAuthority struct{ t *testing.T }

func (a noAuthority) Process(context.Context, durable.Notification) (durable.Result, error) {
	a.t.Error("a cache hit reached the authority")
	return durable.Result{}, nil
}

func (a noAuthority) RecordReview(context.Context, durable.Notification, durable.ReviewReason) error {
	a.t.Error("a cache hit reached the authority")
	return nil
}

// The cache-hit path (fasthttp handler, adapter, claim, replay) allocates
// at most 2 times beyond one bare go-redis SET NX GET and writing the same
// response into the same RequestCtx: what the libraries themselves need.
// Measured against a real redis-server (miniredis would count its own

const allocSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// allocations, being in-process).
func TestCacheHitAllocations(t *testing.T) {
	srv, err := claimcachetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	client, err := claimcache.NewClient(srv.URL(), time.Second, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// As edged runs: the database's cache epoch is in every key.
	const epoch = "7714999904600278144-1-0"
	epochFn := func(context.Context) (string, error) { return epoch, nil }
	cache, err := claimcache.New(claimcache.Config{Client: client, Epoch: epochFn})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	now := time.Now()
	g, err := channel.NewGeneric(channel.GenericConfig{Name: "acme", Secrets: []string{allocSecret}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Channels: []channel.Channel{g}, Authority: noAuthority{t}, Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"channel_txn_id":"4200001234202612020000001","event_type":"PAY_SUCCESS","order_no":"O202612020001","amount":1999,"currency":"CNY"}`)
	sig, _ := channel.SignWebhook(allocSecret, "msg_1", now.Unix(), body)
	var req fasthttp.Request
	req.SetRequestURI("/notify/acme")
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.Header.Set("webhook-id", "msg_1")
	req.Header.Set("webhook-timestamp", formatUnix(now))
	req.Header.Set("webhook-signature", sig)
	req.SetBody(body)
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, nil, nil)

	// Store the answer as a committed delivery would have.
	var d channel.Delivery
	g.Parse(&channel.Request{Body: body, ContentType: []byte("application/json"), Header: &req.Header}, &d)
	answer := `{"code":"SUCCESS","outcome":"applied","status":"PAID"}`
	stored := encodeCached(nil, 200, "application/json", []byte(answer))
	if err := cache.CompleteMany(context.Background(), []claimcache.Completion{{Key: d.Key, Digest: d.Sum, Response: stored}}); err != nil {
		t.Fatal(err)
	}
	hit := func() {
		ctx.Response.Reset()
		s.HandleFastHTTP(&ctx)
	}
	hit()
	if ctx.Response.StatusCode() != 200 || string(ctx.Response.Body()) != answer || string(ctx.Response.Header.Peek("Idempotent-Replayed")) != "true" {
		t.Fatalf("not a cache hit: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	handler := testing.AllocsPerRun(500, hit)

	key := "ne:" + epoch + ":{" + string(d.Key) + "}"
	value := append([]byte{'P'}, d.Sum[:]...)
	value = append(value, make([]byte, 16)...)
	bare := testing.AllocsPerRun(500, func() {
		ctx.Response.Reset()
		v, _ := client.SetArgs(context.Background(), key, value, redis.SetArgs{Mode: "NX", Get: true, TTL: 200 * time.Millisecond}).Result()
		ctx.SetStatusCode(200)
		ctx.SetContentType("application/json")
		ctx.Response.Header.Set("Idempotent-Replayed", "true")
		ctx.SetBodyString(v[len(v)-len(answer):])
	})
	t.Logf("cache-hit path: %.0f allocs; bare go-redis SET NX GET + response: %.0f", handler, bare)
	if handler-bare > 2 {
		t.Errorf("the cache-hit path allocates %.0f times beyond the libraries' %.0f (want at most 2)", handler-bare, bare)
	}

	// With the per-node table of done entries and the watermark (as edged
	// runs), a hot duplicate makes no Redis call and allocates nothing at
	// all.
	local, err := claimcache.New(claimcache.Config{Client: client, LocalEntries: 1024, Epoch: epochFn,
		Position: func(context.Context) (uint64, error) { return 1, nil },
		OnBehind: func(context.Context, string, uint64, uint64) (string, error) { return "", errors.New("not behind") }})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	if err := local.CompleteMany(context.Background(), []claimcache.Completion{{Key: d.Key, Digest: d.Sum, Response: stored}}); err != nil {
		t.Fatal(err)
	}
	sl, err := New(Config{Channels: []channel.Channel{g}, Authority: noAuthority{t}, Cache: local})
	if err != nil {
		t.Fatal(err)
	}
	localHit := func() {
		ctx.Response.Reset()
		sl.HandleFastHTTP(&ctx)
	}
	localHit()
	if string(ctx.Response.Body()) != answer || string(ctx.Response.Header.Peek("Idempotent-Replayed")) != "true" {
		t.Fatalf("not a local hit: %s", ctx.Response.Body())
	}
	if n := testing.AllocsPerRun(500, localHit); n != 0 {
		t.Errorf("the local-hit path allocates %.0f times per request, want 0", n)
	}
}

func formatUnix(t time.Time) string {
	b := make([]byte, 0, 12)
	for n := t.Unix(); n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
