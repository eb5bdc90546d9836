package durable_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// countingPublisher records each batch's size and when the last came.
type countingPublisher struct {
	mu      sync.Mutex
	batches int
	rows    int
	last    time.Time
}

func (p *countingPublisher) Publish(_ context.Context, msgs []durable.OutboxMessage) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.batches++
	p.rows += len(msgs)
	p.last = time.Now()
	return nil
}

func (p *countingPublisher) counts() (batches, rows int, last time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.batches, p.rows, p.last
}

// Payments applied one after another each wake the relay, and so do
// other nodes (here the test, as fast as it can); the relay gathers the
// rows of several wake-ups into one batch, starting partial batches at most
// once per RelayPace, however fast wake-ups come.
func TestRelayGathersWakeUps(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	p := &countingPublisher{}
	start := time.Now()
	defer runRelay(b.store, durable.RelayConfig{Publisher: p, Poll: time.Minute})()
	wakeCtx, stopWaking := context.WithCancel(ctx)
	woken := make(chan struct{})
	go func() {
		defer close(woken)
		for wakeCtx.Err() == nil {
			_, _ = b.db.Exec(wakeCtx, `SELECT pg_notify('notifyedge_outbox', '')`)
		}
	}()
	defer func() { stopWaking(); <-woken }()
	const n = 120
	for i := range n {
		o := fmt.Sprintf("RP-%03d", i)
		b.order(t, o, durable.PendingPay, 100, "CNY")
		if r, err := b.store.Process(ctx, note("T"+o, durable.PaySuccess, o, 100, "CNY")); err != nil || r.Outcome != durable.Applied {
			t.Fatalf("%s: %+v %v", o, r, err)
		}
	}
	wait.For(t, fmt.Sprintf("all %d rows published", n), func() (bool, string) {
		_, rows, _ := p.counts()
		return rows == n, fmt.Sprintf("%d published", rows)
	})
	batches, _, last := p.counts()
	// The first batch may come at once, and each later one no sooner than
	// the pace after the one before: slower is always allowed.
	if most := int(last.Sub(start)/durable.RelayPace) + 2; batches > most {
		t.Errorf("%d batches for %d rows in %v, want at most %d (one per %v)", batches, n, last.Sub(start).Round(time.Millisecond), most, durable.RelayPace)
	}
}

// The relay's marks commit without waiting for the disk: a lost mark only
// re-sends its rows, which consumers dedup.
func TestRelayMarksCommitAsynchronously(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	// The test cluster commits asynchronously everywhere: make this
	// database's sessions wait for the disk, as a production server does.
	if _, err := b.db.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = on', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	got, err := durable.RelaySetting(ctx, b.store, "synchronous_commit")
	if err != nil {
		t.Fatal(err)
	}
	if got != "off" {
		t.Errorf("the relay's synchronous_commit is %q, want off", got)
	}
}

// The relay's connection keeps no notification: a burst of them, more
// than a busy relay loops, only marks it woken. pgx's default kept each
// in a slice the relay took one from per batch, which grew for as long
// as callbacks notified faster than the relay looped.
func TestRelayKeepsNoNotification(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	kept, woken, err := durable.RelayNotificationsKept(ctx, b.store, 200, func(ctx context.Context) error {
		_, err := b.db.Exec(ctx, `SELECT pg_notify('notifyedge_outbox', '')`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if kept != 0 || !woken {
		t.Errorf("after 200 notifications the relay's connection keeps %d and woken is %v; want none kept, woken", kept, woken)
	}
}
