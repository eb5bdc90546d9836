package bench

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"sort"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

var palette = []color.Color{
	color.RGBA{31, 119, 180, 255}, color.RGBA{255, 127, 14, 255}, color.RGBA{44, 160, 44, 255}, color.RGBA{214, 39, 40, 255},
	color.RGBA{148, 103, 189, 255}, color.RGBA{140, 86, 75, 255},
}

// WritePlots draws the open-loop (constant-rate) attacks: latency over time
// and the latency percentile distribution, and the retention rows' p99 by
// second, as PNG files in dir. It returns their paths. A report read back
// from its JSON file has no attacks' points: only its retention plots are
// drawn again.
func WritePlots(rep *Report, dir string) ([]string, error) {
	stamp := rep.When.Format("20060102T150405Z")
	var paths []string
	for _, r := range []struct {
		name string
		f    *RetentionFigures
	}{{"retention", rep.Retention}, {"grown-retention", grownRetentionFigures(rep)}} {
		if r.f == nil || len(r.f.P99BySecondWith) == 0 {
			continue
		}
		path := filepath.Join(dir, stamp+"-"+r.name+".png")
		title := fmt.Sprintf("First deliveries at %.0f a second while retention deletes %d expired claims", r.f.FirstPeak/2, r.f.Backlog)
		if err := retentionPlot(r.f, title, path); err != nil {
			return paths, err
		}
		paths = append(paths, path)
	}
	var rows []Row
	for _, r := range rep.Rows {
		if len(r.Points) > 0 && r.Name != "ceiling: vegeta vs no-op" {
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return paths, nil
	}

	over := plot.New()
	over.Title.Text = "Latency over time at a constant rate (vegeta)"
	over.X.Label.Text = "seconds into the attack"
	over.Y.Label.Text = "latency (ms)"
	over.Legend.Top = true
	for i, r := range rows {
		pts := make(plotter.XYs, 0, len(r.Points))
		step := max(1, len(r.Points)/4000) // thin to keep the picture readable
		for j := 0; j < len(r.Points); j += step {
			p := r.Points[j]
			pts = append(pts, plotter.XY{X: p.At.Seconds(), Y: float64(p.Latency) / float64(time.Millisecond)})
		}
		s, err := plotter.NewScatter(pts)
		if err != nil {
			return paths, err
		}
		s.GlyphStyle.Color = palette[i%len(palette)]
		s.GlyphStyle.Radius = vg.Points(1)
		over.Add(s)
		over.Legend.Add(r.Name, s)
	}
	overPath := filepath.Join(dir, stamp+"-latency-over-time.png")
	if err := over.Save(9*vg.Inch, 5*vg.Inch, overPath); err != nil {
		return paths, fmt.Errorf("plot: %w", err)
	}

	pct := plot.New()
	pct.Title.Text = "Latency by percentile at a constant rate (vegeta)"
	pct.X.Label.Text = "percentile (log scale: 90, 99, 99.9 …)"
	pct.Y.Label.Text = "latency (ms)"
	pct.X.Scale = plot.LogScale{}
	pct.X.Tick.Marker = percentileTicks{}
	pct.Legend.Top = true
	pct.Legend.Left = true
	for i, r := range rows {
		lat := make([]float64, len(r.Points))
		for j, p := range r.Points {
			lat[j] = float64(p.Latency) / float64(time.Millisecond)
		}
		sort.Float64s(lat)
		var pts plotter.XYs
		for _, q := range []float64{.5, .75, .9, .95, .99, .995, .999, .9995, .9999} {
			idx := min(len(lat)-1, int(q*float64(len(lat))))
			pts = append(pts, plotter.XY{X: 1 / (1 - q), Y: lat[idx]})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return paths, err
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(2)
		pct.Add(l)
		pct.Legend.Add(r.Name, l)
	}
	pctPath := filepath.Join(dir, stamp+"-latency-percentiles.png")
	if err := pct.Save(9*vg.Inch, 5*vg.Inch, pctPath); err != nil {
		return paths, fmt.Errorf("plot: %w", err)
	}
	return append(paths, overPath, pctPath), nil
}

// grownRetentionFigures is the grown rows' retention figures, if they ran.
func grownRetentionFigures(rep *Report) *RetentionFigures {
	if rep.Grown == nil {
		return nil
	}
	return rep.Grown.Retention
}

// percentileTicks labels 1/(1-q) positions as percentiles.
type percentileTicks struct{}

func (percentileTicks) Ticks(min, max float64) []plot.Tick {
	var ticks []plot.Tick
	for _, q := range []float64{.5, .9, .99, .999, .9999} {
		x := 1 / (1 - q)
		if x >= min*0.99 && x <= max*1.01 {
			ticks = append(ticks, plot.Tick{Value: x, Label: trimPct(q * 100)})
		}
	}
	return ticks
}

func trimPct(p float64) string {
	if p == math.Trunc(p) {
		return fmt.Sprintf("%.0f", p)
	}
	return fmt.Sprintf("%g", p)
}
