package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/notifyedge/notifyedge/durable"
)

// Reading the Postgres server log: the lock waits it logged (and which
// session waited), the other events around a run, the relations named by
// oid, the server settings set for a run and reset after.

// lockWaitSettings make Postgres log every lock wait longer than 50 ms,
// with the waiting session's application_name and statement. They are set
// for these rows only (ALTER SYSTEM, reload), so the other rows run on the
// server as configured before.
var lockWaitSettings = [][2]string{
	{"log_lock_waits", "on"},
	{"deadlock_timeout", "50ms"},
	{"log_line_prefix", "%m [%p] %a "},
	{"log_min_error_statement", "log"},
	// What else may move the latency meanwhile: autovacuum (the deleted
	// rows are its work) and checkpoints.
	{"log_autovacuum_min_duration", "0"},
	{"log_checkpoints", "on"},
}

// logTime is the time of a log line written with log_line_prefix
// "%m [%p] %a ".
func logTime(line string) (time.Time, bool) {
	if len(line) < 27 {
		return time.Time{}, false
	}
	ts, err := time.Parse("2006-01-02 15:04:05.000 MST", line[:27])
	return ts, err == nil
}

// relationOID finds the "relation <oid>" of a lock-wait line.
var relationOID = regexp.MustCompile(`relation (\d+)`)

// nameRelations adds the relation's name to every "relation <oid>" of
// lines (the log names relations by oid only).
func (e *env) nameRelations(ctx context.Context, lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = relationOID.ReplaceAllStringFunc(l, func(m string) string {
			var name string
			oid := strings.TrimPrefix(m, "relation ")
			if err := e.db.QueryRow(ctx, `SELECT relname FROM pg_class WHERE oid = $1::oid`, oid).Scan(&name); err != nil {
				return m
			}
			return m + " (" + name + ")"
		})
	}
	return out
}

// serverSettings sets (or, with reset, resets) server settings by ALTER
// SYSTEM and reloads, then waits until a new session sees them.
func (e *env) serverSettings(ctx context.Context, settings [][2]string, reset bool) error {
	for _, s := range settings {
		q := fmt.Sprintf(`ALTER SYSTEM SET %s = '%s'`, s[0], s[1])
		if reset {
			q = `ALTER SYSTEM RESET ` + s[0]
		}
		if _, err := e.db.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	if _, err := e.db.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	want := "50ms"
	if reset {
		want = "1s"
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var v string
		if err := e.db.QueryRow(ctx, `SELECT current_setting('deadlock_timeout')`).Scan(&v); err != nil {
			return fmt.Errorf("read deadlock_timeout: %w", err)
		}
		if v == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("deadlock_timeout is %s 5 s after the reload, want %s", v, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// notifyLock is how the log names the lock a NOTIFY takes at commit: no
// callback's transaction notifies, so its waiter is the Store's
// out-of-band notifier, whose commit comes at the protocol's Sync and is
// logged with no STATEMENT line.
const notifyLock = "AccessExclusiveLock on object 0 of class 1262 of database 0"

// lockWaits reads the Postgres log from offset and returns its "still
// waiting for" lines (log_lock_waits), each with the STATEMENT line that
// follows it, split by whether the waiter is a callback: a session of a
// callback pool (application_name callbackApp, or edgeApplication for the
// bench's own edge, which log_line_prefix puts after the pid) other than
// the Store's out-of-band NOTIFY (pg_notify on its own statement after a
// callback committed, which no callback waits for, named by its statement
// or by the lock it waits for).
func lockWaits(path string, offset int64) (callbacks, others []string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, nil, fmt.Errorf("postgres log: %w", err)
	}
	type wait struct {
		line, pid, statement string
	}
	var waits []*wait
	open := map[string]*wait{} // by pid: a wait whose STATEMENT line may follow
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		pid := logPID(line)
		if strings.Contains(line, "still waiting for") {
			w := &wait{line: line, pid: pid}
			waits, open[pid] = append(waits, w), w
			continue
		}
		if w := open[pid]; w != nil {
			if _, stmt, ok := strings.Cut(line, "STATEMENT:"); ok {
				w.statement = strings.TrimSpace(stmt)
				delete(open, pid)
			}
		}
	}
	for _, w := range waits {
		entry := w.line
		if w.statement != "" {
			entry += " | STATEMENT: " + w.statement
		}
		if app := waitingApp(w.line); (app == callbackApp || app == edgeApplication) && !strings.HasPrefix(w.statement, "SELECT pg_notify(") && !strings.Contains(w.line, notifyLock) {
			callbacks = append(callbacks, entry)
		} else {
			others = append(others, entry)
		}
	}
	return callbacks, others, sc.Err()
}

// extensionLock is how the log names a wait for a table's extension lock,
// which every session that inserts into a full table takes in turn and
// retention's sessions, which only delete, never take.
const extensionLock = "on extension of relation"

// byExtension splits lock waits into those for a table's extension lock
// and the rest.
func byExtension(waits []string) (extending, rest []string) {
	for _, w := range waits {
		if strings.Contains(w, extensionLock) {
			extending = append(extending, w)
		} else {
			rest = append(rest, w)
		}
	}
	return extending, rest
}

// logPID is the "[pid]" of a log line written with log_line_prefix
// "%m [%p] %a ".
func logPID(line string) string {
	_, rest, ok := strings.Cut(line, "[")
	if !ok {
		return ""
	}
	pid, _, _ := strings.Cut(rest, "]")
	return pid
}

// waitingApp is the application_name of a log line written with
// log_line_prefix "%m [%p] %a ".
func waitingApp(line string) string {
	_, rest, ok := strings.Cut(line, "] ")
	if !ok {
		return ""
	}
	app, _, _ := strings.Cut(rest, " LOG:")
	return strings.TrimSpace(app)
}

// postgresEvents reads the Postgres log from offset for autovacuum runs
// of the tables retention deletes from and for checkpoints, each with its time from t0 (autovacuum logs when it
// ends, with its elapsed time on a line of its own, added here).
func postgresEvents(path string, offset int64, t0 time.Time) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("postgres log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, fmt.Errorf("postgres log: %w", err)
	}
	var out []string
	vacuum := -1 // the autovacuum event whose detail lines follow
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if vacuum >= 0 && strings.Contains(line, "elapsed:") {
			_, el, _ := strings.Cut(line, "elapsed:")
			out[vacuum] += ", elapsed" + el
			vacuum = -1
			continue
		}
		_, msg, ok := strings.Cut(line, "LOG:")
		if !ok {
			continue
		}
		msg = strings.TrimSpace(msg)
		ours := false // autovacuum of a table retention deletes from
		for _, t := range durable.RetentionTables {
			ours = ours || strings.Contains(msg, `.public.`+t+`"`)
		}
		if !(strings.HasPrefix(msg, "automatic vacuum") && ours) && !strings.HasPrefix(msg, "checkpoint") {
			continue
		}
		if i := strings.Index(msg, ":"); strings.HasPrefix(msg, "automatic") && i > 0 {
			msg = msg[:i] // the table; the figures follow on lines of their own
		}
		at := "?"
		if ts, ok := logTime(line); ok {
			at = fmt.Sprintf("%+.1fs", ts.Sub(t0).Seconds())
		}
		out = append(out, at+" "+msg)
		vacuum = -1
		if strings.HasPrefix(msg, "automatic vacuum") {
			vacuum = len(out) - 1
		}
	}
	return out, sc.Err()
}

func fileSize(path string) (int64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return 0, fmt.Errorf("postgres log: %w", err)
	}
	return st.Size(), nil
}
