package bench

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// find returns the row named name.
func (r *Report) find(name string) *Row {
	for i := range r.Rows {
		if r.Rows[i].Name == name {
			return &r.Rows[i]
		}
	}
	return nil
}

// Ratio is one figure compared against a ceiling.
type Ratio struct {
	Name   string
	Value  float64
	Target string
}

// Ratios are the side-by-side ratios of one run.
func (r *Report) Ratios() []Ratio {
	div := func(a, b string) float64 {
		x, y := r.find(a), r.find(b)
		if x == nil || y == nil || y.ReqPerSec == 0 {
			return 0
		}
		return x.ReqPerSec / y.ReqPerSec
	}
	out := []Ratio{
		{"hotdup (cache on) / fasthttp + SET NX GET ceiling", div("hotdup (cache on)", "ceiling: fasthttp + SET NX GET"), ">= 0.85"},
		{"first / raw pgx pipelined (no HTTP)", div("first", "ceiling: raw pgx pipelined"), ">= 1.0"},
		{"hotdup cache on / cache off", div("hotdup (cache on)", "hotdup (cache off)"), "as measured"},
		{"fasthttp edge / net/http edge (hotdup)", div("hotdup (cache on)", "hotdup (net/http edge)"), ">= 1.3"},
		{"closed-loop driver / vegeta, both vs no-op", div("ceiling: no-op fasthttp", "ceiling: vegeta vs no-op"), "the generators' ceilings"},
	}
	out = append(out, r.groupRatios()...)
	if r.Retention != nil {
		// Latency, not throughput: the retention rows run at one rate.
		out = append(out, Ratio{"retention: p99 while deleting / p99 without", r.Retention.Ratio, "<= 1.2"})
	}
	if g := r.Grown; g != nil {
		for _, c := range g.Compare {
			if c.Postgres[0] > 0 && c.Empty == "first" {
				out = append(out, Ratio{"grown / empty: Postgres CPU per first delivery", c.Postgres[1] / c.Postgres[0], "<= 1.3"})
			}
			if c.ReqPerSec[0] > 0 && c.Empty == "hotdup (cache on)" {
				out = append(out, Ratio{"grown / empty: hot duplicates a second", c.ReqPerSec[1] / c.ReqPerSec[0], "unchanged"})
			}
		}
		if g.Retention != nil {
			out = append(out, Ratio{"grown retention: p99 while deleting the day / p99 without", g.Retention.Ratio, "<= 1.5"})
		}
	}
	return out
}

// Table renders the run for a terminal and the README.
func (r *Report) Table() string {
	var b strings.Builder
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }
	fmt.Fprintf(&b, "notifyedge bench, %s, %s per attack, %s", r.When.Format(time.RFC3339), r.Duration, r.Machine)
	if r.LoadAvg != "" {
		fmt.Fprintf(&b, ", load average before %s", r.LoadAvg)
	}
	if r.TraceSample != nil {
		fmt.Fprintf(&b, ", traces sampled at %g (%d spans received)", *r.TraceSample, r.TraceSpans)
	}
	b.WriteString("\n\n")
	fmt.Fprintf(&b, "| %-30s | %-26s | %9s | %9s | %7s | %7s | %7s | %8s | %8s | %-22s | %s |",
		"scenario", "driver", "requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "codes / errors", "invariants")
	for _, c := range cpuColumns {
		fmt.Fprintf(&b, " %10s |", c)
	}
	fmt.Fprintf(&b, "\n|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|", strings.Repeat("-", 32), strings.Repeat("-", 28), strings.Repeat("-", 11),
		strings.Repeat("-", 11), strings.Repeat("-", 9), strings.Repeat("-", 9), strings.Repeat("-", 9), strings.Repeat("-", 10), strings.Repeat("-", 10), strings.Repeat("-", 24), "---")
	for range cpuColumns {
		fmt.Fprintf(&b, "%s|", strings.Repeat("-", 11)+":")
	}
	b.WriteString("\n")
	for _, row := range r.Rows {
		var codes []string
		for c, n := range row.Codes {
			codes = append(codes, fmt.Sprintf("%d:%d", c, n))
		}
		sort.Strings(codes)
		if row.Errors > 0 {
			codes = append(codes, fmt.Sprintf("err:%d", row.Errors))
		}
		check := row.Check
		if check == "" {
			check = "-"
		}
		fmt.Fprintf(&b, "| %-30s | %-26s | %9d | %9.0f | %7s | %7s | %7s | %8s | %8s | %-22s | %s |",
			row.Name, row.Driver, row.Requests, row.ReqPerSec, ms(row.Lat.P50), ms(row.Lat.P90), ms(row.Lat.P99), ms(row.Lat.P999), ms(row.Lat.Max), strings.Join(codes, " "), check)
		for _, v := range row.CPU.columns() {
			fmt.Fprintf(&b, " %10s |", micros(v))
		}
		b.WriteString("\n")
	}
	b.WriteString("\nCPU µs per answered request, from /proc before and after each attack: machine is all CPUs' busy time;\n" +
		"pg is the postmaster with all its backends, pg edge the backends of the edge's own sessions (deciding the deliveries),\n" +
		"pg ship the reference shipper's (shipping the paid orders), pg relay the outbox relay's (reading and marking the rows;\n" +
		"the rest of pg is other sessions' and the server's background work: WAL writer, checkpoints, autovacuum);\n" +
		"redis is the cache's redis-server, and the outbox stream's unless -stream-redis gave it its own (stream);\n" +
		"relay is the outbox relay and the shipper (their own process);\n" +
		"driver is the bench process, the load generator (for the ceilings, with their server in it). Empty: not readable.\n")
	writeBreakdowns(&b, r.Rows)
	b.WriteString("\nOutcomes (from notifyedge_requests_total):\n")
	for _, row := range r.Rows {
		if len(row.Outcomes) == 0 {
			continue
		}
		var parts []string
		for k, v := range row.Outcomes {
			parts = append(parts, fmt.Sprintf("%s %d", k, v))
		}
		sort.Strings(parts)
		fmt.Fprintf(&b, "  %-30s %s\n", row.Name, strings.Join(parts, ", "))
	}
	var group []string
	for _, row := range r.Rows {
		if line, ok := groupLine(row); ok {
			group = append(group, line)
		}
	}
	if len(group) > 0 {
		b.WriteString("\nGroup commit (from notifyedge_group_*):\n" + strings.Join(group, ""))
	}
	b.WriteString("\nRatios (same run, same driver and concurrency):\n")
	for _, q := range r.Ratios() {
		fmt.Fprintf(&b, "  %-52s %6.2f   target %s\n", q.Name, q.Value, q.Target)
	}
	fmt.Fprintf(&b, "\nbench process RSS at peak (the generator): %.0f MiB\n", r.RSSMiB)
	if r.EdgeRSSMiB > 0 {
		fmt.Fprintf(&b, "edge process RSS at peak: %.0f MiB\n", r.EdgeRSSMiB)
	}
	if r.RedisBytesPerKey > 0 {
		fmt.Fprintf(&b, "cache Redis after the scenarios: %.0f bytes of used_memory per key (stream and baseline included)\n", r.RedisBytesPerKey)
	}
	if f := r.Retention; f != nil {
		b.WriteString(f.table())
	}
	if f := r.Grown; f != nil {
		b.WriteString(f.table())
	}
	return b.String()
}

// groupLine says what group commit did in row: deliveries a batch,
// batches a second, and the share of deliveries decided in a transaction
// of their own (false: no batch in the row).
func groupLine(row Row) (string, bool) {
	g := row.Group
	if g["batches"] == 0 || row.Requests == 0 {
		return "", false
	}
	perSec := float64(g["batches"]) * row.ReqPerSec / float64(row.Requests)
	alone := 100 * float64(g["alone"]) / float64(g["batched"]+g["alone"])
	return fmt.Sprintf("  %-30s %5.1f deliveries a batch, %5.0f batches a second, %4.1f%% of deliveries alone\n",
		row.Name, float64(g["batched"])/float64(g["batches"]), perSec, alone), true
}

// cpuColumns head the table's CPU columns, in the order of
// CPUCost.columns.
var cpuColumns = []string{"machine µs", "edge µs", "pg µs", "pg edge µs", "pg ship µs", "pg relay µs", "redis µs", "stream µs", "relay µs", "driver µs"}

// columns returns c's figures in the table's column order (cpuColumns):
// the one place a new figure takes its column.
func (c CPUCost) columns() []*float64 {
	return []*float64{c.Machine, c.Edge, c.Postgres, c.PostgresEdge, c.PostgresShip, c.PostgresRelay, c.Redis, c.StreamRedis, c.Relay, c.Driver}
}

// micros formats µs per request: empty when unknown, one decimal below 10.
func micros(v *float64) string {
	switch {
	case v == nil:
		return ""
	case *v < 10:
		return fmt.Sprintf("%.1f", *v)
	default:
		return fmt.Sprintf("%.0f", *v)
	}
}
