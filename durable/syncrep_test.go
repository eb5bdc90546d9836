package durable_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// A decision whose commit waits for a stalled synchronous standby past the
// caller's deadline is no answer, and neither is a re-delivery of it while
// the standby stays stalled: the commit is on the primary only, and a
// failover would lose it. A cancel request would end the commit's wait
// with the commit made locally and visible, so that the re-delivery is
// replayed SUCCESS from a row no standby has; a failover then loses a
// payment answered SUCCESS (make bench-ha found 6 with synchronous_mode
// on). The same holds for an order system's event and its retry under the
// same request id. Once the standby catches up, both are replayed.
func TestCommitWaitingForItsStandbyIsNoAnswer(t *testing.T) {
	ctx := context.Background()
	primary, err := pgtemp.Start(ctx, pgtemp.Options{Durable: true, Settings: []string{"fsync=off"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Stop() })
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join(primary.Dir(), "postgres.log")); err == nil && t.Failed() {
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, "synchronous") || strings.Contains(l, "cancel") {
					t.Log(l)
				}
			}
		}
	})
	url := primary.URL("postgres")
	if err := durable.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	standby, err := pgtemp.StartStandby(ctx, primary, pgtemp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() })
	db := durabletest.Pool(t, url)
	for _, q := range []string{`ALTER SYSTEM SET synchronous_standby_names = '*'`, `SELECT pg_reload_conf()`,
		`INSERT INTO biz_order (order_no, status, amount, currency) VALUES ('O-sync', 'PENDING_PAY', 100, 'CNY'), ('O-close', 'PENDING_PAY', 100, 'CNY')`} {
		if _, err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, "a synchronous standby", func() (bool, string) {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'`).Scan(&n)
		return err == nil && n == 1, fmt.Sprint(n, err)
	})
	store := newStore(t, url, durable.Config{})

	// Stall the standby: its WAL receiver stopped, it acknowledges nothing.
	sc, err := pgx.Connect(ctx, standby.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close(ctx)
	var receiver int
	if err := sc.QueryRow(ctx, `SELECT pid FROM pg_stat_wal_receiver`).Scan(&receiver); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(receiver, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(receiver, syscall.SIGCONT)
		}
	}
	defer resume()

	n := note("T-sync", durable.PaySuccess, "O-sync", 100, "CNY")
	decide := func() (durable.Result, error) {
		dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		return store.Process(dctx, n)
	}
	if res, err := decide(); err == nil {
		t.Fatalf("answered %+v while its commit waits for the stalled standby", res)
	}
	for i := range 3 {
		if res, err := decide(); err == nil {
			t.Fatalf("re-delivery %d answered %+v while the first commit is on the primary only", i+1, res)
		}
	}
	// The orders API's writes too: an order system's CLOSE waits for the
	// standby past its caller's deadline (it answers once it knows), and
	// its retry under the same request id is no answer meanwhile.
	closeOrder := func() (durable.Result, error) {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		return store.OrderEvent(cctx, "O-close", durable.Close, "req-1")
	}
	first := make(chan error, 1)
	go func() {
		_, err := closeOrder()
		first <- err
	}()
	wait.For(t, "the decision and the CLOSE waiting for the standby", func() (bool, string) {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&n)
		return err == nil && n >= 2, fmt.Sprint(n, err)
	})
	if res, err := closeOrder(); err == nil {
		t.Fatalf("the order event's retry answered %+v while its commit is on the primary only", res)
	}
	resume()
	wait.For(t, "the re-delivery replayed once the standby caught up", func() (bool, string) {
		res, err := decide()
		return err == nil && res.Replayed, fmt.Sprintf("%+v %v", res, err)
	})
	if err := <-first; err != nil {
		t.Errorf("the CLOSE, once its standby had it: %v", err)
	}
	wait.For(t, "the order event's retry replayed", func() (bool, string) {
		res, err := closeOrder()
		return err == nil && res.Replayed, fmt.Sprintf("%+v %v", res, err)
	})
	for _, order := range []string{"O-sync", "O-close"} {
		var events int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE order_no = $1`, order).Scan(&events); err != nil || events != 1 {
			t.Errorf("outbox rows for %s: %d, %v; want 1", order, events, err)
		}
	}
}
