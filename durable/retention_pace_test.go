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
// timeout; a table's WAL per row is its recent batches' WAL over their
// rows.
func TestCheckpointWALPace(t *testing.T) {
	// The server's defaults: 1 GB, 5 min, 0.9.
	if got, want := checkpointWALRate(1024, 300, 0.9), 1024.0*(1<<20)/1.9/300; math.Abs(got-want) > 1e-6 {
		t.Errorf("checkpointWALRate(defaults) = %v, want %v", got, want)
	}
	if got := checkpointWALRate(0, 300, 0.9); got != 0 {
		t.Errorf("checkpointWALRate with no max_wal_size = %v, want 0 (no cap)", got)
	}
	// WAL per row: the batches' WAL over their rows, each batch weighing
	// 0.7 of the one after it.
	var p walPerRow
	if got := p.bytes(); got != 0 {
		t.Errorf("no batch yet: %v bytes a row, want 0 (none to go by)", got)
	}
	p.add(400_000, 1000)
	if got := p.bytes(); math.Abs(got-400) > 1e-9 {
		t.Errorf("one batch: %v bytes a row, want 400", got)
	}
	p.add(200_000, 1000)
	if got, want := p.bytes(), (0.7*400_000+200_000)/(0.7*1000+1000); math.Abs(got-want) > 1e-9 {
		t.Errorf("two batches: %v bytes a row, want %v", got, want)
	}
	p.add(5000, 0) // no rows: nothing to fold in
	// An estimate below zero pulls the figure down by as much.
	p.add(-200_000, 1000)
	if got, want := p.bytes(), (0.7*(0.7*400_000+200_000)-200_000)/(0.7*(0.7*1000+1000)+1000); math.Abs(got-want) > 1e-9 {
		t.Errorf("a batch below zero: %v bytes a row, want %v", got, want)
	}
	var hidden walPerRow
	hidden.add(-1000, 1000)
	if got := hidden.bytes(); got != 0 {
		t.Errorf("WAL hidden by others': %v bytes a row, want 0 (none to go by)", got)
	}
}

// A batch is charged the WAL position's move less what other sessions
// write at the rate they wrote in the gaps before it; the first batch,
// with no gap to learn from, is charged the whole move, and a gap too
// short to tell a rate teaches nothing.
func TestWALMeterLeavesOthersOut(t *testing.T) {
	var m walMeter
	near := func(got, want int64) bool { return got >= want-1 && got <= want+1 }
	t0 := time.Unix(1_000_000, 0)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	// The first batch: 10 ms, 150,000 bytes, others unknown.
	if own, others := m.batch(0, at(0), 150_000, at(10)); !near(own, 150_000) || others != 0 {
		t.Errorf("first batch: own %d, others %d; want 150000 and 0", own, others)
	}
	// 1 ms apart, others wrote 500,000 bytes (one commit): too short a
	// gap to learn from, so the next batch is charged its whole move.
	if own, others := m.batch(650_000, at(11), 700_000, at(21)); !near(own, 50_000) || others != 0 {
		t.Errorf("after a short gap: own %d, others %d; want 50000 and 0", own, others)
	}
	// 100 ms apart, others wrote 1,000,000 bytes: 10 MB a second. A
	// 10 ms batch moving the position 150,000 wrote 50,000 of it.
	if own, others := m.batch(1_700_000, at(121), 1_850_000, at(131)); !near(own, 50_000) || !near(others, 100_000) {
		t.Errorf("after a long gap: own %d, others %d; want 50000 and 100000", own, others)
	}
	// 300 ms apart at 2 MB a second: the rate is the gaps' bytes over
	// their seconds, the older gap's weighing 0.7, so the longer gap
	// counts for more: (0.7*1e6 + 6e5)/(0.07 + 0.3) = 3.51 MB a second.
	// A 10 ms batch that moved the position less than that is charged
	// below zero.
	rate := (0.7*1e6 + 6e5) / (0.7*0.1 + 0.3)
	if own, others := m.batch(2_450_000, at(431), 2_470_000, at(441)); !near(others, int64(rate*0.01)) || !near(own, 20_000-int64(rate*0.01)) {
		t.Errorf("after a second gap: own %d, others %d; want %d and %d", own, others, 20_000-int64(rate*0.01), int64(rate*0.01))
	}
}
