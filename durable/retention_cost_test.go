package durable_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/notifyedge/notifyedge/bench/procstat"
	"github.com/notifyedge/notifyedge/durable"
)

// What one retention batch costs Postgres per row it deletes: the
// leader's backend CPU, its wall time, and the WAL it writes, from a
// checkpoint on (so every heap page's first change after it writes a full
// page image, as it does in a running system between checkpoints). Run it
// with -benchtime=Nx: N batches of 1,000 rows, seeded before the timer.
// Full page images are most of that WAL; the wal_compression rows say what
// the server setting saves.
func BenchmarkRetentionBatch(b *testing.B) {
	for _, table := range []string{durable.TableClaim, durable.TableOutbox} {
		for _, wc := range []string{"off", "lz4"} {
			b.Run(table+"/wal_compression="+wc, func(b *testing.B) { benchRetentionBatch(b, table, wc) })
		}
	}
}

// seedExpired inserts n rows of table old enough for retention, shaped
// as the callbacks write them.
func seedExpired(b *testing.B, db *pgx.Conn, table string, n int) {
	b.Helper()
	sql := `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json, created_at)
	SELECT 'wechatpay:42000012' || lpad(g::text, 20, '0') || ':pay.success', 'ORD2026' || lpad(g::text, 12, '0'),
	       md5(g::text) || md5((g + 1)::text), 'DONE', '{"outcome":"applied","status":"PAID","code":"SUCCESS"}',
	       now() - interval '200 hours' + g * interval '1 millisecond'
	  FROM generate_series(1, $1) g`
	if table == durable.TableOutbox {
		sql = `INSERT INTO outbox (topic, order_no, payload, created_at, published_at)
	SELECT 'order.paid', 'ORD2026' || lpad(g::text, 12, '0'),
	       jsonb_build_object('order_no', 'ORD2026' || lpad(g::text, 12, '0'), 'status', 'PAID', 'amount', 1999,
	                          'currency', 'CNY', 'channel', 'wechatpay', 'channel_txn_id', '42000012' || lpad(g::text, 20, '0')),
	       now() - interval '200 hours' + g * interval '1 millisecond', now() - interval '200 hours' + g * interval '1 millisecond'
	  FROM generate_series(1, $1) g`
	}
	ctx := context.Background()
	for _, q := range []string{"ALTER TABLE " + table + " SET (autovacuum_enabled = false)", "TRUNCATE " + table} {
		if _, err := db.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := db.Exec(ctx, sql, n); err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{"VACUUM ANALYZE " + table, "CHECKPOINT"} {
		if _, err := db.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
}

func benchRetentionBatch(b *testing.B, table, walCompression string) {
	ctx := context.Background()
	bb := benchBundle(b)
	db, err := pgx.Connect(ctx, bb.url)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close(ctx)
	const batch = 1000
	seedExpired(b, db, table, b.N*batch)
	conn, sql, err := durable.RetentionBatchConn(ctx, bb.store, table)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SET wal_compression = "+walCompression); err != nil {
		b.Skipf("wal_compression = %s: %v", walCompression, err)
	}
	var pid int
	var lsn0 string
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid(), pg_current_wal_insert_lsn()::text").Scan(&pid, &lsn0); err != nil {
		b.Fatal(err)
	}
	ticks := backendTicks(b, pid)
	cutoff := time.Now().Add(-168 * time.Hour)
	var from any = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	var after int64
	deleted := 0
	b.ResetTimer()
	for range b.N {
		var n int64
		var oldest, newest pgtype.Timestamptz
		if table == durable.TableOutbox {
			var read, resume int64
			var lastOld bool
			err = conn.QueryRow(ctx, sql, cutoff, after, batch).Scan(&n, &oldest, &newest, &read, &lastOld, &after, &resume)
		} else {
			err = conn.QueryRow(ctx, sql, cutoff, from, batch).Scan(&n, &oldest, &newest)
			from = newest
		}
		if err != nil {
			b.Fatal(err)
		}
		deleted += int(n)
	}
	b.StopTimer()
	if deleted != b.N*batch {
		b.Fatalf("deleted %d rows, want %d", deleted, b.N*batch)
	}
	var wal int64
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn() - $1::pg_lsn", lsn0).Scan(&wal); err != nil {
		b.Fatal(err)
	}
	cpu := float64(backendTicks(b, pid)-ticks) * 1e6 / float64(procstat.ClockTicks())
	b.ReportMetric(cpu/float64(deleted), "pg-µs/row")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(deleted), "wall-µs/row")
	b.ReportMetric(float64(wal)/float64(deleted), "WAL-B/row")
}
