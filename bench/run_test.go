package bench

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
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
			t.Errorf("%s: %d requests, %d transport errors", row.Name, row.Requests, row.Errors)
		}
		// A busy machine may take a delivery past the budget: 503 is the
		// edge's answer then, and the only one besides 200.
		for code, n := range row.Codes {
			if code != 200 && code != 503 {
				t.Errorf("%s: %d answers %d", row.Name, n, code)
			}
		}
		if row.Check != "" && row.Check != "ok" {
			t.Errorf("%s: invariants: %s", row.Name, row.Check)
		}
	}
	// Latency over time and by percentile, and the retention pair's p99
	// by second.
	if len(rep.Plots) != 3 || !strings.HasSuffix(rep.Plots[0], "-retention.png") {
		t.Errorf("plots %v, want three PNG files, the retention pair's first", rep.Plots)
	}
	if rep.find("redis-down (killed at 1/2)").Outcomes["replayed_db"] == 0 {
		t.Error("redis-down: nothing replayed from Postgres after the kill")
	}
	// Our own stack: every part's CPU is read, and a first delivery costs
	// the edge, Postgres and the generator something. The smaller parts
	// may spend less than a clock tick in a one-second row: they must cost
	// something over the run. Redis restarted during redis-down: its
	// column cannot be read there.
	first := rep.find("first").CPU
	for name, v := range map[string]*float64{"machine": first.Machine, "edge": first.Edge, "postgres": first.Postgres,
		"postgres edge": first.PostgresEdge, "postgres ship": first.PostgresShip, "postgres relay": first.PostgresRelay, "redis": first.Redis, "relay": first.Relay, "driver": first.Driver} {
		if v == nil {
			t.Errorf("first: no %s CPU", name)
		} else if *v < 0 || (*v == 0 && !smallPart[name]) {
			t.Errorf("first: %s CPU %.1f µs per request", name, *v)
		}
	}
	for name := range smallPart {
		if sum := cpuOverRows(rep, name); sum <= 0 {
			t.Errorf("%s CPU %.1f µs per request summed over the rows, want more than nothing", name, sum)
		}
	}
	if first.Machine != nil && first.Edge != nil && first.Postgres != nil && *first.Machine < *first.Edge+*first.Postgres {
		t.Errorf("first: machine %.1f µs < edge %.1f + Postgres %.1f", *first.Machine, *first.Edge, *first.Postgres)
	}
	// The edge's, the shipper's and the relay's sessions are parts of
	// Postgres.
	if first.PostgresEdge != nil && first.PostgresShip != nil && first.PostgresRelay != nil && first.Postgres != nil &&
		*first.PostgresEdge+*first.PostgresShip+*first.PostgresRelay > *first.Postgres {
		t.Errorf("first: Postgres for the edge %.1f µs + the shipper %.1f + the relay %.1f > all of Postgres %.1f",
			*first.PostgresEdge, *first.PostgresShip, *first.PostgresRelay, *first.Postgres)
	}
	if rep.find("redis-down (killed at 1/2)").CPU.Redis != nil {
		t.Error("redis-down: a Redis CPU figure across a restart")
	}
	if first.StreamRedis != nil {
		t.Error("first: a stream Redis figure, with the stream on the cache's Redis")
	}
	// Group commit's counters cover the row: 16 workers' first deliveries
	// go in batches, and the edge that decides alone has none.
	if g := rep.find("first").Group; g["batches"] == 0 || g["batched"] < 2*g["batches"] {
		t.Errorf("first: group commit %v, want batches of two or more", g)
	}
	if g := rep.find(nameFirstAlone).Group; g["batches"] != 0 {
		t.Errorf("%s: group commit %v, want no batch", nameFirstAlone, g)
	}
}

// smallPart names the CPU columns a one-second row may read as zero (less
// than a clock tick of the process in the row).
var smallPart = map[string]bool{"postgres ship": true, "postgres relay": true, "redis": true, "relay": true}

// cpuOverRows sums a CPU column (as smallPart names it) over the rows that
// read it.
func cpuOverRows(rep *Report, name string) float64 {
	var sum float64
	for _, row := range rep.Rows {
		v := map[string]*float64{"postgres ship": row.CPU.PostgresShip, "postgres relay": row.CPU.PostgresRelay,
			"redis": row.CPU.Redis, "relay": row.CPU.Relay}[name]
		if v != nil {
			sum += *v
		}
	}
	return sum
}

// The edge's counters are read from a /metrics page as client_golang
// writes it, and what group commit did becomes a line per row.
func TestScrapeCountsAndGroupLine(t *testing.T) {
	page := `# HELP notifyedge_requests_total Answers.
# TYPE notifyedge_requests_total counter
notifyedge_requests_total{channel="bench",outcome="applied",path="durable"} 40
notifyedge_requests_total{channel="bench",outcome="applied",path="cache"} 2
notifyedge_requests_total{channel="a b",outcome="replayed_cache",path="cache"} 7
notifyedge_group_batches_total 5
notifyedge_group_deliveries_total{how="alone"} 2
notifyedge_group_deliveries_total{how="batched"} 40
notifyedge_group_deliveries_total{how="busy"} 0
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, page)
	}))
	defer srv.Close()
	c := scrapeCounts(srv.URL)
	if c.outcomes["applied"] != 42 || c.outcomes["replayed_cache"] != 7 || len(c.outcomes) != 2 {
		t.Errorf("outcomes %v, want applied 42, replayed_cache 7", c.outcomes)
	}
	if c.group["batches"] != 5 || c.group["batched"] != 40 || c.group["alone"] != 2 {
		t.Errorf("group %v, want 5 batches, 40 batched, 2 alone", c.group)
	}
	line, ok := groupLine(Row{Name: "first", Requests: 42, ReqPerSec: 84, Group: c.group})
	if !ok || !strings.Contains(line, "8.0 deliveries a batch") || !strings.Contains(line, "10 batches a second") ||
		!strings.Contains(line, "4.8% of deliveries alone") {
		t.Errorf("group line %q", line)
	}
	if _, ok := groupLine(Row{Name: "alone", Requests: 42, ReqPerSec: 84}); ok {
		t.Error("a group line for a row without batches")
	}
}

// With the stream on a redis-server of its own, each Redis has its column:
// the relay's entries and the shipper's reads land on the stream's.
func TestBenchStreamRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("load")
	}
	// A quick run on a busy machine is judged by what it must show: the
	// invariants, both Redis columns read, the stream's column in the
	// table; not by its rates. Each failure names its check and figure.
	rep, err := Run(context.Background(), Config{Quick: true, Workers: 16, Scenarios: []string{"first"}, StreamRedis: true})
	if rep != nil {
		t.Log("\n" + rep.Table())
	}
	if err != nil {
		t.Fatalf("the quick run with -stream-redis: %v", err)
	}
	first := rep.find("first")
	if first == nil {
		t.Fatal("no row named first in the report")
	}
	if first.Check != "ok" {
		t.Errorf("first: invariants: %s", first.Check)
	}
	// Measured: a figure, not an empty cell. Both Redis servers serve
	// every first delivery, but a one-second row may be less than a clock
	// tick of one of them, so together they cost something.
	redis, stream := first.CPU.Redis, first.CPU.StreamRedis
	for name, v := range map[string]*float64{"the cache's redis (redis µs)": redis, "the stream's redis (stream µs)": stream} {
		if v == nil {
			t.Errorf("first: no CPU figure for %s: its /proc reading failed", name)
		} else if *v < 0 {
			t.Errorf("first: CPU of %s %.1f µs per request", name, *v)
		}
	}
	if redis != nil && stream != nil && *redis+*stream <= 0 {
		t.Errorf("first: both Redis servers read 0 µs per request over %d deliveries", first.Requests)
	}
	if !strings.Contains(rep.Table(), "stream µs") {
		t.Error("the table has no stream µs column")
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
	rep, err := Run(ctx, Config{Quick: true, Workers: 8, Scenarios: []string{"first", "hotdup (cache on)"},
		Target: &Target{URL: st.URL, AdminURL: st.AdminURL, DBURL: st.DBURL, Secret: Secret, Channel: Channel}})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.Table())
	var names []string
	for _, r := range rep.Rows {
		names = append(names, r.Name)
	}
	// first, hotdup (cache on), and first at 80% of peak (the prefix "first"
	// selects it too); never a row that needs our own stack.
	if rep.find("first") == nil || rep.find("hotdup (cache on)") == nil || rep.find("hotdup (cache off)") != nil {
		t.Errorf("rows %v", names)
	}
	if rep.find("hotdup (cache on)").Outcomes["replayed_cache"] == 0 {
		t.Errorf("no outcomes scraped from /metrics: %v", rep.find("hotdup (cache on)").Outcomes)
	}
	// The target's processes are not ours: their CPU columns stay empty,
	// except Postgres, whose data directory is on this machine.
	c := rep.find("first").CPU
	if c.Edge != nil || c.Redis != nil || c.Relay != nil || c.PostgresEdge != nil || c.PostgresRelay != nil {
		t.Errorf("first against a target: edge %v, redis %v, relay %v, postgres edge %v, postgres relay %v CPU, want none",
			c.Edge, c.Redis, c.Relay, c.PostgresEdge, c.PostgresRelay)
	}
	if c.Machine == nil || c.Driver == nil || c.Postgres == nil {
		t.Errorf("first against a target: machine %v, driver %v, postgres %v CPU, want all", c.Machine, c.Driver, c.Postgres)
	}
}

// A stray comma in -scenario must not select every row (a twelve-minute
// run for a one-minute question).
func TestWantedByPrefix(t *testing.T) {
	e := &env{cfg: Config{Scenarios: []string{"first", ""}}}
	for name, want := range map[string]bool{
		"first":                   true,
		"first at 80% of peak":    true,
		"hotdup (cache on)":       false,
		"ceiling: no-op fasthttp": false,
	} {
		if got := e.wanted(name); got != want {
			t.Errorf("-scenario first, : wanted(%q) = %v, want %v", name, got, want)
		}
	}
	if all := (&env{}); !all.wanted("hotdup (cache on)") {
		t.Error("no -scenario: every row is wanted")
	}
}

// The grown rows at a smoke size, selected as `make bench-grown` selects
// them: the empty rows they are compared with run first although not
// selected; the week is seeded with every index built again; the cache's
// Redis gets a day of entries; retention deletes the day past it.
func TestBenchGrownQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("load")
	}
	rep, err := Run(context.Background(), Config{Quick: true, Workers: 8, Scenarios: []string{"grown"}})
	if rep != nil {
		t.Log("\n" + rep.Table())
	}
	if err != nil {
		t.Fatal(err)
	}
	g := rep.Grown
	if g == nil {
		t.Fatal("no grown figures")
	}
	w := grownSize(true)
	if got, want := g.Rows["notify_claim"], int64(w.PerDay*w.Days); got != want {
		t.Errorf("seeded %d claims, want %d", got, want)
	}
	if g.Sizes[0].Table != "notify_claim" || g.Sizes[0].Rows < int64(w.PerDay*w.Days) {
		t.Errorf("sizes after seeding %+v: the claims are not all there", g.Sizes[0])
	}
	if len(g.Compare) != 3 {
		t.Errorf("compared %d rows, want first, hotdup and first at 80%%: %+v", len(g.Compare), g.Compare)
	}
	for _, c := range g.Compare {
		if c.ReqPerSec[0] <= 0 || c.ReqPerSec[1] <= 0 {
			t.Errorf("%s: req/s %v", c.Empty, c.ReqPerSec)
		}
	}
	if r := g.Redis; r.Entries != int64(w.CachePerDay) || r.PerEntry <= 0 || r.MemoryUsage <= int64(r.KeyBytes+r.ValueBytes) || r.MemoryUsagePending <= 0 {
		t.Errorf("redis sizing %+v", r)
	}
	if g.Retention == nil || g.Retention.DeleteSeconds <= 0 || len(g.SizesAfter) == 0 {
		t.Fatalf("grown retention: %+v, sizes after %+v", g.Retention, g.SizesAfter)
	}
	// The deletion alternated with none in its first turns, and requests
	// were sent in both.
	if f := g.Retention; f.Turns != grownTurns || f.TurnSeconds <= 0 || f.P99On <= 0 || f.P99Off <= 0 || f.TurnRatio <= 0 {
		t.Errorf("grown retention's turns: %d of %.3f s, p99 %.2f ms with and %.2f ms without, ratio %.2f",
			f.Turns, f.TurnSeconds, f.P99On, f.P99Off, f.TurnRatio)
	}
	// The day past retention: a claim and two thirds of an outbox row for
	// each of its first deliveries.
	if d := g.Retention.Deleted; d["notify_claim"] < int64(w.PerDay) || d["outbox"] < int64(float64(w.PerDay)*w.OutboxPerClaim)-1 {
		t.Errorf("the first cycle deleted %v, want the day's %d claims and its outbox rows", d, w.PerDay)
	}
	for _, name := range []string{"first", grownFirst, grownHotdup, grownFirstAt, grownRetentionOff, grownRetentionOn} {
		if rep.find(name) == nil {
			t.Errorf("no row %q", name)
		}
	}
}
