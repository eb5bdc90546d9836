package durable

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// ExplainRetentionBatch returns the plan (EXPLAIN's text, as a custom or
// as a generic plan) of one retention batch of table with the default
// retentions, on a session configured as the retention leader's; it
// deletes nothing.
func ExplainRetentionBatch(ctx context.Context, s *Store, table string, generic bool) (string, error) {
	for _, t := range retentionPlan {
		if t.name != table {
			continue
		}
		conn, err := pgx.ConnectConfig(ctx, s.retentionConnConfig(RetentionConfig{}.mustDefaults()))
		if err != nil {
			return "", err
		}
		defer conn.Close(ctx)
		var plan string
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var err error
			if generic {
				// A named prepared statement, planned generically.
				if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
					return err
				}
				types, from := "timestamptz, timestamptz, int", "'-infinity'"
				if t.byID {
					types, from = "timestamptz, bigint, int", "0"
				}
				if _, err := tx.Exec(ctx, "PREPARE retention_batch ("+types+") AS "+t.batch); err != nil {
					return err
				}
				defer tx.Exec(ctx, "DEALLOCATE retention_batch")
				plan, err = explain(ctx, tx, "EXECUTE retention_batch (now(), "+from+", 1000)")
				return err
			}
			var from any = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
			if t.byID {
				from = int64(0)
			}
			plan, err = explain(ctx, tx, t.batch, time.Now().Add(-t.keep(RetentionConfig{}.mustDefaults())), from, 1000)
			return err
		})
		return plan, err
	}
	return "", fmt.Errorf("no retention table %q", table)
}

func (c RetentionConfig) mustDefaults() RetentionConfig {
	c, err := c.withDefaults()
	if err != nil {
		panic(err)
	}
	return c
}

// ExplainOldestRowAges returns the plan (EXPLAIN's text) of OldestRowAges's
// query as it runs.
func ExplainOldestRowAges(ctx context.Context, s *Store) (string, error) {
	var plan string
	err := pgx.BeginTxFunc(ctx, s.ops, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlIndexOrderOnly); err != nil {
			return err
		}
		var err error
		plan, err = explain(ctx, tx, sqlOldestRowAges)
		return err
	})
	return plan, err
}

func explain(ctx context.Context, tx pgx.Tx, sql string, args ...any) (string, error) {
	rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
	if err != nil {
		return "", err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return strings.Join(lines, "\n"), err
}

// RetentionSetting reads a setting in a session configured as the
// retention leader's.
func RetentionSetting(ctx context.Context, s *Store, name string) (string, error) {
	conn, err := pgx.ConnectConfig(ctx, s.retentionConnConfig(RetentionConfig{}.mustDefaults()))
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var v string
	err = conn.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v)
	return v, err
}

// RetentionBatchConn opens a session configured as the retention leader's
// and returns it with table's batch statement ($1 cutoff, $2 where the
// previous batch stopped, $3 Batch) as the leader runs it.
func RetentionBatchConn(ctx context.Context, s *Store, table string) (*pgx.Conn, string, error) {
	for _, t := range retentionPlan {
		if t.name == table {
			conn, err := pgx.ConnectConfig(ctx, s.retentionConnConfig(RetentionConfig{}.mustDefaults()))
			return conn, t.batch, err
		}
	}
	return nil, "", fmt.Errorf("no retention table %q", table)
}

// CheckpointWALRate reads the server's checkpoint WAL rate, in bytes a
// second, as a retention cycle does at its start.
func CheckpointWALRate(ctx context.Context, s *Store) (float64, error) {
	_, rate, err := readCycleStart(ctx, s.pool)
	return rate, err
}

// WithRetentionClock returns cfg with its batches scheduled by now (nil:
// the wall clock) and the waits between them made by sleep instead of
// wait.Sleep.
func WithRetentionClock(cfg RetentionConfig, now func() time.Time, sleep func(context.Context, time.Duration) bool) RetentionConfig {
	cfg.now, cfg.sleep = now, sleep
	return cfg
}

// RetentionRefresh and RetentionCycleMax are how old a walk's cutoff may
// be when it ends, and how long a cycle moves its cutoffs on.
const (
	RetentionRefresh  = retentionRefresh
	RetentionCycleMax = retentionCycleMax
)
