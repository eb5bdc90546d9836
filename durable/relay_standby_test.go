package durable_test

import (
	"context"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
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
	time.Sleep(500 * time.Millisecond) // the relay is standby by now
	var sessions, pinned int
	if err := b.db.QueryRow(ctx, `SELECT count(*), count(backend_xmin) FROM pg_stat_activity
		WHERE application_name = 'notifyedge-relay' AND datname = current_database()`).Scan(&sessions, &pinned); err != nil {
		t.Fatal(err)
	}
	if sessions != 1 || pinned != 0 {
		t.Errorf("standby relay sessions %d, holding a snapshot %d: want 1 and 0", sessions, pinned)
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
