package bench

import (
	"context"
	"net"
	"testing"

	"github.com/notifyedge/notifyedge/edge"
)

// The bench's smoke test: every scenario and ceiling, briefly, on a small
// stack, invariants checked by SQL after each scenario, so the bench cannot
// rot.
func TestBenchQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("load")
	}
	rep, err := Run(context.Background(), Config{Quick: true, Workers: 16, JSONDir: t.TempDir()})
	if rep != nil {
		t.Log("\n" + rep.Table())
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range rep.Rows {
		if row.Requests == 0 || row.Errors > 0 {
			t.Errorf("%s: %d requests, %d errors", row.Name, row.Requests, row.Errors)
		}
		for code, n := range row.Codes {
			if code != 200 {
				t.Errorf("%s: %d answers %d", row.Name, n, code)
			}
		}
		if row.Check != "" && row.Check != "ok" {
			t.Errorf("%s: %s", row.Name, row.Check)
		}
	}
	if len(rep.Plots) != 2 {
		t.Errorf("plots %v, want two PNG files", rep.Plots)
	}
	if rep.find("redis-down (killed at 1/2)").Outcomes["replayed_db"] == 0 {
		t.Error("redis-down: nothing replayed from Postgres after the kill")
	}
}

// Against an existing deployment: orders seeded under the run's own prefix,
// invariants checked for them, outcomes scraped from its /metrics.
func TestBenchAgainstATarget(t *testing.T) {
	if testing.Short() {
		t.Skip("load")
	}
	ctx := context.Background()
	st, err := StartStack(ctx, StackConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	admin, err := edge.NewAdmin(edge.AdminConfig{Reviews: st.Store, Postgres: st.Store, Metrics: st.Metrics})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go admin.Serve(ln)
	defer admin.Shutdown(ctx)
	rep, err := Run(ctx, Config{Quick: true, Workers: 8, Scenarios: []string{"first", "hotdup (cache on)"},
		Target: &Target{URL: st.URL, AdminURL: "http://" + ln.Addr().String(), DBURL: st.DBURL, Secret: Secret, Channel: Channel}})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.Table())
	var names []string
	for _, r := range rep.Rows {
		names = append(names, r.Name)
	}
	// first, first at 80% of peak, and the two local ceilings that need nothing of ours.
	if rep.find("first") == nil || rep.find("hotdup (cache on)") == nil || rep.find("hotdup (cache off)") != nil {
		t.Errorf("rows %v", names)
	}
	if rep.find("hotdup (cache on)").Outcomes["replayed_cache"] == 0 {
		t.Errorf("no outcomes scraped from /metrics: %v", rep.find("hotdup (cache on)").Outcomes)
	}
}
