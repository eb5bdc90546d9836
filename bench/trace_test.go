package bench

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/tracing/tracingtest"
)

// One callback, followed through the built binaries: edged's server span
// (a child of the caller's traceparent), its decision, the relay's
// publish, the shipper's and the forwarder's spans all in the caller's
// trace, exported over OTLP/HTTP by three processes to one receiver; the
// merchant's receiver gets the webhook with a traceparent of that trace.
// No attribute of any span holds the callback's secret, signature or body.
func TestTraceAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three binaries")
	}
	bin := t.TempDir()
	for _, cmd := range []string{"edged", "shipper", "forwarder"} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, cmd), "../cmd/"+cmd).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", cmd, err, out)
		}
	}
	ctx := context.Background()
	rcv, err := tracingtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rcv.Close() })
	pg, err := pgtemp.Start(ctx, pgtemp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	dbURL := pg.URL("postgres")
	if err := durable.Migrate(ctx, dbURL); err != nil {
		t.Fatal(err)
	}
	rs, err := claimcachetest.Start("--appendonly", "yes")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)

	var mu sync.Mutex
	var webhooks []string // the traceparent headers the merchant's receiver got
	merchant := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		webhooks = append(webhooks, r.Header.Get("traceparent"))
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(merchant.Close)

	dir := t.TempDir()
	procs := scaleStack{dir: dir}
	otel := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.Endpoint(), "OTEL_TRACES_SAMPLER=parentbased_always_on", "OTEL_BSP_SCHEDULE_DELAY=50"}
	stream := "EDGE_STREAM_URL=redis://" + rs.Addr()
	pub, adm, fadm := freeAddr(), freeAddr(), freeAddr()
	forwardSecret := make([]byte, 32)
	rand.Read(forwardSecret)
	for _, p := range []struct {
		name string
		args []string
		env  []string
	}{
		{"edged", []string{"-listen", pub, "-admin-listen", adm, "-drain-delay", "0s"},
			[]string{"DATABASE_URL=" + dbURL, "REDIS_URL=redis://" + rs.Addr(), stream, "EDGE_SECRET_" + strings.ToUpper(Channel) + "=" + Secret}},
		{"shipper", nil, []string{"DATABASE_URL=" + dbURL, stream}},
		{"forwarder", []string{"-admin-listen", fadm}, []string{stream, "FORWARD_URL=" + merchant.URL + "/events",
			"FORWARD_SECRET=whsec_" + base64.StdEncoding.EncodeToString(forwardSecret)}},
	} {
		proc, err := procs.startProc(p.name, filepath.Join(bin, p.name), p.args, append(p.env, otel...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if p := proc.cmd.Process; p != nil {
				p.Signal(os.Interrupt) // a clean stop flushes the spans; then make sure
			}
			select {
			case <-proc.done:
			case <-time.After(10 * time.Second):
				proc.kill()
			}
		})
	}
	for _, u := range []string{"http://" + adm + "/readyz", "http://" + fadm + "/healthz"} {
		if err := waitStatus(ctx, u, 60*time.Second); err != nil {
			t.Fatalf("%v (logs in %s)", err, dir)
		}
	}
	if err := pgtemp.SeedOrders(ctx, dbURL, []pgtemp.Order{{No: "O-trace", Status: "PENDING_PAY", Amount: 1999, Currency: "CNY"}}); err != nil {
		t.Fatal(err)
	}

	const caller = "0af7651916cd43dd8448eb211c80319c"
	body := `{"channel_txn_id":"T-trace","event_type":"PAY_SUCCESS","order_no":"O-trace","amount":1999,"currency":"CNY"}`
	ts := time.Now().Unix()
	sig, err := channel.SignWebhook(Secret, "w1", ts, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+pub+"/notify/"+Channel, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", "w1")
	req.Header.Set("webhook-timestamp", fmt.Sprint(ts))
	req.Header.Set("webhook-signature", sig)
	req.Header.Set("traceparent", "00-"+caller+"-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("callback: %d", resp.StatusCode)
	}

	want := map[string]string{"notify " + Channel: "edged", "decide": "edged", "relay publish": "edged",
		"ship": "shipper", "forward ORDER_PAID": "forwarder"}
	wait.For(t, "every process's span in the caller's trace, and the webhook", func() (bool, string) {
		seen := map[string]string{}
		for _, s := range rcv.Spans() {
			if s.TraceID == caller {
				seen[s.Name] = s.Service
			}
		}
		mu.Lock()
		hooks := fmt.Sprint(webhooks)
		mu.Unlock()
		for name, service := range want {
			if seen[name] != service {
				return false, fmt.Sprintf("spans of the trace %v, webhooks %s", seen, hooks)
			}
		}
		return strings.Contains(hooks, "00-"+caller+"-"), fmt.Sprintf("spans %v, webhooks %s", seen, hooks)
	})
	logTrace(t, rcv.Spans(), caller)
	for _, s := range rcv.Spans() {
		for k, v := range s.Attributes {
			for _, bad := range []string{Secret, sig, body, base64.StdEncoding.EncodeToString(forwardSecret)} {
				if strings.Contains(v, bad) {
					t.Errorf("span %q attribute %s holds a secret, a signature or the body: %q", s.Name, k, v)
				}
			}
		}
	}
	if errs := rcv.Errors(); len(errs) > 0 {
		t.Errorf("the receiver could not decode: %v", errs)
	}
}

// logTrace logs trace's spans in the order they started: process, name,
// parent's name, start offset and duration.
func logTrace(t *testing.T, spans []tracingtest.Span, trace string) {
	var in []tracingtest.Span
	names := map[string]string{}
	for _, s := range spans {
		if s.TraceID == trace {
			in = append(in, s)
			names[s.SpanID] = s.Name
		}
	}
	slices.SortFunc(in, func(a, b tracingtest.Span) int { return a.Start.Compare(b.Start) })
	var b strings.Builder
	fmt.Fprintf(&b, "| process | span | kind | parent | starts at | takes | links |\n|---|---|---|---|---:|---:|---:|\n")
	for _, s := range in {
		parent := names[s.ParentSpanID]
		if parent == "" {
			parent = "(the caller's " + s.ParentSpanID + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f ms | %.2f ms | %d |\n", s.Service, s.Name, s.Kind, parent,
			float64(s.Start.Sub(in[0].Start).Microseconds())/1000, float64(s.End.Sub(s.Start).Microseconds())/1000, len(s.Links))
	}
	t.Log("\n" + b.String())
}
