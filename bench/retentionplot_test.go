package bench

import (
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A run's JSON file holds what the retention plot needs: read back, the
// report draws it again, with the turns and the checkpoints.
func TestRetentionPlotFromJSON(t *testing.T) {
	f := &RetentionFigures{
		Backlog: 1000, FirstPeak: 200, P99Without: 20, Target: 1.5,
		TurnSeconds: 10, Turns: 4, TurnStarts: []float64{-0.5, 10, 20, 30},
		SecondAttackAt: 5,
		Events:         []string{"+7.0s checkpoint starting: wal", "+30.0s checkpoint complete: wrote 1 buffers", "+50.0s checkpoint starting: wal"},
	}
	for i := range 60 {
		f.P99BySecondWith = append(f.P99BySecondWith, float64(10+i%7))
	}
	b, err := json.Marshal(&Report{When: time.Date(2026, 12, 7, 2, 35, 38, 0, time.UTC), Grown: &GrownFigures{Retention: f}})
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	paths, err := WritePlots(&rep, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 1 || filepath.Base(paths[0]) != "20261207T023538Z-grown-retention.png" {
		t.Fatalf("plots %q, want the grown retention plot alone", paths)
	}
	r, err := os.Open(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	img, err := png.Decode(r)
	if err != nil {
		t.Fatalf("%s: %v", paths[0], err)
	}
	if w := img.Bounds().Dx(); w < 500 {
		t.Errorf("the plot is %d pixels wide", w)
	}

	// A report without retention figures has nothing to draw.
	if paths, err := WritePlots(&Report{When: rep.When}, dir); err != nil || len(paths) != 0 {
		t.Errorf("an empty report drew %q (%v)", paths, err)
	}
}
