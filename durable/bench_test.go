package durable_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/notifyedge/notifyedge/bench/procstat"
	"github.com/notifyedge/notifyedge/durable"
)

// The benchmarks run with 32 concurrent clients on a 2-core machine
// (SetParallelism(16) x GOMAXPROCS) against a cluster with fsync and
// synchronous_commit on. Process sits beside the same work done by raw pgx,
// statement by statement and pipelined, so the ratio comes from one run.

const benchParallelism = 16

var benchSeq atomic.Int64

// seedPending inserts n PENDING_PAY orders and returns their notifications.
func seedPending(b *testing.B, bb *bundle, n int) []durable.Notification {
	b.Helper()
	run := benchSeq.Add(1)
	rows := make([][]any, n)
	notes := make([]durable.Notification, n)
	for i := range n {
		orderNo := fmt.Sprintf("B%d-%d", run, i)
		rows[i] = []any{orderNo, "PENDING_PAY", int64(1999), "CNY"}
		notes[i] = note("TX"+orderNo, durable.PaySuccess, orderNo, 1999, "CNY")
	}
	if _, err := bb.db.CopyFrom(context.Background(), []string{"biz_order"},
		[]string{"order_no", "status", "amount", "currency"}, pgx.CopyFromRows(rows)); err != nil {
		b.Fatal(err)
	}
	return notes
}

// seedApplied is seedPending with every notification applied once.
func seedApplied(b *testing.B, bb *bundle, n int) []durable.Notification {
	b.Helper()
	notes := seedPending(b, bb, n)
	for _, n := range notes {
		if _, err := bb.store.Process(context.Background(), n); err != nil {
			b.Fatal(err)
		}
	}
	return notes
}

func benchBundle(b *testing.B, group ...int) *bundle {
	b.Helper()
	url := durabletestNewDatabaseB(b)
	cfg := durable.Config{URL: url, MaxConns: 40, MinConns: 40}
	if len(group) > 0 {
		cfg.GroupCommit, cfg.GroupBatches = true, group[0]
	}
	s, err := durable.New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	return &bundle{url: url, store: s, db: newPoolB(b, url)}
}

// runParallel hands each op the next notification.
func runParallel(b *testing.B, notes []durable.Notification, op func(ctx context.Context, n durable.Notification) error) {
	var next atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			i := next.Add(1) - 1
			if err := op(ctx, notes[int(i)%len(notes)]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tx/s")
}

func BenchmarkProcessApplied(b *testing.B) {
	bb := benchBundle(b)
	notes := seedPending(b, bb, b.N)
	runParallel(b, notes, func(ctx context.Context, n durable.Notification) error {
		r, err := bb.store.Process(ctx, n)
		if err == nil && r.Outcome != durable.Applied {
			err = fmt.Errorf("%s: %v", n.BizKey, r.Outcome)
		}
		return err
	})
}

// The same first deliveries, decided in batches (group commit), with 2, 4
// and 8 batches in flight.
func BenchmarkProcessAppliedGroup(b *testing.B) {
	for _, slots := range []int{2, 4, 8} {
		b.Run(fmt.Sprintf("batches=%d", slots), func(b *testing.B) { benchGroup(b, slots) })
	}
}

func benchGroup(b *testing.B, slots int) {
	bb := benchBundle(b, slots)
	notes := seedPending(b, bb, b.N)
	runParallel(b, notes, func(ctx context.Context, n durable.Notification) error {
		r, err := bb.store.Process(ctx, n)
		if err == nil && r.Outcome != durable.Applied {
			err = fmt.Errorf("%s: %v", n.BizKey, r.Outcome)
		}
		return err
	})
	st := bb.store.GroupStats()
	if n := st.Batches.Load(); n > 0 {
		b.ReportMetric(float64(st.Batched.Load())/float64(n), "deliveries/batch")
	}
	b.ReportMetric(float64(st.Alone.Load())/float64(b.N), "alone/op")
}

func BenchmarkProcessReplay(b *testing.B) {
	bb := benchBundle(b)
	notes := seedApplied(b, bb, 1000)
	runParallel(b, notes, func(ctx context.Context, n durable.Notification) error {
		r, err := bb.store.Process(ctx, n)
		if err == nil && !r.Replayed {
			err = fmt.Errorf("%s: not replayed", n.BizKey)
		}
		return err
	})
}

// The raw transaction of a first delivery: claim, conditional UPDATE,
// outbox row, claim DONE. It has none of Process's decisions (no replay
// lookup, no row lock, no review rows), so it is the ceiling.
const (
	rawClaim  = `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state) VALUES ($1, $2, $3, 'PENDING') ON CONFLICT (biz_key) DO NOTHING RETURNING id`
	rawUpdate = `UPDATE biz_order SET status = 'PAID', updated_at = now() WHERE order_no = $1 AND status = ANY ('{PENDING_PAY}') AND amount = $2 AND currency = $3`
	rawOutbox = `INSERT INTO outbox (topic, order_no, payload) VALUES ('ORDER_PAID', $1::text, jsonb_build_object('order_no', $1::text, 'event_type', 'PAY_SUCCESS', 'from', 'PENDING_PAY', 'to', 'PAID', 'biz_key', $2::text))`
	rawDone   = `UPDATE notify_claim SET claim_state = 'DONE', result_json = '{"http":200,"code":"SUCCESS","outcome":"applied","status":"PAID"}' WHERE biz_key = $1`
	rawReplay = `SELECT payload_hash, result_json FROM notify_claim WHERE biz_key = $1`
)

// Six round trips: BEGIN, four statements, COMMIT.
func BenchmarkRawStatementByStatement(b *testing.B) {
	bb := benchBundle(b)
	notes := seedPending(b, bb, b.N)
	runParallel(b, notes, func(ctx context.Context, n durable.Notification) error {
		tx, err := bb.db.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		var id int64
		if err := tx.QueryRow(ctx, rawClaim, n.BizKey, n.OrderNo, n.Digest).Scan(&id); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, rawUpdate, n.OrderNo, n.Amount, n.Currency)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("%s: not moved", n.OrderNo)
		}
		if _, err := tx.Exec(ctx, rawOutbox, n.OrderNo, n.BizKey); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, rawDone, n.BizKey); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
}

// One round trip: the four statements pipelined in one implicit
// transaction (pgx sends a batch with a single Sync).
func BenchmarkRawPipelined(b *testing.B) {
	bb := benchBundle(b)
	notes := seedPending(b, bb, b.N)
	runParallel(b, notes, func(ctx context.Context, n durable.Notification) error {
		var batch pgx.Batch
		batch.Queue(rawClaim, n.BizKey, n.OrderNo, n.Digest)
		batch.Queue(rawUpdate, n.OrderNo, n.Amount, n.Currency)
		batch.Queue(rawOutbox, n.OrderNo, n.BizKey)
		batch.Queue(rawDone, n.BizKey)
		return bb.db.SendBatch(ctx, &batch).Close()
	})
}

func BenchmarkRawReplay(b *testing.B) {
	bb := benchBundle(b)
	notes := seedApplied(b, bb, 1000)
	runParallel(b, notes, func(ctx context.Context, n durable.Notification) error {
		var hash, result string
		return bb.db.QueryRow(ctx, rawReplay, n.BizKey).Scan(&hash, &result)
	})
}

// What one batch statement costs Postgres per payment, by batch size: one
// session decides b.N batches of k payments of pending orders in turn, and
// the backend's own CPU (from /proc, so Postgres must run here) is divided
// by the payments. k = 1 is the one-at-a-time statement, and "k=1,batch"
// one payment through the batch function, what a lone delivery would cost
// were it decided that way. With -bench the cluster has fsync on, so each
// batch's commit flush is in the figure.
func BenchmarkBatchSize(b *testing.B) {
	for _, k := range []int{0, 1, 4, 16, 32, 64} {
		name, decide := fmt.Sprintf("k=%d", k), durable.DecideTogether
		if k == 0 {
			k, name, decide = 1, "k=1,batch", durable.DecideAsBatch
		}
		b.Run(name, func(b *testing.B) {
			bb := benchBundle(b)
			s, err := durable.New(context.Background(), durable.Config{URL: bb.url, MaxConns: 1, MinConns: 1, GroupCommit: true, NoMigrate: true})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(s.Close)
			ctx := context.Background()
			notes := seedPending(b, bb, b.N*k)
			pgPerPayment(b, s, k, func(i int) error {
				if o, err := decide(ctx, s, notes[i*k:(i+1)*k]); err != nil || o != durable.Applied {
					return fmt.Errorf("%v %v", o, err)
				}
				return nil
			})
		})
	}
}

// pgPerPayment runs batch(i) for i in [0, b.N), each k payments on s's
// one callback session, and reports that backend's CPU per payment.
func pgPerPayment(b *testing.B, s *durable.Store, k int, batch func(i int) error) {
	b.Helper()
	pid, err := durable.CallbackBackendPID(context.Background(), s)
	if err != nil {
		b.Fatal(err)
	}
	before := backendTicks(b, pid)
	b.ResetTimer()
	for i := range b.N {
		if err := batch(i); err != nil {
			b.Fatalf("batch %d: %v", i, err)
		}
	}
	b.StopTimer()
	ticks := backendTicks(b, pid) - before
	b.ReportMetric(float64(ticks)*1e6/float64(procstat.ClockTicks())/float64(b.N*k), "pg-µs/payment")
}

// backendTicks reads a process's own user and system CPU time, in clock
// ticks; a Postgres that does not run here skips the benchmark.
func backendTicks(b *testing.B, pid int) uint64 {
	b.Helper()
	st, err := procstat.Read(pid)
	if err != nil {
		b.Skipf("Postgres does not run on this machine: %v", err)
	}
	return st.UTime + st.STime
}

// The rows a first delivery writes, in the fewest statements the schema
// allows: no lookups, no locks taken ahead, no state machine, no answers.
// What they cost Postgres is the floor under deciding and shipping; the
// functions' figures beside them say what their reading, locking and
// checking add.
const (
	floorDecide = `WITH c AS (
    INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json)
    SELECT k, o, h, 'DONE', '{"http":200,"code":"SUCCESS","outcome":"applied","status":"PAID"}'
      FROM unnest($1::text[], $2::text[], $3::text[]) AS u(k, o, h)),
m AS (
    UPDATE biz_order b SET status = 'PAID', paid_by = u.t, updated_at = now()
      FROM unnest($2::text[], $4::text[]) AS u(o, t)
     WHERE b.order_no = u.o AND b.status = 'PENDING_PAY'
    RETURNING b.order_no)
INSERT INTO outbox (topic, order_no, payload)
SELECT 'ORDER_PAID', m.order_no, jsonb_build_object('order_no', m.order_no, 'event_type', 'PAY_SUCCESS',
       'from', 'PENDING_PAY', 'to', 'PAID', 'biz_key', 'floor') FROM m`
	floorShip = `WITH i AS (
    INSERT INTO consumer_inbox (consumer, outbox_id) SELECT 'floor', x FROM unnest($1::bigint[]) AS x),
s AS (
    INSERT INTO shipment (order_no, outbox_id, source)
    SELECT o, x, 'floor' FROM unnest($2::text[], $1::bigint[]) AS u(o, x)),
m AS (
    UPDATE biz_order b SET status = 'SHIPPED', updated_at = now()
      FROM unnest($2::text[]) AS u(o)
     WHERE b.order_no = u.o AND b.status = 'PAID'
    RETURNING b.order_no)
INSERT INTO outbox (topic, order_no, payload)
SELECT 'ORDER_SHIPPED', m.order_no, jsonb_build_object('order_no', m.order_no, 'event_type', 'SHIP',
       'from', 'PAID', 'to', 'SHIPPED', 'biz_key', NULL) FROM m`
)

// What a first delivery's rows cost Postgres per payment, in batches of 32
// on one session (CPU from /proc, so Postgres must run here): deciding
// (claim, order, outbox row), shipping (inbox row, shipment, order, outbox
// row), each as the bare rows ("rows") and as the functions the edge and
// the shipper call ("function"), and the relay's mark of one outbox row
// (its own statement, committed asynchronously as the relay does). A
// delivery pays one decide, one ship and two marks.
func BenchmarkPaymentFloor(b *testing.B) {
	const k = 32
	for _, c := range []struct{ stage, way string }{
		{"decide", "rows"}, {"decide", "function"}, {"ship", "rows"}, {"ship", "function"}, {"mark", "rows"},
	} {
		b.Run(c.stage+"/"+c.way, func(b *testing.B) {
			bb := benchBundle(b)
			ctx := context.Background()
			// The measured session: one connection, through a Store of its
			// own so that the functions run as the edge and shipper run them.
			s, err := durable.New(ctx, durable.Config{URL: bb.url, MaxConns: 1, MinConns: 1, GroupCommit: true, NoMigrate: true})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(s.Close)
			conn, err := durable.CallbackPool(s).Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			// The functions' own plan settings, for the bare statements too.
			if _, err := conn.Exec(ctx, `SET enable_seqscan = off; SET enable_hashjoin = off; SET enable_mergejoin = off`); err != nil {
				b.Fatal(err)
			}
			if c.stage == "mark" {
				if _, err := conn.Exec(ctx, `SET synchronous_commit = off`); err != nil {
					b.Fatal(err)
				}
			}
			conn.Release()
			notes := seedPending(b, bb, b.N*k)
			var ids []int64 // the ORDER_PAID rows, for ship and mark
			if c.stage != "decide" {
				for i := 0; i < len(notes); i += k {
					if _, err := durable.DecideTogether(ctx, s, notes[i:i+k]); err != nil {
						b.Fatal(err)
					}
				}
				if err := bb.db.QueryRow(ctx, `SELECT array_agg(id ORDER BY order_no COLLATE "C") FROM outbox WHERE topic = 'ORDER_PAID'`).Scan(&ids); err != nil {
					b.Fatal(err)
				}
				if len(ids) != len(notes) {
					b.Fatalf("%d paid rows for %d payments", len(ids), len(notes))
				}
				slices.SortFunc(notes, func(x, y durable.Notification) int { return strings.Compare(x.OrderNo, y.OrderNo) })
			}
			pgPerPayment(b, s, k, func(i int) error {
				return floorStep(ctx, s, c.stage, c.way, notes[i*k:(i+1)*k], ids[min(i*k, len(ids)):min((i+1)*k, len(ids))])
			})
		})
	}
}

// floorStep writes one batch's rows of stage, the way named, and checks
// that every payment of it moved.
func floorStep(ctx context.Context, s *durable.Store, stage, way string, notes []durable.Notification, ids []int64) error {
	keys, orders, hashes, trades := make([]string, len(notes)), make([]string, len(notes)), make([]string, len(notes)), make([]string, len(notes))
	for i, n := range notes {
		keys[i], orders[i], hashes[i], trades[i] = n.BizKey, n.OrderNo, n.Digest, n.Trade
	}
	var moved int64
	switch stage + "/" + way {
	case "decide/rows":
		tag, err := durable.CallbackPool(s).Exec(ctx, floorDecide, keys, orders, hashes, trades)
		if err != nil {
			return err
		}
		moved = tag.RowsAffected()
	case "decide/function":
		o, err := durable.DecideTogether(ctx, s, notes)
		if err != nil || o != durable.Applied {
			return fmt.Errorf("decided %v: %v", o, err)
		}
		moved = int64(len(notes))
	case "ship/rows":
		tag, err := durable.CallbackPool(s).Exec(ctx, floorShip, ids, orders)
		if err != nil {
			return err
		}
		moved = tag.RowsAffected()
	case "ship/function":
		items := make([]durable.ShipItem, len(notes))
		for i := range notes {
			items[i] = durable.ShipItem{OutboxID: ids[i], OrderNo: orders[i]}
		}
		ds, err := s.ShipMany(ctx, "floor", items)
		if err != nil {
			return err
		}
		for _, d := range ds {
			if d.Result == durable.ShipApplied {
				moved++
			}
		}
	case "mark/rows":
		tag, err := durable.CallbackPool(s).Exec(ctx, `UPDATE outbox SET published_at = now() WHERE id = ANY($1) AND published_at IS NULL`, ids)
		if err != nil {
			return err
		}
		moved = tag.RowsAffected()
	}
	if moved != int64(len(notes)) {
		return fmt.Errorf("%d of %d moved", moved, len(notes))
	}
	return nil
}
