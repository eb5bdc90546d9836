package durable

import (
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
