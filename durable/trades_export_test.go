package durable

import (
	"context"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

// This file is compiled into the test binary only: it hands the external
// tests what the trade tests need of durable's insides.

// SQLProcess returns the statement Process runs for event e (a test
// explains its replay path).
func SQLProcess(e Event) string { return processSQL[e] }

// MigrateTo migrates the database at url up or down to version target, as
// an older build left it (the upgrade test stops at 3, then migrates on).
func MigrateTo(ctx context.Context, url string, target int32) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("migrate to %d: connect: %w", target, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	m, err := migrate.NewMigrator(ctx, conn, versionTable)
	if err != nil {
		return fmt.Errorf("migrate to %d: %w", target, err)
	}
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return fmt.Errorf("migrate to %d: %w", target, err)
	}
	if err := m.LoadMigrations(sub); err != nil {
		return fmt.Errorf("migrate to %d: load: %w", target, err)
	}
	if err := m.MigrateTo(ctx, target); err != nil {
		return fmt.Errorf("migrate to %d: %w", target, err)
	}
	return nil
}
