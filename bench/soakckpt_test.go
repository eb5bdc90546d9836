package bench

import (
	"strings"
	"testing"
	"time"
)

// Checkpoints are read from the Postgres events, and each one's p99 pools
// only the slices that ran wholly inside it.
func TestCheckpointWindows(t *testing.T) {
	events := []string{
		// A checkpoint that started before the log was read, then one
		// that started in the lead-in.
		"-500.0s checkpoint complete: wrote 90000 buffers (34.3%)",
		"-300.0s checkpoint starting: time",
		"-30.0s checkpoint complete: wrote 91000 buffers (34.7%)",
		"+87.0s automatic vacuum of table \"postgres.public.outbox\", elapsed 3.03 s",
		"+900.0s checkpoint starting: time",
		"+1709.5s checkpoint complete: wrote 129147 buffers (49.3%)",
		"+1799.6s checkpoint starting: time",
		"+2609.4s checkpoint complete: wrote 112815 buffers (43.0%)",
		"+3599.6s checkpoint starting: time",
	}
	spans := checkpointSpans(events, 3600)
	want := [][2]float64{{-300, -30}, {900, 1709.5}, {1799.6, 2609.4}, {3599.6, 3600}}
	if len(spans) != len(want) {
		t.Fatalf("spans %v, want %v", spans, want)
	}
	for i := range want {
		if spans[i] != want[i] {
			t.Errorf("span %d: %v, want %v", i, spans[i], want[i])
		}
	}
	// Minute slices from 0 to 3540 s: slice i has latencies of i ms.
	var starts []float64
	var lat [][]time.Duration
	for i := range 60 {
		starts = append(starts, float64(i*60))
		l := make([]time.Duration, 100)
		for j := range l {
			l[j] = time.Duration(i) * time.Millisecond
		}
		lat = append(lat, l)
	}
	got := checkpointWindows(spans, starts, time.Minute, lat)
	// 900-1709.5: slices 15 to 27 (27 ends at 1680); 1799.6-2609.4:
	// slices 30 to 42 (30 starts at 1800, 42 ends at 2580); the lead-in's
	// span and the last hold no whole slice.
	if len(got) != 2 || got[0].Slices != 13 || got[1].Slices != 13 {
		t.Fatalf("windows %+v, want two of 13 slices", got)
	}
	if got[0].P99 != 27 || got[1].P99 != 42 {
		t.Errorf("p99s %v and %v ms, want 27 and 42 (the slowest slice inside each)", got[0].P99, got[1].P99)
	}
}

// The soak's server checkpoints every 5 minutes, whatever the grown runs'
// timeout, so that a ten-minute window holds two whole cycles.
func TestSoakCheckpointTimeout(t *testing.T) {
	var timeouts []string
	for _, kv := range soakSettings(false) {
		if v, ok := strings.CutPrefix(kv, "checkpoint_timeout="); ok {
			timeouts = append(timeouts, v)
		}
	}
	if len(timeouts) != 1 || timeouts[0] != "300s" {
		t.Errorf("checkpoint_timeout set to %v, want once to 300s", timeouts)
	}
}
