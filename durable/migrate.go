package durable

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// versionTable records the applied migration version.
const versionTable = "public.notifyedge_schema_version"

// migrationLock is the key of the session advisory lock tern's migrator
// holds while it migrates (its lockNum, unexported; a test checks tern
// waits for it).
const migrationLock = int64(9628173550095224)

// Migrate applies every pending migration to the database at url, then
// installs the SQL functions (durable/sql) unless they are installed
// already. It is safe to call from several nodes at once: the whole run
// holds the migration lock (a session advisory lock), and the others wait
// for it, then find nothing to do.
func Migrate(ctx context.Context, url string) error {
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("parse database url: %w", err)
	}
	return runMigrations(ctx, cc)
}

// runMigrations runs on a dedicated connection without the pool's short
// statement_timeout: waiting for another node's migration is not a hang.
func runMigrations(ctx context.Context, cc *pgx.ConnConfig) error {
	delete(cc.RuntimeParams, "statement_timeout")
	delete(cc.RuntimeParams, "lock_timeout")
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return fmt.Errorf("migrate: connect: %w", err)
	}
	// Closing the session releases the lock, whatever failed.
	defer conn.Close(context.WithoutCancel(ctx))
	// tern's own lock, taken first: tern takes it again (a session's
	// advisory locks nest) and releases its hold when its migrations are
	// done, while ours keeps the functions' installation inside the same
	// lock. Nodes of older builds, whose migrators take tern's lock only,
	// wait on it too.
	//
	// The wait polls pg_try_advisory_lock rather than blocking in
	// pg_advisory_lock: a migration that builds an index CONCURRENTLY
	// waits for every statement in progress, and a node blocked in
	// pg_advisory_lock is one, waiting in turn for the migration's lock: a
	// deadlock Postgres would break by failing that node's start.
	if err := lockMigrations(ctx, conn); err != nil {
		return err
	}
	m, err := migrate.NewMigrator(ctx, conn, versionTable)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic("BUG: embedded migrations: " + err.Error())
	}
	if err := m.LoadMigrations(sub); err != nil {
		return fmt.Errorf("migrate: load: %w", err)
	}
	if err := m.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if err := installCode(ctx, conn); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// lockMigrations takes the migration lock, trying every so often (50 ms,
// doubling to a second) until ctx ends.
func lockMigrations(ctx context.Context, conn *pgx.Conn) error {
	wait := 50 * time.Millisecond
	for {
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, migrationLock).Scan(&got); err != nil {
			return fmt.Errorf("migrate: lock: %w", err)
		}
		if got {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("migrate: waiting for another node's migration: %w", ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}
