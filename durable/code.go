package durable

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"

	durablesql "github.com/notifyedge/notifyedge/durable/sql"
)

// codeFile is one file of durable/sql.
type codeFile struct {
	name, text string
}

// code is durable/sql's files in installation order, and their SHA-256.
var code, codeSHA256 = loadCode()

func loadCode() ([]codeFile, string) {
	names, err := fs.Glob(durablesql.Files, "*.sql") // sorted
	if err != nil || len(names) == 0 {
		panic(fmt.Sprintf("BUG: embedded SQL code: %v (%d files)", err, len(names)))
	}
	h := sha256.New()
	files := make([]codeFile, len(names))
	for i, name := range names {
		b, err := fs.ReadFile(durablesql.Files, name)
		if err != nil {
			panic("BUG: embedded SQL code: " + err.Error())
		}
		files[i] = codeFile{name: name, text: string(b)}
		fmt.Fprintf(h, "%s\x00%d\x00%s", name, len(b), b)
	}
	return files, hex.EncodeToString(h.Sum(nil))
}

// sqlInstalledCode fingerprints the notifyedge_* functions as the catalog
// holds them: a function replaced or dropped by hand, or one more
// overload, changes it.
const sqlInstalledCode = `SELECT coalesce(md5(string_agg(p.oid::regprocedure::text || E'\n' || pg_get_functiondef(p.oid),
                                    E'\n' ORDER BY p.oid::regprocedure::text)), '')
  FROM pg_proc p
 WHERE p.proname LIKE 'notifyedge\_%' AND p.pronamespace = to_regnamespace(current_schema())`

// installCode installs durable/sql's functions in one transaction, unless
// the database holds exactly what the same files installed last time. The
// caller holds the migration lock: no other node installs meanwhile.
func installCode(ctx context.Context, conn *pgx.Conn) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("install code: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var source, installed *string
	var current string
	err = tx.QueryRow(ctx, `SELECT (SELECT source_sha256 FROM notifyedge_code), (SELECT installed_md5 FROM notifyedge_code), (`+
		sqlInstalledCode+`)`).Scan(&source, &installed, &current)
	if err != nil {
		return fmt.Errorf("install code: %w", err)
	}
	if source != nil && *source == codeSHA256 && installed != nil && *installed == current {
		return nil
	}
	for _, f := range code {
		// No arguments: pgx sends the file as one simple query, all of
		// its statements.
		if _, err := tx.Exec(ctx, f.text); err != nil {
			return fmt.Errorf("install code: %s: %w", f.name, err)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO notifyedge_code (source_sha256, installed_md5) SELECT $1, (`+sqlInstalledCode+`)
ON CONFLICT (id) DO UPDATE SET source_sha256 = EXCLUDED.source_sha256, installed_md5 = EXCLUDED.installed_md5, installed_at = now()`,
		codeSHA256); err != nil {
		return fmt.Errorf("install code: record: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("install code: %w", err)
	}
	return nil
}
