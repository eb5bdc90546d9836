package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/durable/pgtemp"
)

// The retention rows' lock-wait check, end to end on a real server: with
// lockWaitSettings in force, a callback session that waits over 50 ms is
// found in the log, and told apart from another session's wait; after the
// reset, nothing is logged.
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
	// wait holds row 1 for 200 ms while a session named app updates it.
	wait := func(app string) {
		t.Helper()
		holder, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback(ctx)
		if _, err := holder.Exec(ctx, `UPDATE t SET id = 1 WHERE id = 1`); err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, url+"&application_name="+app)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		time.AfterFunc(200*time.Millisecond, func() { holder.Rollback(ctx) })
		if _, err := conn.Exec(ctx, `UPDATE t SET id = 1 WHERE id = 1`); err != nil {
			t.Fatal(err)
		}
	}
	wait(callbackApp)
	wait(callbackApp + "-retention")
	if err := e.serverSettings(ctx, lockWaitSettings, true); err != nil {
		t.Fatal(err)
	}
	wait(callbackApp) // not logged: deadlock_timeout is 1 s again
	// The server writes its log asynchronously to the waits.
	var callbacks, others []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if callbacks, others, err = lockWaits(logPath, from); err != nil {
			t.Fatal(err)
		}
		if len(callbacks)+len(others) >= 2 {
			break
		}
	}
	if len(callbacks) != 1 || len(others) != 1 || !strings.Contains(others[0], "notifyedge-retention") {
		t.Errorf("callback waits %q, other waits %q; want one each", callbacks, others)
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
	}, "\n") + "\n"
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	callbacks, others, err := lockWaits(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(callbacks) != 1 || !strings.Contains(callbacks[0], "[4624]") || !strings.Contains(callbacks[0], "notifyedge_process") {
		t.Errorf("callback waits %q, want pid 4624's with its statement", callbacks)
	}
	if len(others) != 2 || !strings.Contains(others[0], "pg_notify") || !strings.Contains(others[1], "notifyedge-retention") {
		t.Errorf("other waits %q, want the notifier's and retention's", others)
	}
}
