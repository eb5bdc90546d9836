package bench

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
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
		Forwarder: filepath.Join(bin, "forwarder"), Quick: true, Workers: 8, Out: out,
		TableOptions: BloatVariants[len(BloatVariants)-1].TableOptions})
	if rep != nil {
		t.Log("\n" + rep.Table())
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"edged", "shipper", "forwarder", "postgres", "cache redis", "stream redis", "bench", "machine"} {
		// A quiet process may use less than a clock tick in seconds.
		if _, ok := rep.CPUPerRequest[name]; !ok {
			t.Errorf("no CPU read for %s: %v", name, rep.CPUPerRequest)
		}
	}
	if rep.CPUPerRequest["machine"] <= 0 || rep.CPUPerRequest["edged"] <= 0 {
		t.Errorf("CPU per request %v: the machine and edged must have used some", rep.CPUPerRequest)
	}
	if rep.LeadIn <= 0 || rep.LeadInP99 <= 0 || rep.Checkpoints["checkpoint_timeout"] == "" {
		t.Errorf("lead-in %.0f s, p99 %.2f ms; checkpoint settings %v", rep.LeadIn, rep.LeadInP99, rep.Checkpoints)
	}
	if len(rep.Slices) != 3 || len(rep.Samples) < 3 {
		t.Fatalf("%d slices and %d samples, want 3 slices and a sample a second", len(rep.Slices), len(rep.Samples))
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
	if _, ok := rep.MaxPastRetention["outbox"]; !ok || last.PastRetention == nil {
		t.Errorf("the oldest rows' ages were not read: %v, last sample %v", rep.MaxPastRetention, last.PastRetention)
	}
}

// The samples' checks: a process gone at a sample, a row too long past its
// retention, and ages that could not be read each fail the soak.
func TestSoakSampleChecks(t *testing.T) {
	ok := func(at, claim float64) SoakSample {
		return SoakSample{At: at, EdgedMiB: 100, ShipperMiB: 20, ForwarderMiB: 20,
			PastRetention: map[string]float64{"notify_claim": claim, "outbox": -5}}
	}
	for _, c := range []struct {
		name    string
		samples []SoakSample
		fails   string
	}{
		{"kept up", []SoakSample{ok(0, -300), ok(10, 30), ok(20, 119)}, ""},
		{"fell behind", []SoakSample{ok(0, 30), ok(10, 121), ok(20, 30)}, "notify_claim row was 121 s past"},
		{"forwarder gone", []SoakSample{ok(0, 0), {At: 10, EdgedMiB: 100, ShipperMiB: 20, PastRetention: map[string]float64{}}, ok(20, 0)}, "forwarder was gone at 10 s"},
		{"ages unread", []SoakSample{ok(0, 0), {At: 10, EdgedMiB: 1, ShipperMiB: 1, ForwarderMiB: 1}, {At: 20, EdgedMiB: 1, ShipperMiB: 1, ForwarderMiB: 1}}, "read at 1 of 3 samples"},
	} {
		r := &SoakReport{Samples: c.samples, MaxPastRetention: map[string]float64{}}
		_, err := r.checkSamples()
		switch {
		case c.fails == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.fails != "" && (err == nil || !strings.Contains(err.Error(), c.fails)):
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.fails)
		}
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
