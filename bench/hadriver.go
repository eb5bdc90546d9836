package bench

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/notifyedge/notifyedge/durable/wait"
)

// The HA scenario's driver: callbacks arrive at a steady rate whatever the
// answers, half first deliveries and half re-deliveries of payments
// already acknowledged, and each is retried a second after anything but
// 200, as a channel does, for up to three minutes. Every attempt is kept:
// the report cuts them into the faults' windows.

// haAttempt is one request and what came back.
type haAttempt struct {
	sent, done time.Duration // since the load started
	first      bool          // a first delivery (else a re-delivery of an acknowledged payment)
	code       int           // 0: no answer (the connection failed)
	// retryAfter: the answer had Retry-After, which edged's 503 has and
	// haproxy's does not.
	retryAfter bool
	replayed   bool // Idempotent-Replayed: true
	success    bool // a SUCCESS body
}

// haAck is an acknowledged payment.
type haAck struct {
	p  payment
	at time.Duration
	// again: a later delivery applied it anew (its first commit was lost),
	// at the time of that delivery.
	again time.Duration
}

// haDriver sends the load and keeps what it saw.
type haDriver struct {
	tg     *Target
	url    string
	rate   int
	pool   *pool
	client *fasthttp.Client
	start  time.Time

	mu       sync.Mutex
	attempts []haAttempt
	acks     []*haAck
	byTxn    map[string]*haAck
}

// newHADriver returns a driver whose clock (since) starts now.
func newHADriver(tg *Target, url string, rate int, p *pool) *haDriver {
	return &haDriver{tg: tg, url: url, rate: rate, pool: p, byTxn: map[string]*haAck{}, start: time.Now(),
		client: &fasthttp.Client{MaxConnsPerHost: 2048, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}}
}

func (d *haDriver) since() time.Duration { return time.Since(d.start) }

// run sends callbacks at the rate until load ends, and waits for those in
// flight to be answered 200 or given up; ctx's end (an interrupt) stops
// their retries too.
func (d *haDriver) run(ctx, load context.Context) {
	tick := time.NewTicker(time.Second / time.Duration(d.rate))
	defer tick.Stop()
	var wg sync.WaitGroup
	var n uint64
	for load.Err() == nil {
		select {
		case <-load.Done():
		case <-tick.C:
			n++
			p, first := d.next(n)
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.deliver(ctx, p, first, 3*time.Minute)
			}()
		}
	}
	wg.Wait()
}

// next is every other callback a first delivery, the others re-deliveries
// of an acknowledged payment picked at random.
func (d *haDriver) next(n uint64) (payment, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n%2 == 0 && len(d.acks) > 0 {
		return d.acks[rand.IntN(len(d.acks))].p, false
	}
	return d.pool.take(), true
}

// deliver sends p until it is answered 200, a second apart, for up to
// giveUp or until ctx ends.
func (d *haDriver) deliver(ctx context.Context, p payment, first bool, giveUp time.Duration) (applied, replayed bool) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	body := p.body()
	deadline := time.Now().Add(giveUp)
	for {
		setCallback(req, d.tg, d.url, body)
		a := haAttempt{sent: d.since(), first: first}
		err := d.client.DoTimeout(req, resp, 5*time.Second)
		a.done = d.since()
		if err == nil {
			a.code = resp.StatusCode()
			a.retryAfter = len(resp.Header.Peek("Retry-After")) > 0
			a.replayed = string(resp.Header.Peek("Idempotent-Replayed")) == "true"
			a.success = bytes.HasPrefix(resp.Body(), successPrefix)
		}
		d.record(p, a)
		if a.code == http.StatusOK {
			return a.success && !a.replayed, a.replayed
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false, false
		}
		wait.Sleep(ctx, time.Second)
	}
}

// record keeps an attempt, and an acknowledgement or a payment applied
// again.
func (d *haDriver) record(p payment, a haAttempt) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.attempts = append(d.attempts, a)
	if a.code != http.StatusOK || !a.success {
		return
	}
	if ack, ok := d.byTxn[p.txn]; ok {
		if !a.replayed && ack.again == 0 && a.done > ack.at {
			ack.again = a.done
		}
		return
	}
	ack := &haAck{p: p, at: a.done}
	d.byTxn[p.txn] = ack
	d.acks = append(d.acks, ack)
}

// haSweep is the last re-delivery of every acknowledged payment.
type haSweep struct{ sent, replayed, applied int }

// sweep delivers every acknowledged payment once more, workers at a time.
func (d *haDriver) sweep(ctx context.Context, workers int) haSweep {
	d.mu.Lock()
	acks := append([]*haAck(nil), d.acks...)
	d.mu.Unlock()
	var s haSweep
	var mu sync.Mutex
	jobs := make(chan payment)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range jobs {
				applied, replayed := d.deliver(ctx, p, false, time.Minute)
				mu.Lock()
				s.sent++
				if applied {
					s.applied++
				}
				if replayed {
					s.replayed++
				}
				mu.Unlock()
			}
		}()
	}
	for _, a := range acks {
		if ctx.Err() != nil {
			break
		}
		jobs <- a.p
	}
	close(jobs)
	wg.Wait()
	return s
}

// ackedKeys are the acknowledged payments' idempotency keys.
func (d *haDriver) ackedKeys() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	keys := make([]string, 0, len(d.acks))
	for _, a := range d.acks {
		keys = append(keys, a.p.key(d.tg.Channel))
	}
	sort.Strings(keys)
	return keys
}

// report cuts the attempts into the faults' windows.
func (d *haDriver) report(marks []haMark, end time.Duration) []HAFault {
	d.mu.Lock()
	defer d.mu.Unlock()
	return haWindows(d.attempts, d.acks, marks, end)
}

// haWindows computes each fault's figures from every attempt and
// acknowledgement: a fault's window runs from the start of its procedure
// to the next one's (or end), its outage and recovery are timed from its
// decisive moment, and a payment lost to a fault is one acknowledged
// between the previous fault's moment and this one's, later applied anew.
func haWindows(attempts []haAttempt, acks []*haAck, marks []haMark, end time.Duration) []HAFault {
	var out []HAFault
	for i, m := range marks {
		f := HAFault{What: m.what, At: m.at, End: end}
		if i+1 < len(marks) {
			f.End = marks[i+1].begin
		}
		prev := time.Duration(0)
		if i > 0 {
			prev = marks[i-1].at
		}
		for _, a := range acks {
			if a.at >= m.begin && a.at < f.End {
				f.Acked++
			}
			if a.at >= prev && a.at < m.at && a.again > m.at {
				f.Lost++
			}
		}
		// The outage runs from the first answer that was not 200 to the
		// first first delivery sent after it and answered 200.
		outageStart, outageEnd := f.End, f.End
		for _, a := range attempts {
			if a.code != http.StatusOK && a.done >= m.at && a.done < outageStart {
				outageStart = a.done
			}
		}
		for _, a := range attempts {
			if a.first && a.code == http.StatusOK && a.sent >= outageStart && a.done < outageEnd {
				outageEnd = a.done
			}
		}
		f.OutageAt, f.Outage = -1, -1
		if outageStart < f.End {
			f.OutageAt = outageStart - m.at
			if outageEnd < f.End {
				f.Outage = outageEnd - outageStart
			}
		}
		type second struct{ ok, all int }
		secs := make([]second, int((f.End-m.at)/time.Second)+1)
		for _, a := range attempts {
			if a.done < m.begin || a.done >= f.End {
				continue
			}
			switch {
			case a.code == http.StatusOK:
			case a.code == http.StatusServiceUnavailable && a.retryAfter:
				f.EdgeRefused++
			case a.code == http.StatusServiceUnavailable:
				f.LBRefused++
			default:
				f.Failed++
			}
			if !a.first && a.done >= outageStart && a.done < outageEnd {
				if a.code == http.StatusOK {
					f.ReplaysInOutage++
				} else {
					f.RefusedInOutage++
				}
			}
			if a.done < m.at {
				continue // before the fault's moment: counted, not timed
			}
			s := &secs[int((a.done-m.at)/time.Second)]
			s.all++
			if a.code == http.StatusOK {
				s.ok++
			}
		}
		// Full rate: the first second from which every second (but the
		// window's last, partial one) has 95 % of its answers 200.
		full := -1
		for j := len(secs) - 2; j >= 0; j-- {
			if s := secs[j]; s.all == 0 || float64(s.ok) < 0.95*float64(s.all) {
				break
			}
			full = j
		}
		f.FullRate = -1
		if full >= 0 {
			f.FullRate = time.Duration(full) * time.Second
		}
		out = append(out, f)
	}
	return out
}
