package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dto "github.com/prometheus/client_model/go"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// testEnv is one real redis-server, a receiver and a publisher.
type testEnv struct {
	t      *testing.T
	redis  *claimcachetest.Server
	client redis.UniversalClient
	pub    *redisstream.Publisher
	stream string
	secret string
	recv   *receiver
	nextID atomic.Int64
	// published holds every message by outbox id, and per order its ids
	// in outbox order.
	mu        sync.Mutex
	published map[int64]durable.OutboxMessage
	perOrder  map[string][]int64
}

func newTestEnv(t *testing.T) *testEnv {
	t.Helper()
	srv, err := claimcachetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	client, err := redisstream.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	key := make([]byte, 32)
	rand.Read(key)
	e := &testEnv{
		t: t, redis: srv, client: client, stream: redisstream.DefaultStream,
		secret:    "whsec_" + base64.StdEncoding.EncodeToString(key),
		published: map[int64]durable.OutboxMessage{}, perOrder: map[string][]int64{},
	}
	e.pub = redisstream.NewPublisher(client, e.stream, time.Hour)
	e.recv = newReceiver(t, key)
	e.nextID.Store(1000)
	return e
}

// publish XADDs n events for each order, interleaved round-robin, through
// the relay's Publisher, each with an event id of its own. The payload is
// spaced as Postgres prints jsonb, to check it reaches the receiver byte
// for byte.
func (e *testEnv) publish(n int, orders ...string) []durable.OutboxMessage {
	e.t.Helper()
	var msgs []durable.OutboxMessage
	e.mu.Lock()
	for i := range n {
		for _, o := range orders {
			id := e.nextID.Add(1)
			m := durable.OutboxMessage{ID: id, EventID: newEventID(), Topic: "ORDER_PAID", OrderNo: o,
				Payload:   fmt.Appendf(nil, `{"to": "PAID", "from": "PENDING_PAY", "seq": %d, "biz_key": null, "order_no": %q, "event_type": "PAY_SUCCESS", "occurred_at": "2026-12-06T01:02:03.000004Z"}`, i, o),
				CreatedAt: time.Now()}
			msgs = append(msgs, m)
			e.published[id] = m
			e.perOrder[o] = append(e.perOrder[o], id)
		}
	}
	e.mu.Unlock()
	if err := e.pub.Publish(context.Background(), msgs); err != nil {
		e.t.Fatal(err)
	}
	return msgs
}

// config is a forwarder configuration for tests: fast retries, a short
// lease, four partitions.
func (e *testEnv) config(name string) Config {
	return Config{
		Client: e.client, Stream: e.stream, Group: "forwarder", Name: name,
		URL: e.recv.srv.URL, Secret: e.secret, Timeout: 2 * time.Second, MaxAge: time.Hour,
		LeaseTTL: 500 * time.Millisecond, BackoffMin: 10 * time.Millisecond, BackoffMax: 80 * time.Millisecond,
		Partitions: 4, Block: 100 * time.Millisecond, RedriveGiveUp: 300 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(e.t.Output(), nil)), Metrics: NewMetrics(),
	}
}

// start runs the forwarder in-process until the returned stop is called
// (also at cleanup); stop returns Run's error.
func (e *testEnv) start(cfg Config) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	e.t.Cleanup(func() { stop() })
	return stop
}

func (e *testEnv) pending() int64 {
	e.t.Helper()
	p, err := e.client.XPending(context.Background(), e.stream, "forwarder").Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return p.Count
}

func (e *testEnv) deadEntries() []redis.XMessage {
	e.t.Helper()
	msgs, err := e.client.XRange(context.Background(), e.stream+":dead", "-", "+").Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return msgs
}

func (e *testEnv) deadOrders() []string {
	e.t.Helper()
	m, err := e.client.SMembers(context.Background(), e.stream+":dead:orders").Result()
	if err != nil {
		e.t.Fatal(err)
	}
	slices.Sort(m)
	return m
}

// newEventID is a random event id, as the outbox's default writes one.
func newEventID() string {
	var b [16]byte
	rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// expectedBody is the body the README documents for m (its payload a JSON
// object with occurred_at): the Standard Webhooks payload shape, the
// payload's fields in data as the row holds them.
func expectedBody(m durable.OutboxMessage) string {
	var facts struct {
		OccurredAt string `json:"occurred_at"`
	}
	json.Unmarshal(m.Payload, &facts)
	return fmt.Sprintf(`{"type":%q,"timestamp":%q,"data":{"event_id":%q,"outbox_id":%d,%s}`,
		m.Topic, facts.OccurredAt, m.EventID, m.ID, strings.TrimPrefix(string(m.Payload), "{"))
}

// checkOrder asserts that every id in want reached the receiver and that,
// deduplicated by webhook-id (first arrival counts), each order's events
// arrived in outbox order.
func (e *testEnv) checkOrder(got []accepted, orders ...string) {
	e.t.Helper()
	seen := map[string]bool{}
	per := map[string][]int64{}
	for _, a := range got {
		if seen[a.ID] {
			continue
		}
		seen[a.ID] = true
		per[a.Order] = append(per[a.Order], a.OutboxID)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(orders) == 0 {
		for o := range e.perOrder {
			orders = append(orders, o)
		}
	}
	for _, o := range orders {
		if !slices.Equal(per[o], e.perOrder[o]) {
			e.t.Errorf("order %s: receiver saw (first arrivals) %v, outbox order %v", o, per[o], e.perOrder[o])
		}
	}
}

// waitFor polls cond until it holds, for as long as the kit's poller
// waits: a wait is for a condition, and a busy machine only delays it.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	wait.For(t, what, func() (bool, string) { return cond(), "not yet" })
}

func counter(m *Metrics, result string) float64 {
	var d dto.Metric
	m.forward.WithLabelValues(result).Write(&d)
	return d.GetCounter().GetValue()
}

func gauge(g interface{ Write(*dto.Metric) error }) float64 {
	var d dto.Metric
	g.Write(&d)
	return d.GetGauge().GetValue()
}

// accepted is a delivery the receiver took (answered, or meant to answer, 2xx).
type accepted struct {
	ID       string
	OutboxID int64
	Order    string
	Body     string
	At       time.Time
	// Traceparent is the request's traceparent header ("" without one).
	Traceparent string
}

// verdict is how the receiver answers one request.
type verdict struct {
	status int
	delay  time.Duration
	header map[string]string
}

// receiver is a Standard Webhooks receiver that verifies every request
// independently of the forwarder's code (its own HMAC), records what it
// accepts in arrival order, and answers as behave says.
type receiver struct {
	t        *testing.T
	srv      *httptest.Server
	key      []byte
	mu       sync.Mutex
	accepted []accepted
	attempts map[string]int         // by outbox id
	times    map[string][]time.Time // by outbox id
	problems []string
	behave   func(order string, outboxID int64, attempt int) verdict
	// inflight counts the requests of each order being answered; overlaps
	// lists the orders that had two at once.
	inflight map[string]int
	overlaps []string
}

func newReceiver(t *testing.T, key []byte) *receiver {
	r := &receiver{t: t, key: key, attempts: map[string]int{}, times: map[string][]time.Time{}, inflight: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) setBehave(f func(order string, outboxID int64, attempt int) verdict) {
	r.mu.Lock()
	r.behave = f
	r.mu.Unlock()
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	id, ts, sig := req.Header.Get("webhook-id"), req.Header.Get("webhook-timestamp"), req.Header.Get("webhook-signature")
	var env struct {
		Type      string `json:"type"`
		Timestamp string `json:"timestamp"`
		Data      struct {
			EventID  *string `json:"event_id"`
			OutboxID int64   `json:"outbox_id"`
			OrderNo  string  `json:"order_no"`
		} `json:"data"`
	}
	doc := &env.Data
	problem := ""
	sec, err := strconv.ParseInt(ts, 10, 64)
	switch {
	case req.Method != http.MethodPost:
		problem = "method " + req.Method
	case req.Header.Get("Content-Type") != "application/json":
		problem = "content-type " + req.Header.Get("Content-Type")
	case err != nil || time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute:
		problem = "timestamp " + ts
	case !r.signatureOK(id, ts, body, sig):
		problem = "signature " + sig
	case json.Unmarshal(body, &env) != nil || env.Type == "" || env.Timestamp == "" || doc.OrderNo == "":
		problem = "body " + string(body)
	case doc.EventID != nil && *doc.EventID != id:
		problem = "webhook-id " + id + " for event_id " + *doc.EventID
	case doc.EventID == nil && strconv.FormatInt(doc.OutboxID, 10) != id:
		problem = "webhook-id " + id + " for outbox_id " + strconv.FormatInt(doc.OutboxID, 10) + " (no event_id)"
	}
	r.mu.Lock()
	if problem != "" {
		r.problems = append(r.problems, problem)
		r.mu.Unlock()
		http.Error(w, problem, http.StatusUnauthorized)
		return
	}
	// Attempts and their times by outbox id, which a test knows.
	row := strconv.FormatInt(doc.OutboxID, 10)
	r.attempts[row]++
	r.times[row] = append(r.times[row], time.Now())
	if r.inflight[doc.OrderNo]++; r.inflight[doc.OrderNo] > 1 {
		r.overlaps = append(r.overlaps, doc.OrderNo)
	}
	defer func() {
		r.mu.Lock()
		r.inflight[doc.OrderNo]--
		r.mu.Unlock()
	}()
	v := verdict{status: http.StatusNoContent}
	if r.behave != nil {
		v = r.behave(doc.OrderNo, doc.OutboxID, r.attempts[row])
	}
	if v.status >= 200 && v.status < 300 {
		r.accepted = append(r.accepted, accepted{ID: id, OutboxID: doc.OutboxID, Order: doc.OrderNo, Body: string(body), At: time.Now(),
			Traceparent: req.Header.Get("traceparent")})
	}
	r.mu.Unlock()
	if v.delay > 0 {
		select {
		case <-req.Context().Done():
		case <-time.After(v.delay):
		}
	}
	for k, val := range v.header {
		w.Header().Set(k, val)
	}
	w.WriteHeader(v.status)
	io.WriteString(w, "receiver says "+strconv.Itoa(v.status))
}

func (r *receiver) signatureOK(id, ts string, body []byte, header string) bool {
	mac := hmac.New(sha256.New, r.key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, s := range strings.Fields(header) {
		if hmac.Equal([]byte(s), []byte(want)) {
			return true
		}
	}
	return false
}

func (r *receiver) snapshot() []accepted {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.accepted)
}

// unique counts distinct webhook-ids accepted.
func (r *receiver) unique() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	for _, a := range r.accepted {
		seen[a.ID] = true
	}
	return len(seen)
}

func (r *receiver) tries(outboxID int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts[strconv.FormatInt(outboxID, 10)]
}

func (r *receiver) checkNoProblems() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.problems) > 0 {
		r.t.Errorf("receiver refused %d requests, first: %s", len(r.problems), r.problems[0])
	}
}

// overlapping returns the orders that had two requests answered at once.
func (r *receiver) overlapping() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.overlaps)
}

func (r *receiver) acceptedAt(outboxID int64) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.accepted {
		if a.OutboxID == outboxID {
			return a.At
		}
	}
	return time.Time{}
}
