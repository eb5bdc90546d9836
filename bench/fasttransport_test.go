package bench

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
	"github.com/valyala/fasthttp"
)

// serveFast serves h on a loopback port until the test ends.
func serveFast(t *testing.T, h fasthttp.RequestHandler) string {
	t.Helper()
	var stops []func()
	srv := &fasthttp.Server{Handler: h}
	u, err := serveLoopback(&stops, srv.Serve, srv.ShutdownWithContext)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, stop := range stops {
			stop()
		}
	})
	return u
}

// vegeta's results through fastTransport carry what the bench reads of
// them: each request's method, URL, headers and body reach the server, and
// the status, headers and body come back.
func TestFastTransportCarriesVegetaExchanges(t *testing.T) {
	base := serveFast(t, func(c *fasthttp.RequestCtx) {
		if string(c.Method()) != http.MethodPost || string(c.Path()) != "/notify/bench" ||
			string(c.Request.Header.Peek("Webhook-Id")) != "msg_"+string(c.QueryArgs().Peek("p")) {
			c.SetStatusCode(http.StatusBadRequest)
			return
		}
		c.Response.Header.Set("Idempotent-Replayed", "true")
		c.SetStatusCode(http.StatusCreated)
		c.SetBody(append([]byte("echo "), c.PostBody()...))
	})
	tr := newFastTransport(8, time.Second)
	defer tr.CloseIdleConnections()
	n := 0
	targeter := func(tgt *vegeta.Target) error {
		n++
		tgt.Method, tgt.URL = http.MethodPost, base+"/notify/bench?p="+strings.Repeat("7", n%5+1)
		tgt.Header = http.Header{"Webhook-Id": {"msg_" + strings.Repeat("7", n%5+1)}}
		tgt.Body = []byte(`{"n":` + strings.Repeat("1", n) + `}`)
		return nil
	}
	attacker := vegeta.NewAttacker(vegeta.Workers(4), vegeta.MaxWorkers(8),
		vegeta.Client(&http.Client{Transport: tr, Timeout: 5 * time.Second}))
	got := 0
	for res := range attacker.Attack(targeter, vegeta.Rate{Freq: 200, Per: time.Second}, 100*time.Millisecond, "t") {
		got++
		if res.Error != "" || res.Code != http.StatusCreated {
			t.Fatalf("result %d: code %d, error %q, body %q", res.Seq, res.Code, res.Error, res.Body)
		}
		if res.Headers.Get("Idempotent-Replayed") != "true" {
			t.Errorf("result %d: headers %v, want Idempotent-Replayed", res.Seq, res.Headers)
		}
		if !bytes.HasPrefix(res.Body, []byte(`echo {"n":1`)) || !bytes.HasSuffix(res.Body, []byte("}")) {
			t.Errorf("result %d: body %q, want the request's echoed", res.Seq, res.Body)
		}
	}
	if got == 0 {
		t.Fatal("the attack returned no results")
	}
}

// An exchange ends at its request's deadline (the http.Client's Timeout),
// not at the transport's own ten seconds.
func TestFastTransportKeepsTheRequestDeadline(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	base := serveFast(t, func(c *fasthttp.RequestCtx) { <-release })
	client := &http.Client{Transport: newFastTransport(1, time.Second), Timeout: 100 * time.Millisecond}
	start := time.Now()
	resp, err := client.Post(base+"/slow", "application/json", strings.NewReader("{}"))
	if err == nil {
		resp.Body.Close()
		t.Fatal("a request the server never answers succeeded")
	}
	if d := time.Since(start); d >= fastTimeout/2 {
		t.Fatalf("the request took %v to fail, past its 100ms deadline (the transport's own bound is %v)", d, fastTimeout)
	}
}
