// Package durabletest holds the test helpers over a throwaway PostgreSQL
// cluster (durable/pgtemp): one shared cluster per test binary (Main,
// Shared), and for each test a database of its own, cloned from a migrated
// template, so tests that commit stay isolated at the cost of one CREATE
// DATABASE. Invariants checks the money invariants by SQL.
package durabletest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
)

// shared is the one cluster of a test binary, started by the first test
// that needs it and stopped by Main.
var shared struct {
	once     sync.Once
	cluster  *pgtemp.Cluster
	err      error
	durable  bool
	template sync.Once
	tmplErr  error
	create   sync.Mutex // CREATE DATABASE ... TEMPLATE refuses concurrent use of a template
	seq      atomic.Int64
}

const templateDB = "notifyedge_template"

// Main runs the tests of a package and removes the shared throwaway
// cluster afterwards, if a test started one. Call it from TestMain:
//
//	func TestMain(m *testing.M) { durabletest.Main(m) }
//
// When benchmarks are selected (-test.bench) the cluster runs with fsync
// and synchronous_commit on. Fuzz workers and tests that need no database
// never start one.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	shared.durable = flag.Lookup("test.bench").Value.String() != ""
	code := m.Run()
	if shared.cluster != nil {
		if err := shared.cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "durabletest:", err)
		}
	}
	return code
}

// Shared returns the test binary's cluster, starting it on first use.
func Shared(t testing.TB) *pgtemp.Cluster {
	t.Helper()
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		shared.cluster, shared.err = pgtemp.Start(ctx, pgtemp.Options{TCP: true, Durable: shared.durable})
	})
	if shared.err != nil {
		t.Fatalf("durabletest: %v", shared.err)
	}
	return shared.cluster
}

// NewDatabase creates a database of the test's own, migrated (cloned from a
// template migrated once per binary), drops it when the test ends, and
// returns its unix-socket URL.
func NewDatabase(t testing.TB) string {
	t.Helper()
	name := CreateDatabase(t, true)
	return Shared(t).URL(name)
}

// CreateDatabase creates a database of the test's own, migrated or empty,
// drops it when the test ends, and returns its name.
func CreateDatabase(t testing.TB, migrated bool) string {
	t.Helper()
	c := Shared(t)
	ctx := context.Background()
	template := "template0"
	if migrated {
		shared.template.Do(func() { shared.tmplErr = makeTemplate(ctx, c) })
		if shared.tmplErr != nil {
			t.Fatalf("durabletest: template: %v", shared.tmplErr)
		}
		template = templateDB
	}
	name := fmt.Sprintf("t%d_%d", os.Getpid(), shared.seq.Add(1))
	shared.create.Lock()
	err := adminExec(ctx, c, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s STRATEGY FILE_COPY", name, template))
	shared.create.Unlock()
	if err != nil {
		t.Fatalf("durabletest: %v", err)
	}
	t.Cleanup(func() {
		if err := adminExec(ctx, c, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("durabletest: %v", err)
		}
	})
	return name
}

func makeTemplate(ctx context.Context, c *pgtemp.Cluster) error {
	if err := adminExec(ctx, c, "CREATE DATABASE "+templateDB); err != nil {
		return err
	}
	return durable.Migrate(ctx, c.URL(templateDB))
}

func adminExec(ctx context.Context, c *pgtemp.Cluster, sql string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

// LockOrder holds the order's row lock in an open transaction on db until
// the returned release is called (or the test ends): a test's way to make
// a delivery wait where another writer would.
func LockOrder(t testing.TB, db *pgxpool.Pool, orderNo string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM biz_order WHERE order_no = $1 FOR UPDATE`, orderNo); err != nil {
		t.Fatal(err)
	}
	release = func() { _ = tx.Rollback(ctx) } // a second rollback is a no-op
	t.Cleanup(release)
	return release
}

// GroupCommitEnv names the environment variable that picks the mode of
// the Stores tests open: "0" decides every delivery alone, anything else
// (or unset) uses group commit, the production default. make test runs
// the decision tables in both modes.
const GroupCommitEnv = "NOTIFYEDGE_TEST_GROUP_COMMIT"

// GroupCommit reports the mode tests open Stores in (GroupCommitEnv).
func GroupCommit() bool { return os.Getenv(GroupCommitEnv) != "0" }

// Pool opens a pool on url for a test's own statements, closed when the
// test ends.
func Pool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// WaitCancelled waits until no session of db's database but db's own still
// runs a delivery. Process returns at its deadline and the cancel pgx sent
// reaches the server a moment later: what a test then checks is what the
// cancelled transaction left.
func WaitCancelled(t testing.TB, db *pgxpool.Pool) {
	t.Helper()
	waitCount(t, db, 30*time.Second, "deliveries still running after their deadline", func(n int) bool { return n == 0 },
		`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND state = 'active' AND query LIKE '%notifyedge_process%' AND pid <> pg_backend_pid()`)
}

// WaitSessionsGone waits until no session of db's server whose
// application_name matches like (SQL LIKE) remains: a closed pool's
// backends end asynchronously, and what they report at exit (function
// and table statistics) is there only once they have.
func WaitSessionsGone(t testing.TB, db *pgxpool.Pool, like string) {
	t.Helper()
	waitCount(t, db, 30*time.Second, fmt.Sprintf("sessions named like %q", like), func(n int) bool { return n == 0 },
		`SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1`, like)
}

// WaitLockWaiters waits until at least n sessions of db's database wait
// for a lock while running a query that matches like (SQL LIKE; "%" for
// any): a test's way to know a request reached the row another transaction
// holds.
func WaitLockWaiters(t testing.TB, db *pgxpool.Pool, n int, like string) {
	t.Helper()
	waitCount(t, db, 30*time.Second, fmt.Sprintf("sessions waiting for a lock running %q (want %d)", like, n), func(got int) bool { return got >= n },
		`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1`, like)
}

// waitCount polls a count(*) query until done accepts its value, and fails
// the test with the last count after within (generous enough for a loaded
// machine).
func waitCount(t testing.TB, db *pgxpool.Pool, within time.Duration, what string, done func(int) bool, query string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var got int
		if err := db.QueryRow(context.Background(), query, args...).Scan(&got); err != nil {
			t.Fatalf("count %s: %v", what, err)
		}
		if done(got) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d %s after %v", got, what, within)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
