package bench

import (
	"strconv"
	"strings"
	"time"
)

// CheckpointWindow is one checkpoint the soak ran through, from its start
// to its end (seconds into the soak), and the p99 of every request of the
// slices that ran wholly inside it: windows at the same point of the
// checkpoint cycle, which the first and last ten minutes need not be
// (they are when the checkpoint_timeout divides ten minutes and the
// checkpoints come by time, as in the soak).
type CheckpointWindow struct {
	Start  float64 `json:"start_s"`
	End    float64 `json:"end_s"`
	Slices int     `json:"slices"`
	P99    float64 `json:"p99_ms"`
}

// checkpointSpans reads the checkpoints' starts and ends from the Postgres
// events (postgresEvents' lines, "+900.0s checkpoint starting: time"; a
// lead-in's are negative): a checkpoint still running at the last event
// ends at end, and one whose start came before the first event is left
// out.
func checkpointSpans(events []string, end float64) [][2]float64 {
	var spans [][2]float64
	open, opened := 0.0, false
	for _, e := range events {
		at, msg, ok := strings.Cut(e, " ")
		if !ok || !strings.HasPrefix(msg, "checkpoint ") {
			continue
		}
		t, err := strconv.ParseFloat(strings.TrimSuffix(at, "s"), 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(msg, "checkpoint starting"):
			open, opened = t, true
		case strings.HasPrefix(msg, "checkpoint complete") && opened:
			spans = append(spans, [2]float64{open, t})
			opened = false
		}
	}
	if opened {
		spans = append(spans, [2]float64{open, end})
	}
	return spans
}

// checkpointWindows pools, for each checkpoint span, the latencies of the
// slices (starting at starts[i], each slice long) that ran wholly inside
// it, and takes their p99; a span no slice fits in is left out.
func checkpointWindows(spans [][2]float64, starts []float64, slice time.Duration, lat [][]time.Duration) []CheckpointWindow {
	var out []CheckpointWindow
	for _, sp := range spans {
		w := CheckpointWindow{Start: sp[0], End: sp[1]}
		var pooled []time.Duration
		for i, at := range starts {
			if at >= sp[0] && at+slice.Seconds() <= sp[1] && i < len(lat) {
				pooled = append(pooled, lat[i]...)
				w.Slices++
			}
		}
		if w.Slices == 0 {
			continue
		}
		w.P99 = millis(percentilesOf(pooled).P99)
		out = append(out, w)
	}
	return out
}
