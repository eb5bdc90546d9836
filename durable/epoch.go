package durable

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The cache epoch names the database the cache's done entries mirror:
// "<system identifier>-<timeline>-<counter>".
//
//   - The system identifier (pg_control_system) is fixed at initdb: another
//     cluster, or a logical dump restored into a fresh one, has another.
//   - The timeline is the one WAL is being written on, read from the name
//     of the current WAL segment: a promoted standby and the end of a
//     point-in-time recovery start a new one. pg_control_checkpoint()'s
//     timeline_id would not do: it follows the last checkpoint, and after
//     pg_promote (even with wait => true) the end-of-recovery checkpoint is
//     a spread one that can take minutes, during which the promoted server
//     already takes writes under the old timeline's number (seen on PG 15;
//     TestPromotedStandbyIsNotAnsweredFromTheCache in edge covers it).
//   - The counter is the operator's (cache_epoch, migration 0007), for what
//     changes neither: a manual repair of claims or orders, a restore from
//     a file-system snapshot. A bump never returns to a value used before,
//     even after a restore brought back an older counter (see
//     BumpCacheEpoch).
//
// All of it comes from the primary: on a standby pg_current_wal_lsn()
// fails, so CacheEpoch errs there rather than name a database that cannot
// take writes.
//
// Privileges: on PostgreSQL 15 the functions used (pg_control_system,
// pg_walfile_name, pg_current_wal_lsn) are executable by PUBLIC, so the
// service's role needs only SELECT, INSERT and UPDATE on cache_epoch (the
// migrating role owns it). An installation that revoked them from PUBLIC
// must grant EXECUTE on those three functions back to the service's role.
const (
	sqlEpochParts = `s.system_identifier::text
		|| '-' || ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
		|| '-' || e.counter`

	sqlCacheEpoch = `SELECT ` + sqlEpochParts + ` FROM pg_control_system() s, cache_epoch e`

	// The new counter is at least the old one plus one and at least the
	// current time in unix microseconds: a plain increment would, after a
	// restore brought back an older counter, hand out again an epoch the
	// cache already holds entries of (written against the database's lost
	// future). The upsert also puts back a row someone deleted.
	sqlBumpCacheEpoch = `WITH e AS (
		INSERT INTO cache_epoch AS c (counter)
		VALUES ((extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
		ON CONFLICT (id) DO UPDATE SET counter = GREATEST(c.counter + 1, EXCLUDED.counter)
		RETURNING counter)
	SELECT ` + sqlEpochParts + ` FROM pg_control_system() s, e`
)

// CacheEpoch returns the cache epoch of the database,
// "<system_identifier>-<timeline>-<counter>": the cache puts it in every
// key and empties its per-node table when it changes. It runs on the
// operator pool (one cheap statement) so that re-reading it never takes a
// callback's connection.
func (s *Store) CacheEpoch(ctx context.Context) (string, error) {
	var epoch string
	err := s.ops.QueryRow(ctx, sqlCacheEpoch).Scan(&epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", errors.New("cache epoch: the cache_epoch row is missing (POST /cache/epoch puts it back)")
	}
	if err != nil {
		return "", wrap(ctx, "cache epoch", err)
	}
	return epoch, nil
}

// BumpCacheEpoch moves the operator counter of the cache epoch on and
// returns the new epoch. Every node switches to it within about a second
// (the cache re-reads the epoch that often), after which no entry cached
// before the bump answers a duplicate: Postgres decides each key again.
// Bump after a manual repair of claims or orders, after a restore, and
// after restoring Redis from a backup.
func (s *Store) BumpCacheEpoch(ctx context.Context) (string, error) {
	var epoch string
	if err := s.ops.QueryRow(ctx, sqlBumpCacheEpoch).Scan(&epoch); err != nil {
		return "", wrap(ctx, "bump cache epoch", err)
	}
	return epoch, nil
}

// sqlCachePosition reads how far the primary has flushed its WAL, in bytes
// from the start: a commit was flushed before its answer went out, and
// neither a restart nor a crash's recovery ends short of what was flushed.
// Only a restore takes it back. On a standby it fails, as CacheEpoch does.
const sqlCachePosition = `SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::text`

// CachePosition returns how far the database has flushed its WAL
// (claimcache.Config.Position): a database found behind the claim cache's
// watermark, raised to its decisions' positions (Result.Position), was
// restored from a snapshot or a base backup. It runs on the operator pool.
func (s *Store) CachePosition(ctx context.Context) (uint64, error) {
	var text string
	if err := s.ops.QueryRow(ctx, sqlCachePosition).Scan(&text); err != nil {
		return 0, wrap(ctx, "cache position", err)
	}
	pos, err := strconv.ParseUint(text, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cache position %q: %w", text, err)
	}
	return pos, nil
}

// sqlBumpCacheEpochFrom moves the counter on as sqlBumpCacheEpoch does, but
// only while it is still $1: of several nodes that found the same reason
// at once, one bumps; the row lock makes the others re-check the counter
// and find it moved.
const sqlBumpCacheEpochFrom = `UPDATE cache_epoch AS c
	SET counter = GREATEST(c.counter + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
	WHERE c.counter = $1`

// BumpCacheEpochFrom bumps the counter if the database's epoch is still
// epoch, and returns the epoch after: the one it bumped to, or the one
// another node bumped to first. Every node that finds the same database
// behind the cache's watermark at the same time then moves to one new
// epoch, not one each.
func (s *Store) BumpCacheEpochFrom(ctx context.Context, epoch string) (string, error) {
	i := strings.LastIndexByte(epoch, '-')
	counter, err := strconv.ParseInt(epoch[i+1:], 10, 64)
	if i < 0 || err != nil {
		return "", fmt.Errorf("bump cache epoch: %q is not an epoch", epoch)
	}
	if _, err := s.ops.Exec(ctx, sqlBumpCacheEpochFrom, counter); err != nil {
		return "", wrap(ctx, "bump cache epoch", err)
	}
	return s.CacheEpoch(ctx)
}
