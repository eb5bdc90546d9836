package bench

import (
	"strings"
	"testing"
	"time"
)

func report(rows ...Row) *Report { return &Report{Rows: rows} }

func row(name string, reqs, edge, pg float64) Row {
	return Row{Name: name, ReqPerSec: reqs, CPU: CPUCost{Edge: &edge, Postgres: &pg}}
}

// Compare prints each build's median per scenario and figure, the ratio,
// and the first build's own spread; a figure one side lacks is left out.
func TestCompare(t *testing.T) {
	before := Build{Label: "old", Runs: []*Report{
		report(row("first", 4000, 100, 150), row("hotdup", 16000, 30, 0)),
		report(row("first", 5000, 110, 140), row("hotdup", 17000, 34, 0)),
	}}
	before.Runs[0].Rows[0].Lat.P99 = 80 * time.Millisecond
	before.Runs[1].Rows[0].Lat.P99 = 120 * time.Millisecond
	after := Build{Label: "new", Runs: []*Report{
		report(row("first", 9000, 50, 90)),
		report(row("first", 9400, 54, 100)),
		report(row("first", 9200, 52, 95)),
	}}
	for i, ms := range []time.Duration{50, 70, 60} {
		after.Runs[i].Rows[0].Lat.P99 = ms * time.Millisecond
	}
	got := Compare(before, after)
	for _, want := range []string{
		"new (3 runs) against old (2 runs)",
		"| first | req/s | 4500 | 9200 | 2.04 | ±11% |",
		"| first | edge µs | 105 | 52 | 0.50 | ±5% |",
		"| first | postgres µs | 145 | 95 | 0.66 | ±3% |",
		"| first | p99 ms | 100 | 60 | 0.60 | ±20% |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "hotdup") || strings.Contains(got, "redis µs") || strings.Contains(got, "driver µs") {
		t.Errorf("a scenario or figure only one side has is shown:\n%s", got)
	}
}
