package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/notifyedge/notifyedge/durable/wait"
)

// A standby streams what the primary commits, refuses writes, and takes
// them once promoted, on a new timeline; Stop removes its directory.
func TestStandbyStreamsAndPromotes(t *testing.T) {
	ctx := context.Background()
	primary, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Stop() })
	standby, err := StartStandby(ctx, primary, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() })
	connect := func(c *Cluster) *pgx.Conn {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(ctx) })
		return conn
	}
	p, s := connect(primary), connect(standby)
	if _, err := p.Exec(ctx, `CREATE TABLE t AS SELECT 42 AS v`); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the primary's commit on the standby", func() (bool, string) {
		var v int
		err := s.QueryRow(ctx, `SELECT v FROM t`).Scan(&v)
		return err == nil && v == 42, fmt.Sprint(v, err)
	})
	if _, err := s.Exec(ctx, `INSERT INTO t VALUES (1)`); err == nil {
		t.Fatal("the standby took a write")
	}
	if err := primary.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Exec(ctx, `INSERT INTO t VALUES (1)`); err != nil {
		t.Fatalf("the promoted standby refused a write: %v", err)
	}
	var wal string
	if err := s.QueryRow(ctx, `SELECT pg_walfile_name(pg_current_wal_lsn())`).Scan(&wal); err != nil || wal[:8] != "00000002" {
		t.Errorf("WAL segment %q, %v: want timeline 2", wal, err)
	}
	s.Close(ctx)
	if err := standby.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(standby.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("standby dir still there: %v", err)
	}
}
