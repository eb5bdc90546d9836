package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/notifyedge/notifyedge/durable/pgtemp"
)

// LagConfig configures RunLag.
type LagConfig struct {
	Rate     int           // first deliveries per second (default 1000)
	Duration time.Duration // default 10s
	Progress io.Writer
}

// LagReport is the outbox path's figures at a steady callback rate.
type LagReport struct {
	Rate, Sent, Failed int
	Duration           time.Duration
	// Lag from the outbox row's insert (in the deciding transaction) to the
	// shipper's committed shipment (it acknowledges right after).
	LagP50, LagP99, LagMax time.Duration
}

// RunLag sends first deliveries at a constant rate (open loop: the pace
// does not wait for answers, so slow answers cannot hide as lower load)
// against a stack with fsync on, then reads the lag by SQL.
func RunLag(ctx context.Context, cfg LagConfig) (LagReport, error) {
	if cfg.Rate <= 0 {
		cfg.Rate = 1000
	}
	if cfg.Duration == 0 {
		cfg.Duration = 10 * time.Second
	}
	st, err := StartStack(ctx, StackConfig{Durable: true})
	if err != nil {
		return LagReport{}, err
	}
	defer st.Close()
	n := int(float64(cfg.Rate) * cfg.Duration.Seconds())
	orders, err := pgtemp.SeedPending(ctx, st.DBURL, "LAG-%07d", n, 1999)
	if err != nil {
		return LagReport{}, err
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	rep := LagReport{Rate: cfg.Rate, Duration: cfg.Duration}
	var sent, failed atomic.Int64
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(cfg.Rate)
	start := time.Now()
	lastLine := start
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := orders[i].No
			body := fmt.Sprintf(`{"channel_txn_id":"TX%s","event_type":"PAY_SUCCESS","order_no":%q,"amount":1999,"currency":"CNY"}`, o, o)
			if outcome, err := edgePost(client, st.URL, "m-"+o, body); err != nil || outcome != "applied" {
				failed.Add(1)
			}
			sent.Add(1)
		}()
		if cfg.Progress != nil && time.Since(lastLine) >= time.Second {
			lastLine = time.Now()
			fmt.Fprintf(cfg.Progress, "\r  %5.1fs  sent %7d  failed %d", time.Since(start).Seconds(), sent.Load(), failed.Load())
		}
	}
	wg.Wait()
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "\r  %5.1fs  sent %7d  failed %d\n", time.Since(start).Seconds(), sent.Load(), failed.Load())
	}
	rep.Sent, rep.Failed = int(sent.Load()), int(failed.Load())
	if err := waitDrained(ctx, st, n-rep.Failed); err != nil {
		return rep, err
	}
	var p50, p99, pmax float64
	err = st.DB.QueryRow(ctx, `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), percentile_cont(0.99) WITHIN GROUP (ORDER BY lag), max(lag)
		FROM (SELECT extract(epoch FROM s.shipped_at - o.created_at) AS lag
		      FROM outbox o JOIN shipment s ON s.outbox_id = o.id WHERE o.topic = 'ORDER_PAID') x`).Scan(&p50, &p99, &pmax)
	if err != nil {
		return rep, fmt.Errorf("read lag: %w", err)
	}
	sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
	rep.LagP50, rep.LagP99, rep.LagMax = sec(p50), sec(p99), sec(pmax)
	return rep, nil
}

// Table renders the report.
func (r LagReport) Table() string {
	return fmt.Sprintf("outbox lag at %d callbacks/s for %v (fsync on): sent %d, failed %d\n"+
		"  commit -> shipped: p50 %v  p99 %v  max %v\n",
		r.Rate, r.Duration, r.Sent, r.Failed, r.LagP50.Round(time.Microsecond*100), r.LagP99.Round(time.Microsecond*100), r.LagMax.Round(time.Millisecond))
}
