package durable_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	durablesql "github.com/notifyedge/notifyedge/durable/sql"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// installedFunctions returns pg_get_functiondef of every notifyedge_*
// function of the database, by signature.
func (b *bundle) installedFunctions(t *testing.T) map[string]string {
	t.Helper()
	rows, err := b.db.Query(context.Background(), `SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
		FROM pg_proc p WHERE p.proname LIKE 'notifyedge\_%' AND p.pronamespace = to_regnamespace(current_schema())`)
	if err != nil {
		t.Fatal(err)
	}
	defs := map[string]string{}
	var sig, def string
	if _, err := pgx.ForEachRow(rows, []any{&sig, &def}, func() error {
		defs[sig] = def
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return defs
}

// codeNames are the functions durable/sql defines: one file each.
func codeNames(t *testing.T) []string {
	t.Helper()
	files, err := fs.Glob(durablesql.Files, "*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("durable/sql: %v, %d files", err, len(files))
	}
	for i, f := range files {
		files[i] = strings.TrimSuffix(f, ".sql")
	}
	return files
}

// checkOnePerFile fails unless the database holds each function of
// durable/sql exactly once (no overloads) and no other notifyedge_*
// function.
func (b *bundle) checkOnePerFile(t *testing.T, defs map[string]string) {
	t.Helper()
	var names []string
	for sig := range defs {
		names = append(names, sig[:strings.IndexByte(sig, '(')])
	}
	slices.Sort(names)
	if want := codeNames(t); !slices.Equal(names, want) {
		t.Errorf("notifyedge_* functions installed %v, want one each of %v", names, want)
	}
}

// After a fresh migrate, each function of durable/sql is installed once:
// no overload of an earlier signature is left.
func TestFunctionsInstalledOnce(t *testing.T) {
	b := &bundle{db: durabletest.Pool(t, durabletest.NewDatabase(t))}
	b.checkOnePerFile(t, b.installedFunctions(t))
}

// The functions as installed speak Go's vocabulary, and the canonical
// result they store is the bytes a replay answers with and ParseCanonical
// reads.
func TestInstalledFunctionsShareGosVocabulary(t *testing.T) {
	b := &bundle{db: durabletest.Pool(t, durabletest.NewDatabase(t))}
	defs := map[string]string{}
	for sig, def := range b.installedFunctions(t) {
		defs[sig[:strings.IndexByte(sig, '(')]] = def
	}
	durable.CheckVocabulary(t, defs)

	for _, o := range durable.Outcomes {
		if !o.Done() {
			continue
		}
		for _, s := range durable.States {
			var got []byte
			if err := b.db.QueryRow(context.Background(), `SELECT notifyedge_result($1, $2)`, o.String(), string(s)).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if want := canonical(o, s); string(got) != want {
				t.Errorf("notifyedge_result(%s, %s) = %s, want %s", o, s, got, want)
			}
			if r, err := durable.ParseCanonical(got); err != nil || r.Outcome != o || r.Status != s {
				t.Errorf("ParseCanonical(%s) = %+v, %v", got, r, err)
			}
		}
	}
}

// Migrate installs the functions again only when they are not what it
// installed last: a second Migrate leaves them as they are; a function
// replaced or dropped by hand is installed again.
func TestMigrateInstallsFunctionsWhenChanged(t *testing.T) {
	ctx := context.Background()
	url := durabletest.NewDatabase(t)
	b := &bundle{url: url, db: durabletest.Pool(t, url)}
	want := b.installedFunctions(t)
	versions := func() string { // the catalog rows' versions: a replace changes them
		t.Helper()
		var v string
		if err := b.db.QueryRow(ctx, `SELECT string_agg(p.xmin::text, ',' ORDER BY p.oid) FROM pg_proc p
			WHERE p.proname LIKE 'notifyedge\_%'`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := versions()
	if err := durable.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	if after := versions(); after != before {
		t.Errorf("an unchanged Migrate replaced functions: catalog rows %s, then %s", before, after)
	}

	b.exec(t, `CREATE OR REPLACE FUNCTION notifyedge_review(p_biz_key text, p_order_no text, p_reason text, p_hash text, p_raw_body text)
		RETURNS void LANGUAGE sql AS $$ SELECT $$`)
	b.exec(t, `DROP FUNCTION notifyedge_transition`)
	if err := durable.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	got := b.installedFunctions(t)
	for sig, def := range want {
		if got[sig] != def {
			t.Errorf("%s after Migrate:\n%s\nwant:\n%s", sig, got[sig], def)
		}
	}
	before = versions()
	if err := durable.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	if after := versions(); after != before {
		t.Errorf("Migrate after a reinstall replaced functions again: catalog rows %s, then %s", before, after)
	}
}

// Migrate installs the functions under tern's own migration lock: tern's
// migrator waits for the lock durable holds, so nodes of an older build,
// which take tern's lock only, wait for the installation too.
func TestMigrationLockIsTerns(t *testing.T) {
	ctx := context.Background()
	url := durabletest.NewDatabase(t)
	b := &bundle{url: url, db: durabletest.Pool(t, url)}
	holder, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, durable.MigrationLock); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			done <- err
			return
		}
		defer conn.Close(ctx)
		m, err := migrate.NewMigrator(ctx, conn, "public.notifyedge_schema_version")
		if err == nil {
			_, err = m.GetCurrentVersion(ctx)
		}
		done <- err
	}()
	wait.For(t, "tern's migrator waiting for the migration lock", func() (bool, string) {
		select {
		case err := <-done:
			t.Fatalf("tern's migrator did not wait for lock %d (err %v): its lock is another", durable.MigrationLock, err)
		default:
		}
		return b.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND ((classid::bigint << 32) | objid::bigint) = $1`, durable.MigrationLock) > 0, "not waiting yet"
	})
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, durable.MigrationLock); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("tern's migrator once the lock was free: %v", err)
	}
}

// A database a build at version 8 or 9 left (its migrations' functions,
// all of them, overloads included) upgrades to the functions of a fresh
// database, exactly: the old signatures replaced, the superseded ones
// dropped, nothing of the previous build left; and it decides.
func TestUpgradeInstallsTheFunctionsOfAFreshDatabase(t *testing.T) {
	ctx := context.Background()
	fresh := (&bundle{db: durabletest.Pool(t, durabletest.NewDatabase(t))}).installedFunctions(t)
	previous, err := os.ReadFile("testdata/functions_at_9.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, version := range []int32{8, 9} {
		t.Run(fmt.Sprint("from ", version), func(t *testing.T) {
			url := durabletestCreateEmpty(t)
			if err := durable.MigrateTo(ctx, url, version); err != nil {
				t.Fatal(err)
			}
			b := &bundle{url: url, db: durabletest.Pool(t, url)}
			b.exec(t, string(previous))
			if n := len(b.installedFunctions(t)); n != 10 {
				t.Fatalf("%d functions as the previous build left them, want 10", n)
			}
			b.order(t, "UP-1", durable.PendingPay, 1999, "CNY")
			if err := durable.Migrate(ctx, url); err != nil {
				t.Fatal(err)
			}
			got := b.installedFunctions(t)
			b.checkOnePerFile(t, got)
			for sig, def := range fresh {
				if got[sig] != def {
					t.Errorf("%s upgraded:\n%s\nfresh:\n%s", sig, got[sig], def)
				}
			}
			for sig, def := range got {
				if strings.Contains(def, "previous build") {
					t.Errorf("%s is the previous build's", sig)
				}
			}
			b.store = newStore(t, url, durable.Config{})
			if r := process(t, b.store, note("UP", durable.PaySuccess, "UP-1", 1999, "CNY")); r.Outcome != durable.Applied {
				t.Errorf("a payment after the upgrade: %+v", r)
			}
			if m, err := b.store.Transition(ctx, "UP-1", durable.Ship); err != nil || !m.Applied {
				t.Errorf("SHIP after the upgrade: %+v, %v", m, err)
			}
		})
	}
}
