package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// The open-loop driver: requests sent at a fixed rate whatever the answers
// take, with a live progress line.

// openLoop is vegeta's constant-rate attack: the pace does not wait for
// answers, so latency is measured without coordinated omission.
func openLoop(ctx context.Context, tg *Target, name, base string, perSec int, d time.Duration, src source, t *tally, progress io.Writer) Row {
	return openLoopWorkers(ctx, tg, name, base, perSec, 512, d, src, t, progress)
}

func openLoopWorkers(ctx context.Context, tg *Target, name, base string, perSec, maxWorkers int, d time.Duration, src source, t *tally, progress io.Writer) Row {
	var byID sync.Map // "?p=" index -> payment, to know each answer's key
	var seq atomic.Int64
	targeter := func(tgt *vegeta.Target) error {
		p := src.next()
		body := p.body()
		id, ts, sig := signedHeaders(tg.Secret, idSeq.Add(1), body)
		n := seq.Add(1)
		byID.Store(n, p)
		tgt.Method, tgt.Body = http.MethodPost, body
		tgt.URL = base + "/notify/" + tg.Channel + "?p=" + fmt.Sprint(n)
		tgt.Header = http.Header{"Content-Type": {"application/json"}, "Webhook-Id": {id}, "Webhook-Timestamp": {ts}, "Webhook-Signature": {sig}}
		return nil
	}
	// A transport of our own (fasthttp's exchange: see fastTransport),
	// closed after the attack: idle keep-alive connections left behind
	// would pile up across attacks on the edge. Idle connections are
	// dropped a second before the edge's 5 s idle timeout: at the same 5 s,
	// a request could go out on a connection the edge is closing, and fail
	// (a POST is not retried).
	tr := newFastTransport(maxWorkers, 4*time.Second)
	defer tr.CloseIdleConnections()
	attacker := vegeta.NewAttacker(vegeta.Workers(uint64(min(64, maxWorkers))), vegeta.MaxWorkers(uint64(maxWorkers)),
		vegeta.Client(&http.Client{Transport: tr, Timeout: 5 * time.Second}))
	var m vegeta.Metrics
	var points []Point
	start := time.Now()
	live := liveLine(progress, name, start)
	var n int64
	for res := range attacker.Attack(vegeta.Targeter(targeter), vegeta.Rate{Freq: perSec, Per: time.Second}, d, name) {
		m.Add(res)
		points = append(points, Point{At: res.Timestamp.Sub(start), Latency: res.Latency})
		var p payment
		if u, err := url.Parse(res.URL); err == nil {
			var k int64
			fmt.Sscan(u.Query().Get("p"), &k)
			if v, ok := byID.LoadAndDelete(k); ok {
				p = v.(payment)
			}
		}
		// vegeta sets Error for an answer outside 2xx too: that one is an
		// answer, counted under its code; only a result without a code
		// is a transport error.
		var err error
		if res.Error != "" && res.Code == 0 {
			err = errors.New(res.Error)
		}
		t.add(p, int(res.Code), res.Body, res.Headers.Get("Idempotent-Replayed") == "true", err)
		n++
		live(n)
		if ctx.Err() != nil {
			attacker.Stop()
		}
	}
	m.Close()
	return Row{Name: name, Driver: fmt.Sprintf("vegeta %d/s", perSec), Requests: int(m.Requests), ReqPerSec: m.Throughput,
		Lat:    percentiles{m.Latencies.P50, m.Latencies.P90, m.Latencies.P99, m.Latencies.Quantile(0.999), m.Latencies.Max},
		Errors: t.errors, Codes: t.codes, Points: points}
}

// liveLine returns a progress printer for one attack: one line, rewritten
// at most four times a second.
func liveLine(w io.Writer, name string, start time.Time) func(int64) {
	var last time.Time
	var mu sync.Mutex
	return func(n int64) {
		if w == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if time.Since(last) < 250*time.Millisecond {
			return
		}
		last = time.Now()
		el := time.Since(start).Seconds()
		fmt.Fprintf(w, "\r  %-26s %5.1fs  %8d sent  %8.0f/s", name, el, n, float64(n)/max(el, 0.001))
	}
}
