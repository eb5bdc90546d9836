package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/durable/wait"
)

func TestMain(m *testing.M) { durabletest.Main(m) }

// The example receiver, as a merchant would copy it, against the real
// forwarder (built and run as a process) fed by the real relay from two
// fresh databases, whose outbox ids both start at 1. Each event's first
// attempt is answered 500: its re-send carries the same webhook-id. No
// webhook-id repeats across the two databases, so the receiver drops no
// real event; events sent again are dropped once; a rotated secret loses
// nothing; a forged or stale request is refused and stores nothing.
func TestReceiverAgainstTheForwarder(t *testing.T) {
	ctx := context.Background()
	oldSecret, newSecret := makeSecret(t), makeSecret(t)
	inbox := durabletest.Pool(t, durabletest.NewDatabase(t))
	h, err := NewHandler(ctx, inbox, []string{newSecret, oldSecret}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// In front of the example: each webhook-id's first attempt gets a 500.
	var mu sync.Mutex
	attempts := map[string]int{}
	var firstBody string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("webhook-id")
		mu.Lock()
		attempts[id]++
		first := attempts[id] == 1
		mu.Unlock()
		if first {
			http.Error(w, "not now", http.StatusInternalServerError)
			return
		}
		if firstBody == "" {
			body, _ := io.ReadAll(r.Body)
			mu.Lock()
			firstBody = string(body)
			mu.Unlock()
			r.Body = io.NopCloser(strings.NewReader(string(body)))
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	stream, err := claimcachetest.Start("--appendonly", "yes")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stream.Stop)
	client, err := redisstream.NewClient(stream.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	a, b := newShop(t, client, "A"), newShop(t, client, "B")
	a.pay(t, 5)
	b.pay(t, 5)

	bin := filepath.Join(t.TempDir(), "forwarder")
	if out, err := exec.Command("go", "build", "-o", bin, "..").CombinedOutput(); err != nil {
		t.Fatalf("go build the forwarder: %v\n%s", err, out)
	}
	stop := startForwarder(t, bin, stream.URL(), srv.URL, oldSecret)
	waitInbox(t, inbox, 10)

	// Outbox ids 1..5 in both databases, ten webhook-ids.
	var ids, outboxIDs int
	if err := inbox.QueryRow(ctx, `SELECT count(DISTINCT webhook_id), count(DISTINCT (data->>'outbox_id')) FROM webhook_inbox`).Scan(&ids, &outboxIDs); err != nil {
		t.Fatal(err)
	}
	if ids != 10 || outboxIDs != 5 {
		t.Errorf("%d webhook-ids for %d distinct outbox ids from two databases, want 10 for 5", ids, outboxIDs)
	}
	var mismatched int
	if err := inbox.QueryRow(ctx, `SELECT count(*) FROM webhook_inbox WHERE data->>'event_id' IS DISTINCT FROM webhook_id
		OR (data->>'amount')::bigint <> 1999 OR data->>'currency' <> 'CNY' OR data->>'channel' <> 'acme'
		OR data->>'paid_by' NOT LIKE 'acme:%' OR data->>'via' <> 'callback' OR data->>'occurred_at' IS NULL OR type <> 'ORDER_PAID'`).Scan(&mismatched); err != nil {
		t.Fatal(err)
	}
	if mismatched != 0 {
		t.Errorf("%d events without their event_id, amount, currency, channel, paid_by, via or occurred_at", mismatched)
	}
	mu.Lock()
	for id, n := range attempts {
		if n != 2 {
			t.Errorf("webhook-id %s: %d attempts, want 2 (a 500, then the same id again)", id, n)
		}
	}
	t.Logf("an ORDER_PAID as the receiver got it:\n%s", firstBody)
	mu.Unlock()

	// A's rows appended again, as a relay that died between appending and
	// marking would: the same event ids, dropped by the inbox.
	a.appendAgain(t)
	wait.For(t, "the re-sent events answered", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range attempts {
			if c >= 3 {
				n++
			}
		}
		return n == 5, fmt.Sprintf("%d of A's 5 events sent again", n)
	})
	if n := count(t, inbox, `SELECT count(*) FROM webhook_inbox`); n != 10 {
		t.Errorf("inbox %d rows after A's events came again, want 10", n)
	}

	// The secret rotated: the forwarder signs with the new one.
	stop()
	startForwarder(t, bin, stream.URL(), srv.URL, newSecret)
	b.pay(t, 2)
	waitInbox(t, inbox, 12)

	// Forged, stale, and unsigned requests are refused and store nothing.
	body := []byte(`{"type":"ORDER_PAID","timestamp":"2026-12-06T00:00:00Z","data":{"order_no":"X-1"}}`)
	wh, _ := standardwebhooks.NewWebhook(newSecret)
	other, _ := standardwebhooks.NewWebhook(makeSecret(t))
	for name, req := range map[string]http.Header{
		"another secret":  signedHeader(other, "msg_1", time.Now(), body),
		"ten minutes old": signedHeader(wh, "msg_2", time.Now().Add(-10*time.Minute), body),
		"unsigned":        {"Webhook-Id": {"msg_3"}, "Webhook-Timestamp": {fmt.Sprint(time.Now().Unix())}},
	} {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(string(body)))
		r.Header = req
		h.ServeHTTP(rec, r)
		if rec.Code != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, rec.Code)
		}
	}
	huge := []byte(`{"type":"ORDER_PAID","timestamp":"2026-12-06T00:00:00Z","data":{"order_no":"X-1","pad":"` + strings.Repeat("x", 2<<20) + `"}}`)
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(string(huge)))
	r.Header = signedHeader(wh, "msg_4", time.Now(), huge)
	h.ServeHTTP(rec, r)
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("a body of 2 MiB: %d, want 413", rec.Code)
	}
	if n := count(t, inbox, `SELECT count(*) FROM webhook_inbox WHERE order_no = 'X-1'`); n != 0 {
		t.Errorf("a refused request stored %d rows", n)
	}
}

// shop is one notifyedge database with its relay into the shared stream.
type shop struct {
	name  string
	url   string
	store *durable.Store
	db    *pgxpool.Pool
	pub   *redisstream.Publisher
	paid  int
}

func newShop(t *testing.T, client redis.UniversalClient, name string) *shop {
	t.Helper()
	url := durabletest.NewDatabase(t)
	store, err := durable.New(context.Background(), durable.Config{URL: url, MaxConns: 4, MinConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	s := &shop{name: name, url: url, store: store, db: durabletest.Pool(t, url), pub: redisstream.NewPublisher(client, "", 0)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		store.RunRelay(ctx, durable.RelayConfig{Publisher: s.pub, Poll: 50 * time.Millisecond})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// pay registers n more orders and pays each by a callback.
func (s *shop) pay(t *testing.T, n int) {
	t.Helper()
	ctx := context.Background()
	for range n {
		s.paid++
		no := fmt.Sprintf("%s-%03d", s.name, s.paid)
		if err := pgtemp.SeedOrders(ctx, s.url, []pgtemp.Order{{No: no, Status: "PENDING_PAY", Amount: 1999, Currency: "CNY"}}); err != nil {
			t.Fatal(err)
		}
		txn := "T" + no
		sum := sha256.Sum256([]byte(txn))
		r, err := s.store.Process(ctx, durable.Notification{BizKey: "acme:" + txn + ":PAY_SUCCESS", OrderNo: no, Event: durable.PaySuccess,
			Amount: 1999, Currency: "CNY", Digest: hex.EncodeToString(sum[:]), RawBody: []byte("{}"), Trade: "acme:" + txn})
		if err != nil || r.Outcome != durable.Applied {
			t.Fatalf("pay %s: %+v %v", no, r, err)
		}
	}
}

// appendAgain appends every outbox row of the shop to the stream again.
func (s *shop) appendAgain(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	rows, err := s.db.Query(ctx, `SELECT id, event_id::text, topic, order_no, payload::text FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []durable.OutboxMessage
	for rows.Next() {
		var m durable.OutboxMessage
		var payload string
		if err := rows.Scan(&m.ID, &m.EventID, &m.Topic, &m.OrderNo, &payload); err != nil {
			t.Fatal(err)
		}
		m.Payload = []byte(payload)
		msgs = append(msgs, m)
	}
	if err := s.pub.Publish(ctx, msgs); err != nil {
		t.Fatal(err)
	}
}

// startForwarder runs the forwarder binary until the returned stop (or the
// test's end): SIGTERM, and it releases its lease.
func startForwarder(t *testing.T, bin, streamURL, url, secret string) (stop func()) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "EDGE_STREAM_URL="+streamURL, "FORWARD_URL="+url, "FORWARD_SECRET="+secret,
		"FORWARD_BACKOFF_MIN=10ms", "FORWARD_BACKOFF_MAX=50ms", "FORWARD_ADMIN_LISTEN=127.0.0.1:0", "FORWARD_LEASE_TTL=2s")
	cmd.Stderr = t.Output()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		})
	}
	t.Cleanup(stop)
	return stop
}

func waitInbox(t *testing.T, db *pgxpool.Pool, n int) {
	t.Helper()
	wait.For(t, fmt.Sprintf("%d events in the inbox", n), func() (bool, string) {
		got := count(t, db, `SELECT count(*) FROM webhook_inbox`)
		return got == n, fmt.Sprint(got)
	})
}

func count(t *testing.T, db *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func makeSecret(t *testing.T) string {
	t.Helper()
	var key [32]byte
	if _, err := rand.Read(key[:]); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(key[:])
}

// signedHeader is the Standard Webhooks headers for body, signed by wh.
func signedHeader(wh *standardwebhooks.Webhook, id string, at time.Time, body []byte) http.Header {
	sig, _ := wh.Sign(id, at, body)
	return http.Header{"Webhook-Id": {id}, "Webhook-Timestamp": {fmt.Sprint(at.Unix())}, "Webhook-Signature": {sig}}
}

// The receiver guide shows this program's code as it is.
func TestReadmeShowsTheCode(t *testing.T) {
	code, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const marker = "<!-- examplereceiver/main.go -->\n```go\n"
	_, block, ok := strings.Cut(string(readme), marker)
	if !ok {
		t.Fatalf("../README.md has no %q", marker)
	}
	block, _, _ = strings.Cut(block, "```\n")
	if block != string(code) {
		t.Error("../README.md shows other code than main.go: copy main.go into its block")
	}
}
