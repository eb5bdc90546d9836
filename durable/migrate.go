package durable

import (
	"context"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// versionTable records the applied migration version.
const versionTable = "public.notifyedge_schema_version"

// Migrate applies every pending migration to the database at url. It is
// safe to call from several nodes at once: tern holds a session advisory
// lock on its own connection for the whole run, and the others wait.
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
	defer conn.Close(context.WithoutCancel(ctx))
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
	return nil
}
