package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
)

// Build is one build's runs of the same scenarios, for Compare: runs taken
// in turn with the other build's on the same machine, so that both see
// the same noise.
type Build struct {
	Label string
	Runs  []*Report
}

// ReadReport reads a run's JSON file (what Run writes into Config.JSONDir).
func ReadReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read report: %w", err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("read report %s: %w", path, err)
	}
	return &r, nil
}

// compareFigures are the columns of Compare: throughput, each process's
// CPU per answered request (the load generator's too: it shares the
// machine), and the p99 latency.
var compareFigures = []struct {
	name string
	get  func(Row) *float64
}{
	{"req/s", func(r Row) *float64 { return &r.ReqPerSec }},
	{"edge µs", func(r Row) *float64 { return r.CPU.Edge }},
	{"postgres µs", func(r Row) *float64 { return r.CPU.Postgres }},
	{"postgres edge µs", func(r Row) *float64 { return r.CPU.PostgresEdge }},
	{"postgres ship µs", func(r Row) *float64 { return r.CPU.PostgresShip }},
	{"postgres relay µs", func(r Row) *float64 { return r.CPU.PostgresRelay }},
	{"redis µs", func(r Row) *float64 { return r.CPU.Redis }},
	{"stream redis µs", func(r Row) *float64 { return r.CPU.StreamRedis }},
	{"machine µs", func(r Row) *float64 { return r.CPU.Machine }},
	{"driver µs", func(r Row) *float64 { return r.CPU.Driver }},
	{"p99 ms", func(r Row) *float64 {
		if r.Lat.P99 == 0 {
			return nil
		}
		ms := millis(r.Lat.P99)
		return &ms
	}},
}

// Compare sets two builds side by side: for every scenario both ran, the
// median over each build's runs of req/s and of the CPU µs per request of
// the edge, Postgres (and of it, the edge's, the shipper's and the relay's
// sessions, where both builds tell them apart), Redis, the whole machine
// and the load generator, and of the p99 latency, with the ratio of the
// second build's median to the first's. The spread between one build's own
// runs is printed too: a ratio inside it is noise.
func Compare(before, after Build) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%d runs) against %s (%d runs): medians, and %s/%s\n", after.Label, len(after.Runs), before.Label, len(before.Runs), after.Label, before.Label)
	fmt.Fprintf(&b, "| scenario | figure | %s | %s | ratio | %s spread |\n|---|---|---:|---:|---:|---:|\n", before.Label, after.Label, before.Label)
	for _, name := range scenarioNames(before.Runs) {
		for _, f := range compareFigures {
			o, n := collect(before.Runs, name, f.get), collect(after.Runs, name, f.get)
			if len(o) == 0 || len(n) == 0 {
				continue
			}
			mo, mn := median(o), median(n)
			ratio := "–"
			if mo > 0 {
				ratio = fmt.Sprintf("%.2f", mn/mo)
			}
			spread := "–"
			if len(o) > 1 && mo > 0 {
				spread = fmt.Sprintf("±%.0f%%", 100*(slices.Max(o)-slices.Min(o))/2/mo)
			}
			fmt.Fprintf(&b, "| %s | %s | %.0f | %.0f | %s | %s |\n", name, f.name, mo, mn, ratio, spread)
		}
	}
	return b.String()
}

// scenarioNames lists the scenarios of runs in the order they ran.
func scenarioNames(runs []*Report) []string {
	var names []string
	for _, r := range runs {
		for _, row := range r.Rows {
			if !slices.Contains(names, row.Name) {
				names = append(names, row.Name)
			}
		}
	}
	return names
}

// collect gathers one figure of one scenario over runs (absent figures
// left out).
func collect(runs []*Report, name string, get func(Row) *float64) []float64 {
	var out []float64
	for _, r := range runs {
		for _, row := range r.Rows {
			if row.Name == name {
				if v := get(row); v != nil {
					out = append(out, *v)
				}
			}
		}
	}
	return out
}

// median of vs (not empty); the mean of the middle two for an even count.
func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
