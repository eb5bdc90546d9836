package bench

import (
	"context"
	"strings"
	"testing"
	"time"
)

// The bloat bench's smoke size: a week of 5,000 claims turned over in 14 s
// (a day every 2 s: a seeding slowed by a loaded machine leaves retention
// a backlog it works off well within the week). Retention keeps the
// tables at about a week's rows while the inserts go on: without the
// inserts they would empty, without retention double.
func TestBloatSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Postgres server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	v := BloatVariants[len(BloatVariants)-1]
	rep, err := RunBloat(ctx, BloatConfig{Claims: 5000, Week: 14 * time.Second, Weeks: 1, Variants: []string{v.Name}, Out: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 1 || len(rep.Runs[0].Days) != 8 {
		t.Fatalf("runs %+v, want one variant with the seeded day and 7 more", rep.Runs)
	}
	for _, d := range []BloatDay{rep.Runs[0].Days[0], rep.Runs[0].Days[7]} {
		for _, tb := range d.Tables {
			want := rep.Claims
			if tb.Table == "outbox" {
				want = rep.Outbox
			}
			// A day's rows either way is slack for retention's pace.
			if tb.Rows < want*6/7 || tb.Rows > want*8/7+want/20 {
				t.Errorf("day %d: %s holds %d rows, want about a week's %d", d.Day, tb.Table, tb.Rows, want)
			}
			if tb.HeapMiB <= 0 || len(tb.IndexMiB) == 0 {
				t.Errorf("day %d: %s: no sizes read: %+v", d.Day, tb.Table, tb)
			}
		}
	}
	if table := rep.Table(); !strings.Contains(table, "over the last week:") || rep.Plot == "" {
		t.Errorf("the report has no week's growth or no plot:\n%s", table)
	}
}
