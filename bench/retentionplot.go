package bench

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// retentionPlot draws the deletion row's p99 second by second, with its
// turns with retention shaded, the checkpoints drawn as bars under the
// curve, and the row without retention's p99 and the target times it as
// lines: whether the slow seconds come in the turns with retention or
// with the checkpoints is what the picture shows. It saves a PNG at path.
func retentionPlot(f *RetentionFigures, title, path string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "seconds into the attack while deleting"
	p.Y.Label.Text = "p99 of each second (ms)"
	p.Legend.Top = true
	top := max(f.P99Without, f.Target*f.P99Without) // the reference lines stay in view
	for _, v := range f.P99BySecondWith {
		top = max(top, v)
	}
	end := float64(len(f.P99BySecondWith))

	starts := f.TurnStarts
	if len(starts) == 0 { // a report from before the turns' starts were kept
		for k := range f.Turns {
			starts = append(starts, float64(k)*f.TurnSeconds)
		}
	}
	shade := color.NRGBA{R: 44, G: 160, B: 44, A: 50}
	for k := 0; k < len(starts); k += 2 { // retention first: even turns
		to := starts[k] + f.TurnSeconds
		if k+1 < len(starts) {
			to = starts[k+1]
		}
		from := max(starts[k], 0) // the first turn may begin a moment before the row
		band, err := plotter.NewPolygon(plotter.XYs{{X: from, Y: 0}, {X: to, Y: 0}, {X: to, Y: top}, {X: from, Y: top}})
		if err != nil {
			return fmt.Errorf("retention plot: %w", err)
		}
		band.Color, band.LineStyle.Width = shade, 0
		p.Add(band)
		if k == 0 {
			p.Legend.Add("turns with retention (the rest of the row after the turns deletes too)", band)
		}
	}

	// Events count from the first attack. Retention started SecondAttackAt
	// after it, and the row while deleting a moment later: the first
	// turn's start, from the row's, is minus that moment.
	at := f.SecondAttackAt
	if len(f.TurnStarts) > 0 {
		at -= f.TurnStarts[0]
	}
	legend := true
	for _, sp := range checkpointSpans(f.Events, at+end) {
		from, to := sp[0]-at, sp[1]-at
		if to < 0 || from > end {
			continue
		}
		bar, err := plotter.NewPolygon(plotter.XYs{{X: max(from, 0), Y: -top / 40}, {X: min(to, end), Y: -top / 40}, {X: min(to, end), Y: -top / 80}, {X: max(from, 0), Y: -top / 80}})
		if err != nil {
			return fmt.Errorf("retention plot: %w", err)
		}
		bar.Color, bar.LineStyle.Width = palette[1], 0
		p.Add(bar)
		if legend {
			p.Legend.Add("checkpoints", bar)
			legend = false
		}
	}

	pts := make(plotter.XYs, len(f.P99BySecondWith))
	for i, v := range f.P99BySecondWith {
		pts[i] = plotter.XY{X: float64(i), Y: v}
	}
	s, err := plotter.NewScatter(pts)
	if err != nil {
		return fmt.Errorf("retention plot: %w", err)
	}
	s.GlyphStyle.Color, s.GlyphStyle.Radius = palette[0], vg.Points(0.8)
	p.Add(s)
	p.Legend.Add("p99 of a second", s)
	for i, l := range []struct {
		name string
		y    float64
	}{{fmt.Sprintf("p99 of the row without retention (%.1f ms)", f.P99Without), f.P99Without},
		{fmt.Sprintf("%.1f times it", f.Target), f.Target * f.P99Without}} {
		line, err := plotter.NewLine(plotter.XYs{{X: 0, Y: l.y}, {X: end, Y: l.y}})
		if err != nil {
			return fmt.Errorf("retention plot: %w", err)
		}
		line.Color = palette[3+i]
		p.Add(line)
		p.Legend.Add(l.name, line)
	}
	p.Y.Min, p.Y.Max = -top/40, top*1.3 // room for the legend above the curve
	if err := p.Save(11*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("retention plot: %w", err)
	}
	return nil
}
