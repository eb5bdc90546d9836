package durable

import (
	"math"
	"testing"
	"time"
)

// A batch gets the time its rows were inserted over, shortened by the
// catch-up: the deletion rate is the insert rate plus catchUp.
func TestRetentionBudget(t *testing.T) {
	for _, c := range []struct {
		name    string
		n       int64
		span    time.Duration
		catchUp float64
		want    time.Duration
	}{
		// 1,000 rows inserted over 1 s (1,000 a second), deleted at
		// 1,000 + 1,000 a second.
		{"busy table", 1000, time.Second, 1000, 500 * time.Millisecond},
		// 1,000 rows over 20 s (50 a second): 1,050 a second, 0.952 s.
		{"quiet table", 1000, 20 * time.Second, 1000, 952380952},
		// 2,000 a second inserted, nothing to catch up: exactly that rate.
		{"no catch-up", 1000, 500 * time.Millisecond, 0, 500 * time.Millisecond},
		// Rows inserted at one time: no time of their own.
		{"one time", 1000, 0, 1000, 0},
		{"no rows", 0, time.Second, 1000, 0},
		// A clock step backwards between two batches is no time.
		{"negative span", 1000, -time.Second, 1000, 0},
	} {
		if got := retentionBudget(c.n, c.span, c.catchUp); (got - c.want).Abs() > time.Microsecond {
			t.Errorf("%s: retentionBudget(%d, %v, %v) = %v, want %v", c.name, c.n, c.span, c.catchUp, got, c.want)
		}
	}
}

// The schedule moves on by each batch's budget from where the previous was
// due, so a slow batch is made up by the next ones, but by no more than
// retentionBurst.
func TestRetentionSchedule(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := retentionSchedule{due: t0}
	s.next(t0, 100*time.Millisecond)
	if want := t0.Add(100 * time.Millisecond); !s.due.Equal(want) {
		t.Fatalf("due %v after an on-time batch, want %v", s.due, want)
	}
	// The next batch began 300 ms late: it is due again 100 ms after
	// where it was due, already past, so the next runs at once.
	s.next(t0.Add(400*time.Millisecond), 100*time.Millisecond)
	if want := t0.Add(200 * time.Millisecond); !s.due.Equal(want) {
		t.Fatalf("due %v after a late batch, want %v (made up)", s.due, want)
	}
	// A batch that began 10 s late makes up one second, not ten.
	s.next(t0.Add(10*time.Second), 100*time.Millisecond)
	if want := t0.Add(10*time.Second - retentionBurst + 100*time.Millisecond); !s.due.Equal(want) {
		t.Fatalf("due %v after a long stall, want %v (at most %v made up)", s.due, want, retentionBurst)
	}
}

// The catch-up is CatchUpRate, lowered where its WAL would pass the
// table's even part of the cap.
func TestCatchUpRate(t *testing.T) {
	for _, c := range []struct {
		name                    string
		catchUp, walCap, perRow float64
		tables                  int
		want                    float64
	}{
		// 471 KB a second (a quarter of the defaults' rate) over two
		// tables of 400-byte rows: 589 rows a second each.
		{"capped", 1000, 471_000, 400, 2, 471_000 / 2.0 / 400},
		// One table alone gets the whole cap: 1,177, above 1,000.
		{"under the cap", 1000, 471_000, 400, 1, 1000},
		{"no cap", 1000, 0, 400, 2, 1000},
		{"no reading yet", 1000, 471_000, 0, 2, 1000},
	} {
		if got := catchUpRate(c.catchUp, c.walCap, c.perRow, c.tables); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: catchUpRate(%v, %v, %v, %d) = %v, want %v", c.name, c.catchUp, c.walCap, c.perRow, c.tables, got, c.want)
		}
	}
}

// The checkpoints' WAL rate is max_wal_size/(1+completion) over the
// timeout; a table's WAL per row is a moving average of its batches'.
func TestCheckpointWALPace(t *testing.T) {
	// The server's defaults: 1 GB, 5 min, 0.9.
	if got, want := checkpointWALRate(1024, 300, 0.9), 1024.0*(1<<20)/1.9/300; math.Abs(got-want) > 1e-6 {
		t.Errorf("checkpointWALRate(defaults) = %v, want %v", got, want)
	}
	if got := checkpointWALRate(0, 300, 0.9); got != 0 {
		t.Errorf("checkpointWALRate with no max_wal_size = %v, want 0 (no cap)", got)
	}
	for _, c := range []struct {
		name   string
		avg    float64
		wal, n int64
		want   float64
	}{
		{"first batch", 0, 400_000, 1000, 400},
		{"later batch", 400, 200_000, 1000, 0.7*400 + 0.3*200},
		{"no rows", 400, 5000, 0, 400},
	} {
		if got := movingWALPerRow(c.avg, c.wal, c.n); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: movingWALPerRow(%v, %d, %d) = %v, want %v", c.name, c.avg, c.wal, c.n, got, c.want)
		}
	}
}
