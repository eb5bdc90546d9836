package durable

import "time"

// retentionBudget is the wall time one batch of a table may take, pause
// included, so that retention deletes what ages out (the rate the rows
// were inserted at, a retention ago) plus catchUp rows a second of
// backlog. The batch deleted n rows covering span of the table's time
// column (since the previous batch's newest row): n/span is the rate
// they were inserted at, n/(n/span + catchUp) the time they get.
//
// Following the insert rate is never capped: a cap below it would grow
// the tables without end, however slowly. What is capped is the catch-up
// on top, which is what a backlog (a retention leader that was down, a
// first start on a week of rows, an Interval's sleep) would otherwise
// take at the full speed of the database, out of the callbacks' time.
// A batch whose rows share one time (span 0) gets no time of its own:
// its rows were inserted at once, and the next batch's span carries
// theirs.
func retentionBudget(n int64, span time.Duration, catchUp float64) time.Duration {
	if n <= 0 || span <= 0 {
		return 0
	}
	inserted := float64(n) / span.Seconds()
	return time.Duration(float64(n) / (inserted + catchUp) * float64(time.Second))
}

// retentionBurst is how much earlier than its schedule a table's batches
// may run after falling behind it (slow batches, a busy machine): they
// make up at most this much at full speed, then keep the pace again.
const retentionBurst = time.Second

// retentionSchedule is when a table's next batch is due: every batch moves
// it on by its budget from where the previous one was due, not from when
// it ran, so that a batch that took longer than its budget is made up by
// the next ones (retentionBurst at most).
type retentionSchedule struct{ due time.Time }

// next moves the schedule on past a batch that began at began and earned
// budget; due is never more than retentionBurst behind began.
func (s *retentionSchedule) next(began time.Time, budget time.Duration) {
	s.due = maxTime(s.due, began.Add(-retentionBurst)).Add(budget)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// checkpointWALRate is the WAL, in bytes a second, that brings the next
// checkpoint by WAL exactly when checkpoint_timeout would: Postgres starts
// one once max_wal_size/(1+checkpoint_completion_target) has been written
// since the previous one's start. Written faster, checkpoints come sooner,
// each with its flush and a new round of full-page images. 0 for settings
// it cannot read.
func checkpointWALRate(maxWALMB, timeoutSec, completion float64) float64 {
	if maxWALMB <= 0 || timeoutSec <= 0 || completion < 0 {
		return 0
	}
	return maxWALMB * (1 << 20) / (1 + completion) / timeoutSec
}

// catchUpRate is a table's catch-up, in rows a second: catchUp, or less
// where the table's deletes, perRow bytes of WAL a row, would write more
// than its even part of walCap, shared by the tables still walking. No cap
// (walCap 0) or no reading yet (perRow 0) leaves catchUp.
func catchUpRate(catchUp, walCap, perRow float64, tables int) float64 {
	if walCap <= 0 || perRow <= 0 || tables <= 0 {
		return catchUp
	}
	return min(catchUp, walCap/float64(tables)/perRow)
}

// walPerRow is a table's WAL per deleted row: its batches' WAL and rows,
// each batch's weight decaying by 0.7 a batch, so that a few batches
// follow a change (full-page images after a checkpoint) and one odd batch
// moves it little. A batch's WAL is walMeter's estimate and may come out
// below zero where other sessions' WAL hides it; it is summed as it is,
// so that such batches pull the figure down no more and no less than
// their error.
type walPerRow struct{ wal, rows float64 }

// add folds in a batch that wrote wal bytes deleting n rows.
func (p *walPerRow) add(wal, n int64) {
	if n <= 0 {
		return
	}
	p.wal = 0.7*p.wal + float64(wal)
	p.rows = 0.7*p.rows + float64(n)
}

// bytes is the WAL per row: 0, none to go by, before the first batch or
// while other sessions' WAL hides the table's own.
func (p walPerRow) bytes() float64 {
	if p.rows <= 0 || p.wal <= 0 {
		return 0
	}
	return p.wal / p.rows
}

// walMeter tells a retention batch's own WAL from other sessions'. The
// server's WAL position moves with every session's writes, the callbacks'
// above all; charged to retention, they would hold its catch-up lowest
// when the callbacks are busiest, though no checkpoint comes sooner on
// retention's account. Between two batches retention's session writes
// nothing, so what the position moves by then is the others' rate, and a
// batch is charged its move less that rate over the batch's own time.
// It is an estimate: on a busy machine the others write more in the gaps
// than beside a batch that takes a core, so it errs low there, where
// charging their whole WAL erred high by all of it.
type walMeter struct {
	// pos is the position after the previous batch, read at at (zero
	// before the first batch).
	pos int64
	at  time.Time
	// bytes and secs are the other sessions' WAL and the time they wrote
	// it in, over the gaps between batches, each gap's weight decaying by
	// 0.7 a gap: their ratio is the others' rate, in which a long gap
	// counts for more than a short one.
	bytes, secs float64
}

// walMeterMinGap is the shortest gap the meter learns from: over less, a
// single commit's WAL would read as a rate. Batches are at least MinPause
// (default 10ms) apart.
const walMeterMinGap = 5 * time.Millisecond

// batch takes the WAL positions read before a batch (before, at from) and
// after it (after, at to), and returns the WAL the batch wrote (below
// zero where the estimate of the others' overshoots) and the other
// sessions' WAL it was not charged. A leader's first batch, with no gap
// before it to learn from, is charged the whole move.
func (m *walMeter) batch(before int64, from time.Time, after int64, to time.Time) (own, others int64) {
	if gap := from.Sub(m.at); !m.at.IsZero() && gap >= walMeterMinGap {
		m.bytes = 0.7*m.bytes + float64(max(before-m.pos, 0))
		m.secs = 0.7*m.secs + gap.Seconds()
	}
	m.pos, m.at = after, to
	if m.secs > 0 {
		others = int64(m.bytes / m.secs * max(to.Sub(from), 0).Seconds())
	}
	return max(after-before, 0) - others, others
}
