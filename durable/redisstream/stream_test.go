package redisstream_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/durable/shipping"
	"github.com/notifyedge/notifyedge/durable/wait"
)

func TestMain(m *testing.M) { durabletest.Main(m) }

type bundle struct {
	url    string
	store  *durable.Store
	db     *pgxpool.Pool
	redis  *claimcachetest.Server
	client redis.UniversalClient
	// oneByOne makes the shippers handle one message at a time
	// (ConsumerConfig.Handle) instead of a read's messages together.
	oneByOne bool
}

func setup(t *testing.T) *bundle { return setupB(t) }

func durableRelayConfig(p durable.Publisher) durable.RelayConfig {
	return durable.RelayConfig{Publisher: p}
}

func setupB(t testing.TB) *bundle {
	t.Helper()
	url := durabletest.NewDatabase(t)
	store := newStore(t, url)
	db, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	srv, err := claimcachetest.Start("--appendonly", "yes")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	client, err := redisstream.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return &bundle{url: url, store: store, db: db, redis: srv, client: client}
}

func newStore(t testing.TB, url string) *durable.Store {
	t.Helper()
	s, err := durable.New(context.Background(), durable.Config{URL: url, MaxConns: 8, MinConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	return durabletest.Count(t, b.db, sql, args...)
}

func note(txn string, e durable.Event, orderNo string) durable.Notification {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\n%s\n%s\n%d\n%s", txn, e, orderNo, 1999, "CNY"))
	return durable.Notification{BizKey: "acme:" + txn + ":" + string(e), OrderNo: orderNo, Event: e,
		Amount: 1999, Currency: "CNY", Digest: hex.EncodeToString(sum[:]), RawBody: []byte("{}"),
		Trade: "acme:" + txn}
}

// fullRefund is the full refund of the trade payTxn paid, keyed by its
// refund id.
func fullRefund(payTxn, refundID, orderNo string) durable.Notification {
	n := note(refundID, durable.RefundSuccess, orderNo)
	n.Trade, n.RefundID, n.RefundAmount = "acme:"+payTxn, refundID, n.Amount
	return n
}

// paidAndRefunded seeds n orders and, for each, a payment then a refund:
// two outbox rows per order whose order must survive the trip.
func (b *bundle) paidAndRefunded(t *testing.T, prefix string, n int, refund bool) {
	t.Helper()
	ctx := context.Background()
	orders := make([]pgtemp.Order, n)
	for i := range n {
		orders[i] = pgtemp.Order{No: fmt.Sprintf("%s-%03d", prefix, i), Status: "PENDING_PAY", Amount: 1999, Currency: "CNY"}
	}
	if err := pgtemp.SeedOrders(ctx, b.url, orders); err != nil {
		t.Fatal(err)
	}
	for _, o := range orders {
		if r, err := b.store.Process(ctx, note("P"+o.No, durable.PaySuccess, o.No)); err != nil || r.Outcome != durable.Applied {
			t.Fatalf("pay %s: %+v %v", o.No, r, err)
		}
		if refund {
			if r, err := b.store.Process(ctx, fullRefund("P"+o.No, "R"+o.No, o.No)); err != nil || r.Outcome != durable.Applied {
				t.Fatalf("refund %s: %+v %v", o.No, r, err)
			}
		}
	}
}

// runRelay runs a relay until the test ends (or stop is called).
func runRelay(t *testing.T, s *durable.Store, p durable.Publisher, onState func(string)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.RunRelay(ctx, durable.RelayConfig{Publisher: p, Poll: 200 * time.Millisecond, Batch: 50, OnState: onState})
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// waitPublished waits until every outbox row is marked published.
func (b *bundle) waitPublished(t *testing.T) {
	t.Helper()
	wait.For(t, "the outbox drained", func() (bool, string) {
		n := b.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NULL`)
		return n == 0, fmt.Sprintf("%d rows unpublished", n)
	})
}

// streamIDs reads the stream: outbox ids in stream order, by order_no.
func (b *bundle) streamIDs(t *testing.T) (all []int64, byOrder map[string][]int64) {
	t.Helper()
	msgs, err := b.client.XRange(context.Background(), redisstream.DefaultStream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	byOrder = map[string][]int64{}
	for _, m := range msgs {
		var id int64
		fmt.Sscan(m.Values[redisstream.FieldOutboxID].(string), &id)
		all = append(all, id)
		o := m.Values[redisstream.FieldOrderNo].(string)
		byOrder[o] = append(byOrder[o], id)
	}
	return all, byOrder
}

// Point 1: every outbox row reaches the stream once, in id order per order.
func TestRelayPublishesEachRowOnceInOrder(t *testing.T) {
	b := setup(t)
	runRelay(t, b.store, redisstream.NewPublisher(b.client, "", 0), nil)
	b.paidAndRefunded(t, "R", 120, true) // 240 rows, published while they are written
	b.waitPublished(t)
	all, byOrder := b.streamIDs(t)
	seen := map[int64]int{}
	for _, id := range all {
		seen[id]++
	}
	if len(all) != 240 || len(seen) != 240 {
		t.Fatalf("stream has %d entries for %d distinct rows, want 240 of 240", len(all), len(seen))
	}
	var topics []string
	rows, _ := b.db.Query(context.Background(), `SELECT topic FROM outbox WHERE order_no = 'R-007' ORDER BY id`)
	for rows.Next() {
		var s string
		rows.Scan(&s)
		topics = append(topics, s)
	}
	if fmt.Sprint(topics) != "[ORDER_PAID ORDER_REFUNDED]" {
		t.Fatalf("outbox of R-007: %v", topics)
	}
	for o, ids := range byOrder {
		if len(ids) != 2 || ids[0] >= ids[1] {
			t.Errorf("order %s: outbox ids in stream order %v, want two, ascending (PAID before REFUNDED)", o, ids)
		}
	}
}

// crashAfterXAdd publishes, then fails before the relay can mark the rows:
// the relay died between XADD and its UPDATE.
type crashAfterXAdd struct {
	next   durable.Publisher
	crashs atomic.Int32
}

func (c *crashAfterXAdd) Publish(ctx context.Context, msgs []durable.OutboxMessage) error {
	if err := c.next.Publish(ctx, msgs); err != nil {
		return err
	}
	if c.crashs.Add(-1) >= 0 {
		return errors.New("simulated crash after XADD")
	}
	return nil
}

// Point 1: the relay dies between XADD and marking: the rows go out again,
// and the consumer's dedup on the outbox id makes the effect once, whether
// it handles a read's messages together or one at a time.
func TestRelayCrashBetweenXAddAndMark(t *testing.T) {
	for _, oneByOne := range []bool{false, true} {
		t.Run(fmt.Sprintf("one by one %v", oneByOne), func(t *testing.T) { relayCrashBetweenXAddAndMark(t, oneByOne) })
	}
}

func relayCrashBetweenXAddAndMark(t *testing.T, oneByOne bool) {
	b := setup(t)
	b.oneByOne = oneByOne
	b.paidAndRefunded(t, "C", 40, false)
	p := &crashAfterXAdd{next: redisstream.NewPublisher(b.client, "", 0)}
	p.crashs.Store(2)
	runRelay(t, b.store, p, nil)
	b.waitPublished(t)
	all, _ := b.streamIDs(t)
	if len(all) <= 40 {
		t.Fatalf("stream has %d entries: the crash should have re-sent rows", len(all))
	}
	b.consume(t, "shipper", "s1", 0, 40)
	if n := b.count(t, `SELECT count(*) FROM shipment`); n != 40 {
		t.Errorf("shipments %d for 40 orders, %d stream entries", n, len(all))
	}
	if n := b.count(t, `SELECT count(*) FROM (SELECT order_no FROM shipment GROUP BY order_no HAVING count(*) > 1) x`); n != 0 {
		t.Errorf("%d orders shipped twice", n)
	}
}

// startConsumer runs a shipper on a goroutine of its own until the
// returned stop is called.
func (b *bundle) startConsumer(t *testing.T, group, name string, claimIdle time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	cfg := redisstream.ConsumerConfig{Client: b.client, Group: group, Name: name,
		Block: 100 * time.Millisecond, ClaimIdle: claimIdle, HandleBatch: shipping.OnPaidBatch(b.store, group, nil),
		OnError: func(err error) { t.Logf("consumer: %v", err) }}
	if b.oneByOne {
		cfg.Handle, cfg.HandleBatch = shipping.OnPaid(b.store, group, nil), nil
	}
	go func() {
		defer close(done)
		redisstream.RunConsumer(ctx, cfg)
	}()
	return func() { cancel(); <-done }
}

// consume runs a shipper until want orders are SHIPPED and group has read
// and acknowledged every entry of the stream: the redelivered and stale
// ones too, which ship nothing.
func (b *bundle) consume(t *testing.T, group, name string, claimIdle time.Duration, want int) {
	t.Helper()
	defer b.startConsumer(t, group, name, claimIdle)()
	ctx := context.Background()
	wait.For(t, fmt.Sprintf("%d orders shipped and every entry acknowledged by %s", want, group), func() (bool, string) {
		shipped := b.count(t, `SELECT count(*) FROM biz_order WHERE status = 'SHIPPED'`)
		stream, err := b.client.XInfoStream(ctx, redisstream.DefaultStream).Result()
		if err != nil {
			return false, fmt.Sprintf("%d shipped; stream: %v", shipped, err)
		}
		groups, err := b.client.XInfoGroups(ctx, redisstream.DefaultStream).Result()
		if err != nil {
			return false, fmt.Sprintf("%d shipped; groups: %v", shipped, err)
		}
		for _, g := range groups {
			if g.Name == group {
				return shipped >= want && g.LastDeliveredID == stream.LastGeneratedID && g.Pending == 0,
					fmt.Sprintf("%d shipped; %s delivered up to %s of %s, %d pending", shipped, group, g.LastDeliveredID, stream.LastGeneratedID, g.Pending)
			}
		}
		return false, fmt.Sprintf("%d shipped; no group %s", shipped, group)
	})
}

// Point 2: two relays, one leader; the leader stops, the other takes over
// (a standby tries for the lock every 100 ms); nothing lost, nothing
// doubled in effect.
func TestRelayLeaderFailover(t *testing.T) {
	b := setup(t)
	other := newStore(t, b.url)
	var mu sync.Mutex
	states := map[string]string{}
	watch := func(node string) func(string) {
		return func(st string) { mu.Lock(); states[node] = st; mu.Unlock() }
	}
	leaders := func() (n int, who string, seen string) {
		mu.Lock()
		defer mu.Unlock()
		for node, st := range states {
			if st == "running" {
				n, who = n+1, node
			}
		}
		return n, who, fmt.Sprintf("states %v", states)
	}
	stops := map[string]func(){
		"a": runRelay(t, b.store, redisstream.NewPublisher(b.client, "", 0), watch("a")),
		"b": runRelay(t, other, redisstream.NewPublisher(b.client, "", 0), watch("b")),
	}
	wait.For(t, "one relay running, one standby", func() (bool, string) {
		n, _, seen := leaders()
		mu.Lock()
		nodes := len(states)
		mu.Unlock()
		return n == 1 && nodes == 2, seen
	})
	b.paidAndRefunded(t, "F", 30, false)
	b.waitPublished(t)
	_, leader, _ := leaders()
	stops[leader]()
	took := wait.For(t, "the standby taking over", func() (bool, string) {
		n, who, seen := leaders()
		return n == 1 && who != leader, seen
	})
	t.Logf("takeover after %v", took.Round(time.Millisecond))
	b.paidAndRefunded(t, "G", 30, false) // published by the new leader
	b.waitPublished(t)
	b.consume(t, "shipper", "s1", 0, 60)
	if n := b.count(t, `SELECT count(*) FROM shipment`); n != 60 {
		t.Errorf("shipments %d, want 60", n)
	}
}

// Point 3: a redelivered ORDER_PAID, a stale ORDER_PAID after SHIPPED, and
// a consumer that dies holding pending messages: one shipment per order.
func TestConsumerShipsOncePerOrder(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.paidAndRefunded(t, "K", 20, false)
	runRelay(t, b.store, redisstream.NewPublisher(b.client, "", 0), nil)
	b.waitPublished(t)

	// A consumer reads everything and dies before acknowledging anything.
	if err := b.client.XGroupCreateMkStream(ctx, redisstream.DefaultStream, "shipper", "0").Err(); err != nil {
		t.Fatal(err)
	}
	got, err := b.client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "shipper", Consumer: "dead",
		Streams: []string{redisstream.DefaultStream, ">"}, Count: 1000}).Result()
	if err != nil || len(got[0].Messages) != 20 {
		t.Fatalf("dead consumer read %v %v", got, err)
	}
	// Redeliveries: the same outbox ids again, and a stale ORDER_PAID for
	// K-000 under a new outbox id (it will be SHIPPED by then).
	var firstID int64
	b.db.QueryRow(ctx, `SELECT min(id) FROM outbox`).Scan(&firstID)
	pub := redisstream.NewPublisher(b.client, "", 0)
	if err := pub.Publish(ctx, []durable.OutboxMessage{{ID: firstID, Topic: "ORDER_PAID", OrderNo: "K-000", Payload: []byte("{}")},
		{ID: firstID + 1, Topic: "ORDER_PAID", OrderNo: "K-001", Payload: []byte("{}")}}); err != nil {
		t.Fatal(err)
	}
	b.consume(t, "shipper", "alive", 300*time.Millisecond, 20)
	if err := pub.Publish(ctx, []durable.OutboxMessage{{ID: 1 << 40, Topic: "ORDER_PAID", OrderNo: "K-000", Payload: []byte("{}")}}); err != nil {
		t.Fatal(err)
	}
	b.consume(t, "shipper", "alive", 300*time.Millisecond, 20)
	if n := b.count(t, `SELECT count(*) FROM shipment`); n != 20 {
		t.Errorf("shipments %d, want 20", n)
	}
	if n := b.count(t, `SELECT count(*) FROM (SELECT order_no FROM shipment GROUP BY order_no HAVING count(*) > 1) x`); n != 0 {
		t.Errorf("%d orders shipped twice", n)
	}
	if n := b.count(t, `SELECT count(*) FROM consumer_inbox WHERE outbox_id = $1`, int64(1<<40)); n != 1 {
		t.Errorf("the stale message was not processed (inbox %d)", n)
	}
	pending, err := b.client.XPending(ctx, redisstream.DefaultStream, "shipper").Result()
	if err != nil || pending.Count != 0 {
		t.Errorf("pending after the claim: %+v %v, want none", pending, err)
	}
	// Acknowledged entries may now be trimmed; nothing pending is lost.
	if err := pub.Trim(ctx); err != nil {
		t.Fatal(err)
	}
}

// One order the shipper cannot lock fails its read's transaction; the
// others are shipped alone and acknowledged at once, and the stuck one
// stays pending until it can be shipped (reclaimed after ClaimIdle).
func TestBatchShipperShipsAroundAStuckOrder(t *testing.T) {
	b := setup(t)
	s, err := durable.New(context.Background(), durable.Config{URL: b.url, MaxConns: 8, MinConns: 1, LockTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	b.store = s
	b.paidAndRefunded(t, "K", 10, false)
	runRelay(t, b.store, redisstream.NewPublisher(b.client, "", 0), nil)
	b.waitPublished(t)
	release := durabletest.LockOrder(t, b.db, "K-004")
	defer b.startConsumer(t, "shipper", "s1", time.Second)()
	b.waitShipped(t, "the other 9 orders shipped, one message pending", 9, 1)
	if got := b.count(t, `SELECT count(*) FROM biz_order WHERE order_no = 'K-004' AND status = 'PAID'`); got != 1 {
		t.Fatalf("the locked order moved")
	}
	release()
	b.waitShipped(t, "the stuck order shipped once free", 10, 0)
	if n := b.count(t, `SELECT count(*) FROM shipment`); n != 10 {
		t.Errorf("%d shipments for 10 orders", n)
	}
}

// waitShipped waits until shipped orders are SHIPPED and pending messages
// wait in the shipper group.
func (b *bundle) waitShipped(t *testing.T, what string, shipped int, pending int64) {
	t.Helper()
	wait.For(t, what, func() (bool, string) {
		n := b.count(t, `SELECT count(*) FROM biz_order WHERE status = 'SHIPPED'`)
		pend, err := b.client.XPending(context.Background(), redisstream.DefaultStream, "shipper").Result()
		if err != nil {
			return false, err.Error()
		}
		return n == shipped && pend.Count == pending, fmt.Sprintf("%d shipped, %d pending", n, pend.Count)
	})
}
