package redisstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable/redisstream"
)

// BenchmarkRelay: rows published to the stream and marked per second, from
// a backlog of b.N outbox rows (Postgres with fsync on under -bench).
func BenchmarkRelay(b *testing.B) {
	bb := setupB(b)
	ctx := context.Background()
	if _, err := bb.db.Exec(ctx, `INSERT INTO outbox (topic, order_no, payload)
		SELECT 'ORDER_PAID', 'B-' || g, jsonb_build_object('order_no', 'B-' || g) FROM generate_series(1, $1) g`, b.N); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		bb.store.RunRelay(rctx, durableRelayConfig(redisstream.NewPublisher(bb.client, "", 0)))
	}()
	for {
		var n int
		bb.db.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&n)
		if n == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.StopTimer()
	cancel()
	<-done
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "rows/s")
}
