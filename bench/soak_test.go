package bench

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// The soak at a smoke size, on the built binaries: every series is read,
// the seeded rows cross the retention and retention deletes them, the
// receiver gets every event, the invariants hold, the plots are drawn.
func TestSoakQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("load")
	}
	bin := t.TempDir()
	for _, cmd := range []string{"edged", "shipper", "forwarder"} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, cmd), "../cmd/"+cmd).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", cmd, err, out)
		}
	}
	out := t.TempDir()
	rep, err := RunSoak(context.Background(), SoakConfig{Edged: filepath.Join(bin, "edged"), Shipper: filepath.Join(bin, "shipper"),
		Forwarder: filepath.Join(bin, "forwarder"), Quick: true, Workers: 8, Out: out})
	if rep != nil {
		t.Log("\n" + rep.Table())
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Slices) != 3 || len(rep.Samples) < 3 {
		t.Errorf("%d slices and %d samples, want 3 slices and a sample a second", len(rep.Slices), len(rep.Samples))
	}
	last := rep.Samples[len(rep.Samples)-1]
	if last.EdgedMiB <= 0 || last.ShipperMiB <= 0 || last.ForwarderMiB <= 0 || last.RedisMiB <= 0 || last.RedisKeys <= 0 || len(last.Tables) != 2 {
		t.Errorf("last sample %+v: a series was not read", last)
	}
	if rep.Deleted["notify_claim"] <= 0 || rep.Deleted["outbox"] <= 0 {
		t.Errorf("retention deleted %v during the soak, want claims and outbox rows", rep.Deleted)
	}
	if rep.Forwarded < rep.Published || rep.Published == 0 {
		t.Errorf("the receiver took %d events of %d", rep.Forwarded, rep.Published)
	}
	if len(rep.Plots) != 2 || rep.P99First <= 0 || rep.RSSGrowth["edged"] <= 0 {
		t.Errorf("plots %v, p99 first %.2f, rss growth %v", rep.Plots, rep.P99First, rep.RSSGrowth)
	}
}

func TestP99WindowIsTenMinutesOrATenth(t *testing.T) {
	for _, c := range []struct {
		slices int
		slice  time.Duration
		want   int
	}{
		{60, time.Minute, 10},       // an hour: ten one-minute slices
		{120, 30 * time.Second, 20}, // an hour of half-minute slices
		{29, time.Minute, 2},        // too short for three windows: a tenth
		{5, time.Minute, 1},
		{3, time.Second, 1},
	} {
		if got := p99Window(c.slices, c.slice); got != c.want {
			t.Errorf("p99Window(%d, %v) = %d, want %d", c.slices, c.slice, got, c.want)
		}
	}
}
