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

// movingWALPerRow folds a batch's WAL per row (wal bytes for n rows) into
// the table's moving average avg (0: none yet), weighing the batch 0.3:
// a few batches follow a change (full-page images after a checkpoint),
// one odd batch (another session's burst of WAL meanwhile) moves it
// little.
func movingWALPerRow(avg float64, wal, n int64) float64 {
	if n <= 0 {
		return avg
	}
	v := float64(max(wal, 0)) / float64(n)
	if avg <= 0 {
		return v
	}
	return 0.7*avg + 0.3*v
}
