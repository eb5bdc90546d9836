package bench

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
)

// TestBenchBillsQuick runs the bills' benchmark on a small statement: an
// edged built from this tree fetches, parses and compares it, and the run
// ends ok with every row matched but the ones the ledger lacks (each
// repaired). The figures are logged, never judged.
func TestBenchBillsQuick(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "edged")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/edged").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := RunBills(ctx, BillsConfig{Edged: bin, Rows: []int{20_000}})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Rows[0]
	if r.Categories[durable.BillMatched] != 20_000-2*billsMissing || r.Categories[durable.BillChannelOnly] != 2*billsMissing {
		t.Errorf("categories %v", r.Categories)
	}
	if r.PeakAfterMiB <= 0 {
		t.Error("edged's peak memory was not read")
	}
	t.Logf("\n%s", rep.Table())
}
