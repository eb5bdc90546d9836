package durable_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// groupStore opens a group-commit Store with one batch slot, so the test
// decides what shares a batch: while the slot is held, deliveries queue,
// and the batch that frees it takes them all.
func groupStore(t *testing.T, b *bundle) *durable.Store {
	t.Helper()
	return newStore(t, b.url, durable.Config{GroupCommit: true, GroupBatches: 1, MaxConns: 24})
}

type decided struct {
	n   durable.Notification
	r   durable.Result
	err error
	at  time.Duration
}

// submit runs Process for each note on its own goroutine; each answer
// arrives on the channel.
func submit(s *durable.Store, timeout time.Duration, notes ...durable.Notification) <-chan decided {
	out := make(chan decided, len(notes))
	start := time.Now()
	for _, n := range notes {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			r, err := s.Process(ctx, n)
			out <- decided{n, r, err, time.Since(start)}
		}()
	}
	return out
}

// holdSlot takes the store's one batch slot: a delivery for an order the
// test holds locked waits in its transaction, alone, until release. The
// deliveries submitted meanwhile queue for the next batch.
func holdSlot(t *testing.T, b *bundle, s *durable.Store, orderNo string) (release func(), answer <-chan decided) {
	t.Helper()
	b.order(t, orderNo, durable.PendingPay, 100, "CNY")
	release = b.lockOrder(t, orderNo)
	answer = submit(s, 20*time.Second, note("T"+orderNo, durable.PaySuccess, orderNo, 100, "CNY"))
	durabletest.WaitLockWaiters(t, b.db, 1, "%")
	return release, answer
}

// payments seeds n pending orders prefix-00 .. and returns a payment of each.
func payments(t *testing.T, b *bundle, prefix string, n int) []durable.Notification {
	t.Helper()
	var notes []durable.Notification
	for i := range n {
		o := fmt.Sprintf("%s%02d", prefix, i)
		b.order(t, o, durable.PendingPay, 100, "CNY")
		notes = append(notes, note("T"+o, durable.PaySuccess, o, 100, "CNY"))
	}
	return notes
}

// oneBatch submits notes so that they queue behind the store's one batch
// slot (held meanwhile by a delivery of order slot), then frees it: the
// next batch takes them all. Their answers arrive on the channel.
func oneBatch(t *testing.T, b *bundle, s *durable.Store, slot string, notes []durable.Notification) <-chan decided {
	t.Helper()
	freeSlot, slotAnswer := holdSlot(t, b, s, slot)
	answers := submit(s, 20*time.Second, notes...)
	waitQueued(t, s, len(notes))
	freeSlot()
	if a := <-slotAnswer; a.err != nil || a.r.Outcome != durable.Applied {
		t.Fatalf("the slot's delivery: %+v %v", a.r, a.err)
	}
	return answers
}

// applied takes one answer from each of chs (a channel named twice gives
// two) and fails the test unless each delivery was applied.
func applied(t *testing.T, chs ...<-chan decided) {
	t.Helper()
	for _, ch := range chs {
		if a := <-ch; a.err != nil || a.r.Outcome != durable.Applied {
			t.Fatalf("%s: %+v %v", a.n.BizKey, a.r, a.err)
		}
	}
}

// waitQueued waits until n deliveries wait for the store's batch slot.
func waitQueued(t *testing.T, s *durable.Store, n int) {
	t.Helper()
	wait.For(t, fmt.Sprintf("%d deliveries queued for the batch slot", n), func() (bool, string) {
		q := durable.GroupQueued(s)
		return q >= n, fmt.Sprintf("%d queued", q)
	})
}

// One member of a batch waits for a lock another transaction holds (its
// order's row, then its key): the batch hands it back, answers every other
// member at once, and the blocked one is decided alone once the lock goes.
func TestGroupBlockedMemberDoesNotHoldItsBatch(t *testing.T) {
	for _, held := range []string{"order", "key"} {
		t.Run(held, func(t *testing.T) {
			b := setup(t)
			s := groupStore(t, b)
			ctx := context.Background()
			blocked := note("TBLOCK", durable.PaySuccess, "G-BLOCK", 100, "CNY")
			b.order(t, "G-BLOCK", durable.PendingPay, 100, "CNY")
			var release func()
			switch held {
			case "order":
				release = b.lockOrder(t, "G-BLOCK")
			case "key":
				tx, err := b.db.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, blocked.BizKey); err != nil {
					t.Fatal(err)
				}
				release = func() { _ = tx.Rollback(ctx) }
				t.Cleanup(release)
			}
			answers := oneBatch(t, b, s, "G-SLOT", append(payments(t, b, "G-", 20), blocked))
			stats := s.GroupStats()
			for range 20 {
				select {
				case a := <-answers:
					if a.n.BizKey == blocked.BizKey {
						t.Fatalf("the blocked delivery answered while its %s was held: %+v %v", held, a.r, a.err)
					}
					if a.err != nil || a.r.Outcome != durable.Applied {
						t.Fatalf("%s: %+v %v", a.n.BizKey, a.r, a.err)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("the batch's other members are held by the blocked one")
				}
			}
			if got := stats.Batches.Load(); got != 1 {
				t.Errorf("%d batches for the 21 queued deliveries, want 1", got)
			}
			if stats.Busy.Load() != 1 {
				t.Errorf("busy members: %d, want 1", stats.Busy.Load())
			}
			release()
			a := <-answers
			if a.err != nil || a.r.Outcome != durable.Applied {
				t.Fatalf("the blocked delivery once its %s was free: %+v %v", held, a.r, a.err)
			}
			if err := durabletest.Invariants(ctx, b.db, "G-", nil); err != nil {
				t.Error(err)
			}
		})
	}
}

// A wait the try-locks cannot foresee (here a claim row another
// transaction inserted without the key's lock, as a repair by hand would)
// ends at the batch's lock_timeout; the batch rolls back and every member
// is decided alone: the others answer, the blocked one waits for its lock.
func TestGroupLockTimeoutRetriesAlone(t *testing.T) {
	b := setup(t)
	s := groupStore(t, b)
	ctx := context.Background()
	blocked := note("TWAIT", durable.PaySuccess, "W-WAIT", 100, "CNY")
	b.order(t, "W-WAIT", durable.PendingPay, 100, "CNY")
	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json)
		VALUES ($1, 'W-WAIT', $2, 'DONE', '{"http":200,"code":"SUCCESS","outcome":"applied","status":"PAID"}')`,
		blocked.BizKey, blocked.Digest); err != nil {
		t.Fatal(err)
	}
	answers := oneBatch(t, b, s, "W-SLOT", append(payments(t, b, "W-", 5), blocked))
	for range 5 {
		select {
		case a := <-answers:
			if a.n.BizKey == blocked.BizKey || a.err != nil || a.r.Outcome != durable.Applied {
				t.Fatalf("%s: %+v %v", a.n.BizKey, a.r, a.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the batch's other members are held by the blocked one")
		}
	}
	if got := s.GroupStats().Retried.Load(); got != 6 {
		t.Errorf("deliveries decided again alone: %d, want the batch's 6", got)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if a := <-answers; a.err != nil || a.r.Outcome != durable.Applied || a.r.Replayed {
		t.Fatalf("the blocked delivery once the claim was rolled back: %+v %v", a.r, a.err)
	}
}

// An error in one delivery (here a trigger that refuses its outbox row)
// fails its batch; the members are decided again alone: the others are
// applied, the faulty one gets its error, and nothing of it is stored.
func TestGroupErrorInOneMemberSparesTheOthers(t *testing.T) {
	b := setup(t)
	s := groupStore(t, b)
	ctx := context.Background()
	if _, err := b.db.Exec(ctx, `
CREATE FUNCTION refuse_e_bad() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.order_no = 'E-BAD' THEN RAISE EXCEPTION 'refused for the test'; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_e_bad BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION refuse_e_bad();`); err != nil {
		t.Fatal(err)
	}
	bad := note("TBAD", durable.PaySuccess, "E-BAD", 100, "CNY")
	b.order(t, "E-BAD", durable.PendingPay, 100, "CNY")
	notes := append(payments(t, b, "E-", 5), bad)
	answers := oneBatch(t, b, s, "E-SLOT", notes)
	for range notes {
		a := <-answers
		if a.n.BizKey == bad.BizKey {
			if a.err == nil {
				t.Errorf("the faulty delivery: %+v, want its error", a.r)
			}
			continue
		}
		if a.err != nil || a.r.Outcome != durable.Applied {
			t.Errorf("%s: %+v %v", a.n.BizKey, a.r, a.err)
		}
	}
	if got := s.GroupStats().Retried.Load(); got != 6 {
		t.Errorf("deliveries decided again alone: %d, want 6", got)
	}
	if n := b.claims(t, bad.BizKey); n != 0 {
		t.Errorf("the faulty delivery left %d claims", n)
	}
	if st := b.status(t, "E-BAD"); st != durable.PendingPay {
		t.Errorf("E-BAD is %s", st)
	}
	if err := durabletest.Invariants(ctx, b.db, "E-", nil); err != nil {
		t.Error(err)
	}
}

// A batch never holds two deliveries of one key or one order: duplicates
// and a refund of the same order queue behind it, and every answer is the
// one-at-a-time answer (one decided, the rest replays).
func TestGroupNeverBatchesOneKeyOrOrderTwice(t *testing.T) {
	b := setup(t)
	s := groupStore(t, b)
	b.order(t, "K-1", durable.PendingPay, 100, "CNY")
	pay := note("TK1", durable.PaySuccess, "K-1", 100, "CNY")
	closeOther := note("TK1X", durable.PayClosed, "K-1", 100, "CNY")
	notes := []durable.Notification{pay, pay, pay, closeOther}
	answers := oneBatch(t, b, s, "K-SLOT", notes)
	decided, replayed := 0, 0
	for range notes {
		a := <-answers
		if a.err != nil {
			t.Fatalf("%s: %v", a.n.BizKey, a.err)
		}
		switch {
		case a.n.BizKey == closeOther.BizKey:
			// PAY_CLOSED after PAY_SUCCESS (a close of an abandoned
			// attempt) skips; before it, it would close the order and the
			// payment would be PAID_AFTER_CLOSE: either is a legal order.
		case a.r.Replayed:
			replayed++
		default:
			decided++ // applied, or skipped (PAID_AFTER_CLOSE) after the close
		}
	}
	if decided != 1 || replayed != 2 {
		t.Errorf("the payment: decided %d times, replayed %d; want 1 and 2", decided, replayed)
	}
	if got := s.GroupStats().Batches.Load(); got != 0 {
		t.Errorf("%d batches: one key and one order never share one", got)
	}
	if err := durabletest.Invariants(context.Background(), b.db, "K-", []string{pay.BizKey}); err != nil {
		t.Error(err)
	}
}

// decideAll decides notes (distinct keys and orders) and returns their
// answers in order. With group commit (durabletest.GroupCommit) they are
// decided in one batch, and the test fails unless they were; one at a
// time, one after the other.
func decideAll(t *testing.T, b *bundle, notes []durable.Notification) []durable.Result {
	t.Helper()
	out := make([]durable.Result, len(notes))
	if !durabletest.GroupCommit() {
		for i, n := range notes {
			out[i] = process(t, b.store, n)
		}
		return out
	}
	s := newStore(t, b.url, durable.Config{GroupCommit: true, GroupBatches: 1, GroupSize: len(notes), MaxConns: 4})
	answers := oneBatch(t, b, s, "Z-SLOT-"+notes[0].OrderNo, notes)
	index := make(map[string]int, len(notes))
	for i, n := range notes {
		index[n.BizKey] = i
	}
	for range notes {
		a := <-answers
		if a.err != nil {
			t.Fatalf("%s: %v", a.n.BizKey, a.err)
		}
		out[index[a.n.BizKey]] = a.r
	}
	if st := s.GroupStats(); st.Batches.Load() != 1 || st.Batched.Load() != uint64(len(notes)) {
		t.Fatalf("%d batches decided %d of the %d deliveries, want one batch of all", st.Batches.Load(), st.Batched.Load(), len(notes))
	}
	return out
}

// A session plans the batch's statements on its first batch and keeps the
// plans. Planned while the tables were empty, "= ANY (keys)" and the joins
// on unnest() would take sequential scans forever after: a batch's cost
// would grow with the tables. They must take indexes whatever the tables
// held when they were planned (until the next ANALYZE, which autovacuum
// runs a minute or more later, the plans stand). auto_explain logs the
// plans the store's session runs.
func TestGroupPlansTakeIndexes(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	var db string
	if err := b.db.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	for _, set := range []string{"session_preload_libraries = 'auto_explain'",
		"auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on"} {
		if _, err := b.db.Exec(ctx, `ALTER DATABASE "`+db+`" SET `+set); err != nil {
			t.Fatal(err)
		}
	}
	s := newStore(t, b.url, durable.Config{GroupCommit: true, GroupBatches: 1, MaxConns: 1, MinConns: 1}) // one session: its plans
	decideBatch := func(slot, prefix string, n int) {
		ch := oneBatch(t, b, s, slot, payments(t, b, prefix, n))
		for range n {
			if a := <-ch; a.err != nil || a.r.Outcome != durable.Applied {
				t.Fatalf("%s: %+v %v", a.n.BizKey, a.r, a.err)
			}
		}
	}
	// Analysed while small, as autovacuum would after the first rows.
	if _, err := b.db.Exec(ctx, `ANALYZE biz_order; ANALYZE notify_claim; ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	decideBatch("P-SLOT", "P-A", 4) // planned now, on near-empty tables
	if _, err := b.db.Exec(ctx, `
INSERT INTO biz_order (order_no, status, amount, currency) SELECT 'Q' || g, 'PAID', 100, 'CNY' FROM generate_series(1, 20000) g;
INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json)
SELECT 'q:' || g, 'Q' || g, repeat('0', 64), 'DONE', '{}' FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(durabletest.Shared(t).Dir(), "postgres.log")
	from := fileSize(t, logPath)
	decideBatch("P-SLOT2", "P-B", 8)
	pids := map[string]bool{}
	rows, err := b.db.Query(ctx, `SELECT pid::text FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var pid string
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids["["+pid+"]"] = true
	}
	rows.Close()
	raw, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	// An entry starts with a timestamp and "[pid]"; a plan's lines follow
	// it, and the next entry of the same pid (CONTEXT) names the function
	// whose statement it was.
	type entry struct {
		pid   string
		lines []string
	}
	var entries []entry
	for _, line := range strings.Split(string(raw[from:]), "\n") {
		if f := strings.Fields(line); len(f) > 3 && strings.HasPrefix(f[3], "[") {
			entries = append(entries, entry{pid: f[3], lines: []string{line}})
		} else if len(entries) > 0 {
			entries[len(entries)-1].lines = append(entries[len(entries)-1].lines, line)
		}
	}
	plans, scans := 0, []string{}
	for i, e := range entries {
		if !pids[e.pid] || !strings.Contains(e.lines[0], "plan:") || i+1 == len(entries) {
			continue
		}
		next := entries[i+1]
		if next.pid != e.pid || !strings.Contains(next.lines[0], "CONTEXT:") {
			continue
		}
		// The innermost frame is the first function the context names.
		inner := ""
		for _, line := range next.lines {
			if j := strings.Index(line, "PL/pgSQL function "); j >= 0 {
				inner = line[j:]
				break
			}
		}
		if !strings.HasPrefix(inner, "PL/pgSQL function notifyedge_process_batch(") {
			continue // not a statement of the batch function itself
		}
		plans++
		for _, line := range e.lines {
			if strings.Contains(line, "Seq Scan on") {
				scans = append(scans, strings.TrimSpace(line))
			}
		}
	}
	if plans == 0 {
		t.Fatal("auto_explain logged no plan of the batch function's statements")
	}
	if len(scans) > 0 {
		t.Errorf("the batch took sequential scans:\n%s", strings.Join(scans, "\n"))
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// A batch decides its plain cells (a payment of a PENDING_PAY order, a
// close of an unpaid one) with its set statements: notifyedge_process runs
// only for the deliveries decided alone. Postgres counts the function's
// calls (track_functions), so this sees the batch's own vocabulary at
// work: an action name the batch no longer recognises would still decide
// right, through notifyedge_process, and only this count would tell.
func TestGroupPlainCellsTakeTheSetStatements(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	var db string
	if err := b.db.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET track_functions = 'pl'"); err != nil {
		t.Fatal(err)
	}
	url := b.url + "&application_name=plain-cells"
	if !strings.Contains(b.url, "?") {
		url = b.url + "?application_name=plain-cells"
	}
	s := newStore(t, url, durable.Config{GroupCommit: true, GroupBatches: 1, MaxConns: 24})
	notes := payments(t, b, "PC-PAY-", 4)
	for i := range 4 {
		o := fmt.Sprintf("PC-CLOSE-%02d", i)
		b.order(t, o, durable.PendingPay, 100, "CNY")
		notes = append(notes, note("T"+o, durable.PayClosed, o, 100, "CNY"))
	}
	answers := oneBatch(t, b, s, "PC-SLOT", notes)
	for range notes {
		if a := <-answers; a.err != nil || a.r.Outcome != durable.Applied {
			t.Fatalf("%s: %+v %v", a.n.BizKey, a.r, a.err)
		}
	}
	st := s.GroupStats()
	if st.Batches.Load() != 1 || st.Batched.Load() != uint64(len(notes)) {
		t.Fatalf("%d batches of %d deliveries, want one of %d", st.Batches.Load(), st.Batched.Load(), len(notes))
	}
	alone := st.Alone.Load()
	// A backend flushes its function counts as it exits, before it leaves
	// pg_stat_activity: close the store's sessions, wait for them to be
	// gone, then read once.
	s.Close()
	durabletest.WaitSessionsGone(t, b.db, "plain-cells%")
	var calls int64
	if err := b.db.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions
		WHERE funcname = 'notifyedge_process'`).Scan(&calls); err != nil {
		t.Fatal(err)
	}
	if calls != int64(alone) {
		t.Fatalf("notifyedge_process ran %d times for %d deliveries decided alone: the batch's plain cells went through it", calls, alone)
	}
}

// One batch at a time: behind a batch in flight, deliveries queue, alone
// or several, and the batch takes them all when it ends. Behind a lone
// delivery in flight, which may wait for a lock as long as its budget, a
// delivery takes the free slot at once.
func TestGroupOneBatchAtATime(t *testing.T) {
	b := setup(t)
	// No linger: every delivery below is answered before the next comes.
	s := newStore(t, b.url, durable.Config{GroupCommit: true, GroupBatches: 2, GroupLockTimeout: time.Minute, GroupLinger: -1, MaxConns: 24})
	ctx := context.Background()
	notes := payments(t, b, "L-", 4)
	stats := s.GroupStats()
	// Both slots held by lone deliveries waiting for their orders' locks:
	// the second took its slot at once.
	freeA, answerA := holdSlot(t, b, s, "L-SLOTA")
	freeB, answerB := holdSlot(t, b, s, "L-SLOTB")
	durabletest.WaitLockWaiters(t, b.db, 2, "%")
	// A batch of two queues behind them; one member's key waits for a claim
	// row another transaction inserted (the batch's lock_timeout is long).
	blocked := note("TLB", durable.PaySuccess, "L-BLOCKED", 100, "CNY")
	b.order(t, "L-BLOCKED", durable.PendingPay, 100, "CNY")
	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json)
		VALUES ($1, 'L-BLOCKED', $2, 'DONE', '{}')`, blocked.BizKey, blocked.Digest); err != nil {
		t.Fatal(err)
	}
	batch := submit(s, 2*time.Minute, blocked, notes[0])
	waitQueued(t, s, 2)
	freeA() // slot A's run takes the two: a batch that waits
	if a := <-answerA; a.err != nil || a.r.Outcome != durable.Applied {
		t.Fatalf("slot A's delivery: %+v %v", a.r, a.err)
	}
	durabletest.WaitLockWaiters(t, b.db, 2, "%") // slot B's, and the batch
	freeB()
	if a := <-answerB; a.err != nil || a.r.Outcome != durable.Applied {
		t.Fatalf("slot B's delivery: %+v %v", a.r, a.err)
	}
	// Slot B's run answers before it looks at the queue: a delivery
	// submitted in between would be its next batch, not a wait.
	waitInFlight(t, s, 1)
	batches := stats.Batches.Load()
	alone := stats.Alone.Load()
	// Behind the batch in flight, with a slot free: one waits, and so do two.
	later := submit(s, 2*time.Minute, notes[1])
	waitQueued(t, s, 1)
	later2 := submit(s, 2*time.Minute, notes[2])
	waitQueued(t, s, 2)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	applied(t, batch, batch, later, later2)
	if got := stats.Batches.Load() - batches; got != 2 {
		t.Errorf("%d batches, want 2: the one in flight, then the two that queued behind it", got)
	}
	if got := stats.Alone.Load() - alone; got != 0 {
		t.Errorf("%d deliveries decided alone behind the batch in flight, want none", got)
	}
	// With nothing in flight, a lone delivery goes at once, alone.
	alone = stats.Alone.Load()
	applied(t, submit(s, 20*time.Second, notes[3]))
	if got := stats.Alone.Load() - alone; got != 1 {
		t.Errorf("a delivery with nothing in flight: %d decided alone, want 1", got)
	}
}

// A batch that ends with nobody queued keeps its slot while its callers
// come back: as many deliveries as it decided are decided together, not
// the first of them alone. A batch of one never waits.
func TestGroupLingersForTheNextBatch(t *testing.T) {
	b := setup(t)
	s := newStore(t, b.url, durable.Config{GroupCommit: true, GroupBatches: 1, GroupLinger: time.Minute, MaxConns: 24})
	stats := s.GroupStats()
	notes := payments(t, b, "G-", 5)
	applied(t, submit(s, 2*time.Minute, notes[4]))
	waitLingering(t, s, false) // a lone delivery's run ends at once
	answers := oneBatch(t, b, s, "G-SLOT", notes[:2])
	applied(t, answers, answers)
	waitLingering(t, s, true)
	batches, alone := stats.Batches.Load(), stats.Alone.Load()
	// The first caller back queues; the second completes the batch.
	first := submit(s, 2*time.Minute, notes[2])
	waitQueued(t, s, 1)
	second := submit(s, 2*time.Minute, notes[3])
	applied(t, first, second)
	if got := stats.Batches.Load() - batches; got != 1 {
		t.Errorf("%d batches for the two that came back, want 1", got)
	}
	if got := stats.Alone.Load() - alone; got != 0 {
		t.Errorf("%d of the two that came back decided alone, want none", got)
	}
	waitLingering(t, s, true) // that batch of two lingers in turn
}

// A linger ends by its time: one caller back is decided alone then.
func TestGroupLingerEnds(t *testing.T) {
	b := setup(t)
	s := newStore(t, b.url, durable.Config{GroupCommit: true, GroupBatches: 1, GroupLinger: 20 * time.Millisecond, MaxConns: 24})
	notes := payments(t, b, "GE-", 3)
	answers := oneBatch(t, b, s, "GE-SLOT", notes[:2])
	applied(t, answers, answers)
	applied(t, submit(s, 2*time.Minute, notes[2]))
	waitLingering(t, s, false)
}

// waitInFlight waits until n runs hold a batch slot.
func waitInFlight(t *testing.T, s *durable.Store, n int) {
	t.Helper()
	wait.For(t, fmt.Sprintf("%d runs in flight", n), func() (bool, string) {
		_, inFlight := durable.GroupLingering(s)
		return inFlight == n, fmt.Sprintf("%d in flight", inFlight)
	})
}

// waitLingering waits until a batch that ended lingers (or, with want
// false, until no run holds a slot).
func waitLingering(t *testing.T, s *durable.Store, want bool) {
	t.Helper()
	wait.For(t, fmt.Sprintf("group lingering = %v", want), func() (bool, string) {
		lingering, inFlight := durable.GroupLingering(s)
		if want {
			return lingering, fmt.Sprintf("lingering %v, %d in flight", lingering, inFlight)
		}
		return !lingering && inFlight == 0, fmt.Sprintf("lingering %v, %d in flight", lingering, inFlight)
	})
}
