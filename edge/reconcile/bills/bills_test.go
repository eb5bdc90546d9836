package bills_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/reconcile/bills"
	"github.com/notifyedge/notifyedge/edge/reconcile/query"
)

func TestMain(m *testing.M) { durabletest.Main(m) }

// biller answers each Bill from a script of results and counts the asks.
type biller struct {
	mu     sync.Mutex
	script []error // nil: an empty statement
	asked  []string
}

func (b *biller) Bill(_ context.Context, date string) (query.Statement, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.asked = append(b.asked, date)
	var err error
	if len(b.script) > 0 {
		err, b.script = b.script[0], b.script[1:]
	}
	if err != nil {
		return query.Statement{}, err
	}
	return query.Empty, nil
}

func (b *biller) asks() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.asked...)
}

func (b *biller) BillPayment(string, string, int64) []byte                      { return nil }
func (b *biller) BillRefund(string, string, string, int64, int64, int64) []byte { return nil }

// noDecisions fails the test if an empty statement were to decide
// anything.
type noDecisions struct{ t *testing.T }

func (d noDecisions) DecideStored(context.Context, edge.Authority, string, []byte, bool) (channel.Verdict, edge.Outcome, error) {
	d.t.Error("a decision for an empty statement")
	return channel.Verdict{}, 0, errors.New("no")
}

func (d noDecisions) ReviewStored(context.Context, edge.Authority, string, []byte, durable.ReviewReason) error {
	d.t.Error("a review for an empty statement")
	return errors.New("no")
}

type noAuthority struct{ edge.Authority }

// TestScheduleOnAnInjectedClock walks a day through the schedule: nothing
// before 10:30, then the previous day asked for; not ready, asked again
// only 30 minutes later; a failure retried the same way; once ok, never
// again; a day still not ready at 18:00 given up; after the give-up, a day
// never tried at all asked once.
func TestScheduleOnAnInjectedClock(t *testing.T) {
	ctx := context.Background()
	store := newStore(t)
	zone, _ := time.LoadLocation("Asia/Shanghai")
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 6, 9, 0, 0, 0, zone))
	runs := map[string]int{}
	var mu sync.Mutex
	r, err := bills.New(bills.Config{Store: store, Decider: noDecisions{t}, Authority: noAuthority{}, Zone: zone, Clock: clock,
		OnRun: func(ch, state string) { mu.Lock(); runs[state]++; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	wx := &biller{script: []error{query.ErrNotReady, errors.New("connection refused"), nil}}
	r.SetBillers(map[string]bills.Biller{"wx": wx})
	tick := func(advance time.Duration) int {
		t.Helper()
		clock.Advance(advance)
		if err := r.Tick(ctx); err != nil {
			t.Fatal(err)
		}
		return len(wx.asks())
	}
	if n := tick(0); n != 0 {
		t.Fatalf("asked %d times at 09:00, before 10:30", n)
	}
	if n := tick(90 * time.Minute); n != 1 || wx.asks()[0] != "2026-12-05" {
		t.Fatalf("at 10:30: asks %v, want the previous day once", wx.asks())
	}
	if n := tick(29 * time.Minute); n != 1 {
		t.Fatalf("29 minutes after not ready: asked %d times", n)
	}
	if n := tick(time.Minute); n != 2 {
		t.Fatalf("30 minutes after not ready: asked %d times, want 2", n)
	}
	if n := tick(29 * time.Minute); n != 2 {
		t.Fatalf("29 minutes after a failure: asked %d times", n)
	}
	if n := tick(time.Minute); n != 3 {
		t.Fatalf("30 minutes after a failure: asked %d times, want 3", n)
	}
	if n := tick(2 * time.Hour); n != 3 {
		t.Fatalf("after an ok run: asked %d times, want no more", n)
	}
	if runs["missing"] != 1 || runs["error"] != 1 || runs["ok"] != 1 {
		t.Errorf("runs %v", runs)
	}

	// The next day: never ready until the give-up.
	wx.script = []error{query.ErrNotReady, query.ErrNotReady, query.ErrNotReady, query.ErrNotReady, query.ErrNotReady,
		query.ErrNotReady, query.ErrNotReady, query.ErrNotReady, query.ErrNotReady, query.ErrNotReady, query.ErrNotReady,
		query.ErrNotReady, query.ErrNotReady, query.ErrNotReady, query.ErrNotReady, query.ErrNotReady, query.ErrNotReady}
	clock.Advance(20 * time.Hour) // 09:30 the next day
	before := len(wx.asks())
	for range 16 { // 10:30 to 18:00, every 30 minutes
		tick(30 * time.Minute)
	}
	asked := len(wx.asks()) - before
	if asked != 15 {
		t.Errorf("asked %d times between 10:30 and 18:00, want every 30 minutes (15)", asked)
	}
	if n := tick(2 * time.Hour); n != before+asked {
		t.Errorf("asked again after the give-up")
	}
	day, _ := durable.NewBillDay("2026-12-06", zone)
	if st, _ := store.BillRunState(ctx, "wx", day); st != "missing" {
		t.Errorf("the given-up day is %q, want missing", st)
	}

	// A channel added after the give-up, its day never tried: asked once.
	ali := &biller{}
	r.SetBillers(map[string]bills.Biller{"wx": wx, "ali": ali})
	tick(time.Minute)
	tick(time.Hour)
	if got := ali.asks(); len(got) != 1 || got[0] != "2026-12-06" {
		t.Errorf("a day never tried, after the give-up: asks %v, want one", got)
	}
}

// newStore opens a Store on a database of the test's own, closed when the
// test ends.
func newStore(t *testing.T) *durable.Store {
	t.Helper()
	store, err := durable.New(context.Background(), durable.Config{URL: durabletest.NewDatabase(t), MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	return store
}
