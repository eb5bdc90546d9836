package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/notifyedge/notifyedge/edge/channel"
)

// A source yields the next callback of a scenario. It is called from many
// goroutines at once.
type source interface {
	next() payment
}

// payment is one callback to deliver.
type payment struct {
	order, txn string
}

func (p payment) key(channel string) string { return channel + ":" + p.txn + ":PAY_SUCCESS" }

func (p payment) body() []byte {
	return fmt.Appendf(nil, `{"channel_txn_id":%q,"event_type":"PAY_SUCCESS","order_no":%q,"amount":1999,"currency":"CNY"}`, p.txn, p.order)
}

// pool hands out seeded PENDING_PAY orders, each once.
type pool struct {
	prefix string
	size   int64
	next   atomic.Int64
}

func (p *pool) take() payment {
	i := p.next.Add(1) - 1
	if i >= p.size {
		// Exhausted: keys repeat, as duplicates. A row that met this
		// fails (env.row): its first deliveries were replays.
		i %= p.size
	}
	no := fmt.Sprintf("%s-%07d", p.prefix, i)
	return payment{order: no, txn: "TX" + no}
}

// left is how many orders the pool has not handed out.
func (p *pool) left() int64 { return max(p.size-p.next.Load(), 0) }

// firstSource: 100 % first deliveries.
type firstSource struct{ p *pool }

func (s *firstSource) next() payment { return s.p.take() }

// dupSource: a share of duplicates drawn from the recently delivered keys,
// the rest first deliveries.
type dupSource struct {
	p      *pool
	dupPct int
	mu     sync.Mutex
	recent []payment
	n      atomic.Uint64
}

func (s *dupSource) next() payment {
	n := s.n.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if int(n%100) < s.dupPct && len(s.recent) > 0 {
		return s.recent[int(n*2654435761)%len(s.recent)]
	}
	p := s.p.take()
	if len(s.recent) < 1000 {
		s.recent = append(s.recent, p)
	} else {
		s.recent[int(n)%1000] = p
	}
	return p
}

// stormSource: 64 copies of each key in a row, so that with at least 64
// workers they arrive at once.
type stormSource struct {
	p       *pool
	copies  int
	mu      sync.Mutex
	current payment
	left    int
}

func (s *stormSource) next() payment {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.left == 0 {
		s.current, s.left = s.p.take(), s.copies
	}
	s.left--
	return s.current
}

// retrySource follows a channel's retry schedule (15 s, 15 s, 30 s, 3 min,
// 10 min), compressed by factor, mixed with new payments: a due retry goes
// first, otherwise a new payment is sent and its retries scheduled.
type retrySource struct {
	p        *pool
	schedule []time.Duration
	mu       sync.Mutex
	due      []retry // sorted by at
}

type retry struct {
	at time.Time
	p  payment
}

func newRetrySource(p *pool, compress float64) *retrySource {
	var sched []time.Duration
	var at time.Duration
	for _, d := range []time.Duration{15 * time.Second, 15 * time.Second, 30 * time.Second, 3 * time.Minute, 10 * time.Minute} {
		at += d
		sched = append(sched, time.Duration(float64(at)/compress))
	}
	return &retrySource{p: p, schedule: sched}
}

func (s *retrySource) next() payment {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.due) > 0 && !s.due[0].at.After(now) {
		r := s.due[0]
		s.due = s.due[1:]
		return r.p
	}
	p := s.p.take()
	for _, d := range s.schedule {
		s.due = append(s.due, retry{now.Add(d), p})
	}
	sort.Slice(s.due, func(i, j int) bool { return s.due[i].at.Before(s.due[j].at) })
	return p
}

// tally counts answers and keeps the keys answered SUCCESS.
type tally struct {
	channel  string
	mu       sync.Mutex
	codes    map[int]int
	errors   int
	firstErr string // the first transport error, to name in a failure
	replayed int
	success  map[string]bool
}

func newTally(channel string) *tally {
	return &tally{channel: channel, codes: map[int]int{}, success: map[string]bool{}}
}

var successPrefix = []byte(`{"code":"SUCCESS"`)

func (t *tally) add(p payment, code int, body []byte, replayed bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		if t.errors == 0 {
			t.firstErr = err.Error()
		}
		t.errors++
		return
	}
	t.codes[code]++
	if replayed {
		t.replayed++
	}
	if code == http.StatusOK && bytes.HasPrefix(body, successPrefix) {
		t.success[p.key(t.channel)] = true
	}
}

// signedHeaders signs body now under a fresh webhook-id.
func signedHeaders(secret string, seq uint64, body []byte) (id, ts, sig string) {
	now := time.Now().Unix()
	id = "msg_" + strconv.FormatUint(seq, 36)
	sig, _ = channel.SignWebhook(secret, id, now, body)
	return id, strconv.FormatInt(now, 10), sig
}

var idSeq atomic.Uint64

// setCallback makes req the POST of body to tg's channel at url, freshly
// signed under a new webhook-id.
func setCallback(req *fasthttp.Request, tg *Target, url string, body []byte) {
	id, ts, sig := signedHeaders(tg.Secret, idSeq.Add(1), body)
	req.Reset()
	req.SetRequestURI(url + "/notify/" + tg.Channel)
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", ts)
	req.Header.Set("webhook-signature", sig)
	req.SetBody(body)
}

// closedLoop runs workers that each send the next callback as soon as the
// last one was answered, for d: the peak a node sustains. It returns the
// latencies.
func closedLoop(ctx context.Context, tg *Target, url string, workers int, d time.Duration, src source, t *tally, progress func(int64)) []time.Duration {
	client := &fasthttp.Client{MaxConnsPerHost: workers * 2, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(d)
	var sent atomic.Int64
	lat := make([][]time.Duration, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				p := src.next()
				body := p.body()
				setCallback(req, tg, url, body)
				start := time.Now()
				err := client.Do(req, resp)
				lat[w] = append(lat[w], time.Since(start))
				t.add(p, resp.StatusCode(), resp.Body(), string(resp.Header.Peek("Idempotent-Replayed")) == "true", err)
				sent.Add(1)
			}
		}()
	}
	stop := make(chan struct{})
	go func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				progress(sent.Load())
			}
		}
	}()
	wg.Wait()
	close(stop)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	return all
}

// millis is d in milliseconds, to the microsecond: how the figures print
// latencies.
func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// percentiles of sorted latencies.
type percentiles struct {
	P50, P90, P99, P999, Max time.Duration
}

func percentilesOf(lat []time.Duration) percentiles {
	if len(lat) == 0 {
		return percentiles{}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(f float64) time.Duration { return lat[min(len(lat)-1, int(f*float64(len(lat))))] }
	return percentiles{q(.50), q(.90), q(.99), q(.999), lat[len(lat)-1]}
}
