package bench

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"
)

// fastTransport is an http.RoundTripper over fasthttp's client, for
// vegeta, which takes an *http.Client. The open-loop generator shares the
// machine with what it measures: with net/http's transport (a reader and a
// writer goroutine per connection, a channel handoff each way) it cost the
// bench process 100-125 µs of CPU per request against 35-40 for the
// closed-loop driver, so a rate set at 80 % of the closed-loop peak left the
// two cores no headroom at all, and its p99 measured the generator's
// queue. fasthttp does the exchange on the caller's goroutine.
//
// Requests carry no retry (a POST is not idempotent), the deadline is the
// request context's (the http.Client's Timeout sets it), and a response is
// copied out before the pooled one is released.
type fastTransport struct {
	client *fasthttp.Client
}

// newFastTransport allows conns connections to each host and drops an idle
// one after idle.
func newFastTransport(conns int, idle time.Duration) *fastTransport {
	return &fastTransport{client: &fasthttp.Client{
		MaxConnsPerHost:     conns,
		MaxConnWaitTimeout:  fastTimeout,
		MaxIdleConnDuration: idle,
		ReadTimeout:         fastTimeout,
		WriteTimeout:        fastTimeout,
	}}
}

// fastTimeout bounds an exchange whose request carries no deadline.
const fastTimeout = 10 * time.Second

// RoundTrip sends r and returns its response, body read in full.
func (t *fastTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(r.Method)
	req.SetRequestURI(r.URL.String())
	for k, vs := range r.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if r.Body != nil {
		_, err := io.Copy(req.BodyWriter(), r.Body)
		r.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("%s %s: request body: %w", r.Method, r.URL, err)
		}
	}
	deadline, ok := r.Context().Deadline()
	if !ok {
		deadline = time.Now().Add(fastTimeout)
	}
	if err := t.client.DoDeadline(req, resp, deadline); err != nil {
		return nil, fmt.Errorf("%s %s: %w", r.Method, r.URL, err)
	}
	h := make(http.Header)
	for k, v := range resp.Header.All() {
		h.Add(string(k), string(v))
	}
	body := bytes.Clone(resp.Body())
	code := resp.StatusCode()
	return &http.Response{
		Status: fmt.Sprintf("%d %s", code, http.StatusText(code)), StatusCode: code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
		Request: r,
	}, nil
}

// CloseIdleConnections closes the keep-alive connections no request uses.
func (t *fastTransport) CloseIdleConnections() { t.client.CloseIdleConnections() }
