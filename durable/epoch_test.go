package durable_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// epochParts splits "<system_identifier>-<timeline>-<counter>".
func epochParts(t *testing.T, epoch string) (sysid string, timeline, counter int64) {
	t.Helper()
	p := strings.Split(epoch, "-")
	if len(p) != 3 {
		t.Fatalf("epoch %q: want <system_identifier>-<timeline>-<counter>", epoch)
	}
	var err1, err2 error
	timeline, err1 = strconv.ParseInt(p[1], 10, 64)
	counter, err2 = strconv.ParseInt(p[2], 10, 64)
	if _, err := strconv.ParseUint(p[0], 10, 64); err != nil || err1 != nil || err2 != nil {
		t.Fatalf("epoch %q: not three decimal numbers", epoch)
	}
	return p[0], timeline, counter
}

// The epoch names the cluster (its system identifier), the timeline WAL is
// written on and the operator counter; a bump moves the counter only, and
// never back to a value used before, even after a restore brought back an
// older counter.
func TestCacheEpoch(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	e0, err := b.store.CacheEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sysid, tl, counter := epochParts(t, e0)
	var wantSysid string
	var checkpointTL int64
	if err := b.db.QueryRow(ctx, `SELECT system_identifier::text, (SELECT timeline_id FROM pg_control_checkpoint()) FROM pg_control_system()`).Scan(&wantSysid, &checkpointTL); err != nil {
		t.Fatal(err)
	}
	if sysid != wantSysid || tl != checkpointTL || counter != 0 {
		t.Fatalf("epoch %s: want system identifier %s, timeline %d (never promoted), counter 0", e0, wantSysid, checkpointTL)
	}
	if again, err := b.store.CacheEpoch(ctx); err != nil || again != e0 {
		t.Fatalf("read again: %q, %v; want %q", again, err, e0)
	}

	before := time.Now().UnixMicro()
	e1, err := b.store.BumpCacheEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s1, tl1, c1 := epochParts(t, e1)
	if s1 != sysid || tl1 != tl || c1 < before {
		t.Fatalf("bumped %s from %s: want the same system identifier and timeline, a counter of at least %d (now)", e1, e0, before)
	}
	if read, err := b.store.CacheEpoch(ctx); err != nil || read != e1 {
		t.Fatalf("after the bump CacheEpoch = %q, %v; want %q", read, err, e1)
	}
	e2, err := b.store.BumpCacheEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, c2 := epochParts(t, e2); c2 <= c1 {
		t.Fatalf("second bump %s: counter not above %d", e2, c1)
	}

	// A restore brings an older counter back; the bump after it must not
	// reuse e1 or e2, whose entries may still be in Redis.
	if _, err := b.db.Exec(ctx, `UPDATE cache_epoch SET counter = 0`); err != nil {
		t.Fatal(err)
	}
	e3, err := b.store.BumpCacheEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if e3 == e0 || e3 == e1 || e3 == e2 {
		t.Fatalf("the bump after a restore reused an epoch: %s (used: %s %s %s)", e3, e0, e1, e2)
	}
	_, _, c2 := epochParts(t, e2)
	if _, _, c3 := epochParts(t, e3); c3 <= c2 {
		t.Fatalf("the bump after a restore: counter %d not above every earlier one (%d)", c3, c2)
	}

	// Without its row the epoch is an error (the cache keeps the last one),
	// and a bump puts the row back.
	if _, err := b.db.Exec(ctx, `DELETE FROM cache_epoch`); err != nil {
		t.Fatal(err)
	}
	if e, err := b.store.CacheEpoch(ctx); err == nil {
		t.Fatalf("CacheEpoch without its row = %q, want an error", e)
	}
	e4, err := b.store.BumpCacheEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if read, err := b.store.CacheEpoch(ctx); err != nil || read != e4 {
		t.Fatalf("after the bump that put the row back: %q, %v; want %q", read, err, e4)
	}
	if _, err := b.db.Exec(ctx, `INSERT INTO cache_epoch (id) VALUES (false)`); err == nil {
		t.Fatal("a second cache_epoch row was accepted")
	}
}

// The service's role needs no superuser and no pg_monitor: SELECT, INSERT
// and UPDATE on cache_epoch are enough (PostgreSQL grants the functions the
// epoch reads to PUBLIC).
func TestCacheEpochAsPlainRole(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	role := fmt.Sprintf("ne_epoch_%d", os.Getpid())
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN NOSUPERUSER NOINHERIT`,
		`GRANT SELECT, INSERT, UPDATE ON cache_epoch TO ` + role,
	} {
		if _, err := b.db.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		for _, q := range []string{`REVOKE ALL ON cache_epoch FROM ` + role, `DROP ROLE ` + role} {
			if _, err := b.db.Exec(context.Background(), q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	url := strings.Replace(b.url, "postgres://postgres@", "postgres://"+role+"@", 1)
	if url == b.url {
		t.Fatalf("cannot set the user in %s", b.url)
	}
	s := newStore(t, url, durable.Config{NoMigrate: true, MaxConns: 1})
	e, err := s.CacheEpoch(ctx)
	if err != nil {
		t.Fatalf("CacheEpoch as a plain role: %v", err)
	}
	want, _ := b.store.CacheEpoch(ctx)
	if e != want {
		t.Fatalf("as a plain role %q, as the owner %q", e, want)
	}
	if _, err := s.BumpCacheEpoch(ctx); err != nil {
		t.Fatalf("BumpCacheEpoch as a plain role: %v", err)
	}
}

// A decision returns the WAL position past its writes (Result.Position),
// a replay one past the claim it read; the flushed position the watermark
// is checked against reaches it once the commit is flushed (at once with
// synchronous_commit on; this cluster runs with it off).
func TestCachePosition(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	p0, err := b.store.CachePosition(ctx)
	if err != nil || p0 == 0 {
		t.Fatalf("CachePosition = %d, %v", p0, err)
	}
	b.order(t, "O-pos", durable.PendingPay, 100, "CNY")
	n := note("T-pos", durable.PaySuccess, "O-pos", 100, "CNY")
	res, err := b.store.Process(ctx, n)
	if err != nil || res.Outcome != durable.Applied || res.Position <= p0 {
		t.Fatalf("applied: %+v, %v; want a position past %d", res, err, p0)
	}
	wait.For(t, "the flushed position at the decision's", func() (bool, string) {
		p, err := b.store.CachePosition(ctx)
		return err == nil && p >= res.Position, fmt.Sprint(p, err)
	})
	replay, err := b.store.Process(ctx, n)
	if err != nil || !replay.Replayed || replay.Position < res.Position {
		t.Errorf("replay: %+v, %v; want a position at least the decision's %d", replay, err, res.Position)
	}
}

// A replay writes nothing, so nothing it answers makes the database flush:
// its position must not pass the flushed one, even while another
// transaction's records sit in the WAL unflushed, or the watermark it
// raises finds the database behind it at the next check (a new epoch for
// nothing, again and again while duplicates reach Postgres).
func TestReplayPositionIsFlushed(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.order(t, "O-rpos", durable.PendingPay, 100, "CNY")
	n := note("T-rpos", durable.PaySuccess, "O-rpos", 100, "CNY")
	res, err := b.store.Process(ctx, n)
	if err != nil || res.Outcome != durable.Applied {
		t.Fatalf("applied: %+v, %v", res, err)
	}
	wait.For(t, "the flushed position at the decision's", func() (bool, string) {
		p, err := b.store.CachePosition(ctx)
		return err == nil && p >= res.Position, fmt.Sprint(p, err)
	})
	// Records in the WAL that no commit has flushed.
	open, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	if _, err := open.Exec(ctx, `CREATE TABLE unflushed AS SELECT g FROM generate_series(1, 100) g`); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		replay, err := b.store.Process(ctx, n)
		if err != nil || !replay.Replayed {
			t.Fatalf("replay: %+v, %v", replay, err)
		}
		flushed, err := b.store.CachePosition(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if replay.Position > flushed || replay.Position < res.Position {
			t.Fatalf("replay position %x, flushed %x, decision %x: want decision <= replay <= flushed", replay.Position, flushed, res.Position)
		}
	}
}

// Several nodes that find the same database behind the watermark at once
// move it to one new epoch: the counter moves once, and each gets the new
// epoch. An epoch that is no longer the database's moves nothing.
func TestBumpCacheEpochFrom(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	e0, err := b.store.CacheEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Each update of the counter row leaves a row here.
	for _, q := range []string{`CREATE TABLE bumps (at timestamptz DEFAULT clock_timestamp())`,
		`CREATE FUNCTION count_bump() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO bumps DEFAULT VALUES; RETURN NEW; END $$`,
		`CREATE TRIGGER count_bump AFTER UPDATE ON cache_epoch FOR EACH ROW EXECUTE FUNCTION count_bump()`} {
		if _, err := b.db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	const nodes = 4
	got := make([]string, nodes)
	errs := make([]error, nodes)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() { got[i], errs[i] = b.store.BumpCacheEpochFrom(ctx, e0) })
	}
	wg.Wait()
	e1, err := b.store.CacheEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, _, c0 := epochParts(t, e0)
	_, _, c1 := epochParts(t, e1)
	if c1 == c0 {
		t.Fatalf("epoch still %s", e1)
	}
	for i := range nodes {
		if errs[i] != nil || got[i] != e1 {
			t.Errorf("node %d: %q, %v; want %s", i, got[i], errs[i], e1)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM bumps`); n != 1 {
		t.Errorf("%d nodes found the database behind at once: %d bumps, want 1", nodes, n)
	}
	if e, err := b.store.BumpCacheEpochFrom(ctx, e0); err != nil || e != e1 {
		t.Errorf("from the old epoch again: %q, %v; want %s unchanged", e, err, e1)
	}
	if _, err := b.store.BumpCacheEpochFrom(ctx, "not an epoch"); err == nil {
		t.Error("a malformed epoch was accepted")
	}
}
