package bench

import (
	"fmt"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// soakPlots draws the soak's series as two PNG files in dir: latency by
// slice (p50, p99), and resident memory by process with the cache Redis's
// memory. It returns their paths.
func soakPlots(r *SoakReport, dir, stamp string) ([]string, error) {
	lat := plot.New()
	lat.Title.Text = fmt.Sprintf("Soak: first deliveries at %d a second, retention and the relay running", r.Rate)
	lat.X.Label.Text = "minutes into the soak"
	lat.Y.Label.Text = "latency (ms), per slice"
	lat.Legend.Top = true
	for i, s := range []struct {
		name string
		v    func(SoakSlice) float64
	}{{"p50", func(s SoakSlice) float64 { return s.P50 }}, {"p99", func(s SoakSlice) float64 { return s.P99 }}} {
		pts := make(plotter.XYs, len(r.Slices))
		for j, x := range r.Slices {
			pts[j] = plotter.XY{X: x.At / 60, Y: s.v(x)}
		}
		if err := addLine(lat, s.name, pts, i); err != nil {
			return nil, err
		}
	}
	mem := plot.New()
	mem.Title.Text = "Soak: resident memory by process, and the cache Redis's used memory"
	mem.X.Label.Text = "minutes into the soak"
	mem.Y.Label.Text = "MiB"
	mem.Legend.Top = true
	for i, s := range []struct {
		name string
		v    func(SoakSample) float64
	}{{"edged", func(s SoakSample) float64 { return s.EdgedMiB }}, {"shipper", func(s SoakSample) float64 { return s.ShipperMiB }},
		{"forwarder", func(s SoakSample) float64 { return s.ForwarderMiB }}, {"cache Redis used_memory", func(s SoakSample) float64 { return s.RedisMiB }}} {
		pts := make(plotter.XYs, len(r.Samples))
		for j, x := range r.Samples {
			pts[j] = plotter.XY{X: x.At / 60, Y: s.v(x)}
		}
		if err := addLine(mem, s.name, pts, i); err != nil {
			return nil, err
		}
	}
	var paths []string
	for name, p := range map[string]*plot.Plot{"latency": lat, "memory": mem} {
		path := filepath.Join(dir, "soak-"+name+"-"+stamp+".png")
		if err := p.Save(10*vg.Inch, 5*vg.Inch, path); err != nil {
			return nil, fmt.Errorf("soak plot: %w", err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// addLine adds a line of palette colour i to p.
func addLine(p *plot.Plot, name string, pts plotter.XYs, i int) error {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return fmt.Errorf("soak plot: %w", err)
	}
	l.Color = palette[i%len(palette)]
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}
