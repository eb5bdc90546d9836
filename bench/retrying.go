package bench

import (
	"bytes"
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// The scale run's second driver: closed-loop workers that retry a failed
// request, as a channel does, and count per second what got through.

// retrying is what driveRetrying saw.
type retrying struct {
	start   time.Time
	ok      int           // callbacks answered 200 in the end
	gaveup  int           // callbacks still not 200 after a minute of retries
	seconds []ScaleSecond // every answer (and failed connection), by second
	success []string      // keys answered SUCCESS
}

// driveRetrying is workers channels, each sending the next callback once
// the last was answered 200, and retrying anything else (another status, a
// failed connection) with the same body after 50 ms, for up to a minute.
func driveRetrying(ctx context.Context, tg *Target, url string, workers int, d time.Duration, src source) retrying {
	client := &fasthttp.Client{MaxConnsPerHost: workers * 2, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	r := retrying{start: time.Now(), seconds: make([]ScaleSecond, int(d/time.Second)+70)}
	var mu sync.Mutex
	success := map[string]bool{}
	var ok, gaveup atomic.Int64
	deadline := r.start.Add(d)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				p := src.next()
				body := p.body()
				giveUp := time.Now().Add(time.Minute)
				for {
					setCallback(req, tg, url, body) // the same body, signed anew, as a channel retries
					err := client.DoTimeout(req, resp, 10*time.Second)
					good := err == nil && resp.StatusCode() == 200
					sec := int(time.Since(r.start) / time.Second)
					mu.Lock()
					if sec < len(r.seconds) {
						if good {
							r.seconds[sec].OK++
						} else {
							r.seconds[sec].Other++
						}
					}
					if good && bytes.HasPrefix(resp.Body(), successPrefix) {
						success[p.key(tg.Channel)] = true
					}
					mu.Unlock()
					if good {
						ok.Add(1)
						break
					}
					if time.Now().After(giveUp) || ctx.Err() != nil {
						gaveup.Add(1)
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	r.ok, r.gaveup = int(ok.Load()), int(gaveup.Load())
	last := len(r.seconds)
	for last > 0 && r.seconds[last-1] == (ScaleSecond{}) {
		last--
	}
	r.seconds = r.seconds[:last]
	for k := range success {
		r.success = append(r.success, k)
	}
	sort.Strings(r.success)
	return r
}
