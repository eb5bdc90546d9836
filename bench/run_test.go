package bench

import (
	"context"
	"testing"
)

// The bench's smoke test: every scenario and ceiling, briefly, on a small
// stack, invariants checked by SQL after each scenario, so the bench cannot
// rot.
func TestBenchQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("load")
	}
	rep, err := Run(context.Background(), Config{Quick: true, Workers: 16, JSONDir: t.TempDir()})
	if rep != nil {
		t.Log("\n" + rep.Table())
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range rep.Rows {
		if row.Requests == 0 || row.Errors > 0 {
			t.Errorf("%s: %d requests, %d errors", row.Name, row.Requests, row.Errors)
		}
		for code, n := range row.Codes {
			if code != 200 {
				t.Errorf("%s: %d answers %d", row.Name, n, code)
			}
		}
		if row.Check != "" && row.Check != "ok" {
			t.Errorf("%s: %s", row.Name, row.Check)
		}
	}
	if len(rep.Plots) != 2 {
		t.Errorf("plots %v, want two PNG files", rep.Plots)
	}
	if rep.find("redis-down (killed at 1/2)").Outcomes["replayed_db"] == 0 {
		t.Error("redis-down: nothing replayed from Postgres after the kill")
	}
}
