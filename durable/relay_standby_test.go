package durable_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/wait"
)

type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, []durable.OutboxMessage) error { return nil }

// A standby relay waits for leadership without holding a snapshot: one that
// waited inside pg_advisory_lock would pin the vacuum horizon (retention's
// deletes never cleaned) for as long as it waits.
func TestRelayStandbyHoldsNoSnapshot(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	const lockID = 4242
	holder, err := b.db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockID); err != nil {
		t.Fatal(err)
	}
	defer holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lockID)
	defer runRelay(b.store, durable.RelayConfig{Publisher: nopPublisher{}, LockID: lockID})()
	// Standby means: between tries for leadership, idle, holding no
	// snapshot. A relay that waited inside pg_advisory_lock would stay
	// active with a snapshot, and never be seen idle here.
	wait.For(t, "a standby relay idle between tries for leadership", func() (bool, string) {
		var idle, pinned int
		if err := b.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'idle' AND query LIKE '%pg_try_advisory_lock%'),
			count(backend_xmin) FILTER (WHERE state = 'idle')
			FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, durable.RelayApplication).Scan(&idle, &pinned); err != nil {
			t.Fatal(err)
		}
		if pinned != 0 {
			t.Fatalf("an idle standby relay holds a snapshot (%d sessions)", pinned)
		}
		return idle == 1, fmt.Sprintf("%d idle", idle)
	})
	var sessions int
	if err := b.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database()`, durable.RelayApplication).Scan(&sessions); err != nil {
		t.Fatal(err)
	}
	if sessions != 1 {
		t.Errorf("standby relay sessions %d, want 1", sessions)
	}
}

// runRelay runs the store's relay on a goroutine of its own until the
// returned stop is called.
func runRelay(s *durable.Store, cfg durable.RelayConfig) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.RunRelay(ctx, cfg)
	}()
	return func() { cancel(); <-done }
}
