package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// The retention rows' lock-wait check, end to end on a real server: with
// lockWaitSettings in force, a callback session that waits over 50 ms is
// found in the log, and told apart from another session's wait; after the
// reset, a wait shorter than deadlock_timeout (1 s again) is not logged.
func TestLockWaitsFound(t *testing.T) {
	ctx := context.Background()
	c, err := pgtemp.Start(ctx, pgtemp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	url := c.URL("postgres")
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	e := &env{db: db}
	logPath := filepath.Join(c.Dir(), "postgres.log")
	from, err := fileSize(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.serverSettings(ctx, lockWaitSettings, false); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	// loggedWaits returns the log's lock waits of session pid, callbacks'
	// and others', and all of them for a failure message.
	loggedWaits := func(pid uint32) (callbacks, others []string, all string) {
		t.Helper()
		cbs, oth, err := lockWaits(logPath, from)
		if err != nil {
			t.Fatal(err)
		}
		tag := fmt.Sprintf("[%d]", pid)
		for _, w := range cbs {
			if strings.Contains(w, tag) {
				callbacks = append(callbacks, w)
			}
		}
		for _, w := range oth {
			if strings.Contains(w, tag) {
				others = append(others, w)
			}
		}
		return callbacks, others, fmt.Sprintf("callback waits %q, other waits %q", cbs, oth)
	}
	// wait makes a new session named app wait for row 1, which a
	// transaction of this goroutine holds: until the server has logged the
	// wait (logged), or for 200 ms. It returns the session's pid and how
	// long its UPDATE took, an upper bound of its wait. The holding
	// transaction is this goroutine's alone (pgx's are not safe for
	// concurrent use): the waiting session's goroutine only waits.
	wait := func(app string, logged bool) (pid uint32, took time.Duration) {
		t.Helper()
		const update = `UPDATE t SET id = 1 WHERE id = 1`
		holder, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback(ctx) // a no-op once rolled back below
		if _, err := holder.Exec(ctx, update); err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, url+"&application_name="+app)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		pid = conn.PgConn().PID()
		var waitErr error
		waited := make(chan struct{})
		start := time.Now()
		go func() {
			defer close(waited)
			_, waitErr = conn.Exec(ctx, update)
			took = time.Since(start)
		}()
		// Whatever fails below, the waiter is released and done with conn
		// before conn is closed.
		defer func() { holder.Rollback(ctx); <-waited }()
		wait.For(t, app+" session waiting for the row lock", func() (bool, string) {
			var event string
			err := db.QueryRow(ctx, `SELECT coalesce(wait_event_type || ':' || wait_event, 'not waiting')
				FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&event)
			return err == nil && strings.HasPrefix(event, "Lock:"), fmt.Sprint(event, err)
		})
		if logged {
			wait.For(t, app+"'s lock wait in the log", func() (bool, string) {
				callbacks, others, all := loggedWaits(pid)
				return len(callbacks)+len(others) > 0, all
			})
		} else {
			time.Sleep(200 * time.Millisecond) // a wait over the 50 ms logged before the reset
		}
		if err := holder.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		<-waited
		if waitErr != nil {
			t.Fatal(waitErr)
		}
		return pid, took
	}
	callback, _ := wait(callbackApp, true)
	retention, _ := wait(callbackApp+"-retention", true)
	if err := e.serverSettings(ctx, lockWaitSettings, true); err != nil {
		t.Fatal(err)
	}
	// Not logged: deadlock_timeout is 1 s again. A wait that a loaded
	// machine stretched to a second may be, and tells nothing: another
	// session waits then.
	var short uint32
	for attempt := 1; short == 0; attempt++ {
		pid, took := wait(callbackApp, false)
		if took < time.Second {
			short = pid
		} else if attempt == 5 {
			t.Fatalf("5 waits of 200 ms each took a second or more (the last %v)", took)
		}
	}

	// The waiting backend logs a wait before it gets the lock, so before
	// its UPDATE returns: the log is complete for each of them.
	if cbs, oth, all := loggedWaits(callback); len(cbs) != 1 || len(oth) != 0 {
		t.Errorf("the callback session's wait: callback waits %q, other waits %q; want one callback wait (%s)", cbs, oth, all)
	}
	if cbs, oth, all := loggedWaits(retention); len(cbs) != 0 || len(oth) != 1 || !strings.Contains(oth[0], "notifyedge-retention") {
		t.Errorf("the retention session's wait: callback waits %q, other waits %q; want one other wait, retention's (%s)", cbs, oth, all)
	}
	if cbs, oth, all := loggedWaits(short); len(cbs)+len(oth) != 0 {
		t.Errorf("a wait under deadlock_timeout after the reset was logged (%s)", all)
	}
}

func TestWaitingApp(t *testing.T) {
	for line, want := range map[string]string{
		"2026-12-03 09:02:06.123 UTC [4242] notifyedge LOG:  process 4242 still waiting for ShareLock on transaction 7 after 50.1 ms": "notifyedge",
		"2026-12-03 09:02:06.123 UTC [4242] notifyedge-retention LOG:  process 4242 still waiting for":                                "notifyedge-retention",
		"2026-12-03 09:02:06.123 UTC [4242]  LOG:  process 4242 still waiting for":                                                    "",
	} {
		if got := waitingApp(line); got != want {
			t.Errorf("waitingApp(%q) = %q, want %q", line, got, want)
		}
	}
}

// The Store's out-of-band NOTIFY runs on a callback pool, but no callback
// waits for it: its waits are not a callback's.
func TestLockWaitsClassified(t *testing.T) {
	path := filepath.Join(t.TempDir(), "postgres.log")
	log := strings.Join([]string{
		"2026-12-03 09:00:00.000 UTC [1] notifyedge LOG:  checkpoint starting: time",
		"2026-12-03 09:03:19.155 UTC [4623] notifyedge LOG:  process 4623 still waiting for AccessExclusiveLock on object 0 of class 1262 of database 0 after 51.516 ms",
		"2026-12-03 09:03:19.155 UTC [4623] notifyedge DETAIL:  Process holding the lock: 4700. Wait queue: 4623.",
		"2026-12-03 09:03:19.156 UTC [4624] notifyedge LOG:  process 4624 still waiting for ShareLock on transaction 9 after 50.2 ms",
		"2026-12-03 09:03:19.155 UTC [4623] notifyedge STATEMENT:  SELECT pg_notify($1, '')",
		"2026-12-03 09:03:19.156 UTC [4624] notifyedge STATEMENT:  WITH c AS MATERIALIZED (SELECT payload_hash FROM notify_claim) SELECT notifyedge_process($1)",
		"2026-12-03 09:03:19.157 UTC [4625] notifyedge-retention LOG:  process 4625 still waiting for RowExclusiveLock on relation 16384 of database 5 after 50.0 ms",
		// The notifier's commit at the protocol's Sync: no STATEMENT line.
		"2026-12-03 09:03:20.001 UTC [4626] notifyedge LOG:  process 4626 still waiting for AccessExclusiveLock on object 0 of class 1262 of database 0 after 61.9 ms",
		// The bench's own edge names its sessions apart; they are callbacks.
		"2026-12-03 09:03:21.000 UTC [4627] notifyedge-bench-edge LOG:  process 4627 still waiting for ExclusiveLock on extension of relation 16409 of database 5 after 58.2 ms",
		"2026-12-03 09:03:21.001 UTC [4628] notifyedge-bench-edge LOG:  process 4628 still waiting for ShareLock on transaction 11 after 50.3 ms",
	}, "\n") + "\n"
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	callbacks, others, err := lockWaits(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(callbacks) != 3 || !strings.Contains(callbacks[0], "[4624]") || !strings.Contains(callbacks[0], "notifyedge_process") ||
		!strings.Contains(callbacks[1], "[4627]") || !strings.Contains(callbacks[2], "[4628]") {
		t.Errorf("callback waits %q, want pid 4624's with its statement, then the bench edge's 4627 and 4628", callbacks)
	}
	// A wait to extend a table is one retention never causes: it is told
	// apart from the waits for a lock retention's deletes may hold.
	extending, held := byExtension(callbacks)
	if len(extending) != 1 || !strings.Contains(extending[0], "[4627]") || len(held) != 2 || !strings.Contains(held[1], "[4628]") {
		t.Errorf("byExtension: extending %q, the rest %q; want 4627's, then 4624's and 4628's", extending, held)
	}
	if len(others) != 3 || !strings.Contains(others[0], "pg_notify") || !strings.Contains(others[1], "notifyedge-retention") || !strings.Contains(others[2], "[4626]") {
		t.Errorf("other waits %q, want the notifier's (with and without its statement) and retention's", others)
	}
}

// A request counts for the turn it was sent in: with retention, without,
// or after the alternating turns, where it counts for neither.
func TestTurnLatencies(t *testing.T) {
	r := &retentionRun{turns: 2, marks: []turnMark{{0, true}, {10 * time.Second, false}, {20 * time.Second, true}}}
	points := []Point{
		{At: time.Second, Latency: 1 * time.Millisecond},
		{At: 9 * time.Second, Latency: 2 * time.Millisecond},
		{At: 10 * time.Second, Latency: 3 * time.Millisecond},
		{At: 19 * time.Second, Latency: 4 * time.Millisecond},
		{At: 20 * time.Second, Latency: 5 * time.Millisecond},
		{At: 90 * time.Second, Latency: 6 * time.Millisecond},
	}
	on, off := r.turnLatencies(points)
	if want := []time.Duration{time.Millisecond, 2 * time.Millisecond}; !slices.Equal(on, want) {
		t.Errorf("with retention: %v, want %v", on, want)
	}
	if want := []time.Duration{3 * time.Millisecond, 4 * time.Millisecond}; !slices.Equal(off, want) {
		t.Errorf("without: %v, want %v", off, want)
	}
	if got := r.offBefore(15 * time.Second); got != 5*time.Second {
		t.Errorf("off in the first 15 s: %v, want 5s", got)
	}
	if got := r.offBefore(time.Hour); got != 10*time.Second {
		t.Errorf("off in the first hour: %v, want 10s", got)
	}
	// An attack begun 2 s after the loop: its 9 s are the loop's 11 s.
	r.start = time.Now()
	r.attackAt = r.start.Add(2 * time.Second)
	on, off = r.turnLatencies(points)
	if want := []time.Duration{time.Millisecond}; !slices.Equal(on, want) {
		t.Errorf("an attack 2 s late, with retention: %v, want %v", on, want)
	}
	if want := []time.Duration{2 * time.Millisecond, 3 * time.Millisecond}; !slices.Equal(off, want) {
		t.Errorf("an attack 2 s late, without: %v, want %v", off, want)
	}
	if got, want := r.turnStarts(), []float64{-2, 8}; !slices.Equal(got, want) {
		t.Errorf("the turns' starts from an attack 2 s late: %v, want %v", got, want)
	}
}
