package bench

import "runtime"

// The group-commit rows: first deliveries to the same edge over a store
// that decides every delivery alone, and both at one worker.
const (
	nameFirstAlone    = "first (one at a time)"
	nameFirstOne      = "first, 1 worker"
	nameFirstOneAlone = "first, 1 worker (one at a time)"
)

// groupRatios compares group commit with one transaction per delivery, in
// this run: CPU per first delivery, throughput at Config.Workers, and the
// median a lone delivery sees.
func (r *Report) groupRatios() []Ratio {
	g, a := r.find("first"), r.find(nameFirstAlone)
	if g == nil || a == nil {
		return nil
	}
	cpu := func(row *Row, parts ...func(CPUCost) *float64) float64 {
		sum := 0.0
		for _, p := range parts {
			v := p(row.CPU)
			if v == nil {
				return 0
			}
			sum += *v
		}
		return sum
	}
	pg := func(c CPUCost) *float64 { return c.Postgres }
	edge := func(c CPUCost) *float64 { return c.Edge }
	redis := func(c CPUCost) *float64 { return c.Redis }
	ratio := func(x, y float64) float64 {
		if y == 0 {
			return 0
		}
		return x / y
	}
	out := []Ratio{
		{"first: Postgres CPU per delivery, group / one at a time", ratio(cpu(g, pg), cpu(a, pg)), "<= 0.45"},
		{"first: edge + Postgres + Redis CPU, group / one at a time", ratio(cpu(g, edge, pg, redis), cpu(a, edge, pg, redis)), "<= 0.60"},
		{"first: req/s, group / one at a time", ratio(g.ReqPerSec, a.ReqPerSec), ">= 1.5"},
	}
	if g1, a1 := r.find(nameFirstOne), r.find(nameFirstOneAlone); g1 != nil && a1 != nil {
		out = append(out, Ratio{"first at 1 worker: median, group / one at a time", ratio(float64(g1.Lat.P50), float64(a1.Lat.P50)), "<= 1.10"})
	}
	if p := r.find("first at 80% of peak"); p != nil {
		out = append(out, Ratio{"first at 80% of the group peak: p99 in ms", millis(p.Lat.P99), "<= 100"})
		// How busy the bench's machine was: near 1 the p99 measures the
		// queue of a saturated machine (generator included), not the edge.
		if m := p.CPU.Machine; m != nil {
			busy := *m * p.ReqPerSec / (float64(runtime.NumCPU()) * 1e6)
			out = append(out, Ratio{"first at 80% of the group peak: machine busy (share of its cores)", busy, "as measured"})
		}
	}
	return out
}
