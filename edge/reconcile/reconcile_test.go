package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/reconcile"
	"github.com/notifyedge/notifyedge/edge/reconcile/query"
)

func TestMain(m *testing.M) { durabletest.Main(m) }

// answers is a channel that answers from a table, and counts the queries.
type answers struct {
	mu    sync.Mutex
	state map[string]query.State
	fail  error
	asked map[string]int
}

func newAnswers() *answers {
	return &answers{state: map[string]query.State{}, asked: map[string]int{}}
}

func (a *answers) set(no string, s query.State) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.state[no] = s
}

func (a *answers) failWith(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fail = err
}

func (a *answers) times(no string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.asked[no]
}

func (a *answers) Query(_ context.Context, no string) (query.Answer, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked[no]++
	if a.fail != nil {
		return query.Answer{}, a.fail
	}
	s, ok := a.state[no]
	if !ok {
		s = query.NotFound
	}
	return query.Answer{State: s, Body: []byte(no)}, nil
}

// decisions stands in for the adapter and the decision: it records what
// it was asked to decide and answers applied the first time, replayed
// after, unless refuse names the body: then that refusal.
type decisions struct {
	mu     sync.Mutex
	got    map[string]int
	refuse map[string]edge.Outcome
}

func (d *decisions) DecideStored(_ context.Context, _ edge.Authority, ch string, body []byte, _ bool) (channel.Verdict, edge.Outcome, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.got == nil {
		d.got = map[string]int{}
	}
	d.got[ch+" "+string(body)]++
	if o, ok := d.refuse[string(body)]; ok {
		return channel.Verdict{Status: "PENDING_PAY"}, o, nil
	}
	if d.got[ch+" "+string(body)] > 1 {
		return channel.Verdict{Success: true, Status: "PAID"}, edge.OutcomeReplayedDB, nil
	}
	return channel.Verdict{Success: true, Status: "PAID"}, edge.OutcomeApplied, nil
}

func (d *decisions) ReviewStored(_ context.Context, _ edge.Authority, ch string, body []byte, reason durable.ReviewReason) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.got == nil {
		d.got = map[string]int{}
	}
	d.got[string(reason)+" "+ch+" "+string(body)]++
	return nil
}

func (d *decisions) count(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.got[key]
}

// noAuthority is never called: decisions does not decide.
type noAuthority struct{ edge.Authority }

type rig struct {
	store *durable.Store
	db    *pgxpool.Pool
}

func newRig(t *testing.T) *rig {
	t.Helper()
	url := durabletest.NewDatabase(t)
	ctx := context.Background()
	s, err := durable.New(ctx, durable.Config{URL: url, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return &rig{store: s, db: db}
}

// order registers a PENDING_PAY order paid through ch ("" for any).
func (r *rig) order(t *testing.T, no, ch string) {
	t.Helper()
	if _, err := r.store.PutOrder(context.Background(), no, 100, "CNY", ch); err != nil {
		t.Fatal(err)
	}
}

// next reads the order's schedule: seconds until the next query (-1 for
// never), the answered queries and the errors since.
func (r *rig) next(t *testing.T, no string) (in float64, step, errs int) {
	t.Helper()
	if err := r.db.QueryRow(context.Background(), `SELECT
		CASE WHEN reconcile_at = 'infinity' THEN -1 ELSE EXTRACT(EPOCH FROM reconcile_at - now())::float8 END,
		reconcile_step, reconcile_errors FROM biz_order WHERE order_no = $1`, no).Scan(&in, &step, &errs); err != nil {
		t.Fatal(err)
	}
	return in, step, errs
}

func near(got, want float64) bool { return got > want-60 && got <= want+1 }

// Ask schedules by the answer: a pending or unknown order is asked again on
// the back-off, a paid or closed one never, an error soon (After,
// doubling, never past the next step); an order of a channel that cannot be
// asked is not scheduled again.
func TestAskSchedules(t *testing.T) {
	r := newRig(t)
	wx, ali := newAnswers(), newAnswers()
	d := &decisions{}
	counted := map[string]int{}
	var mu sync.Mutex
	rc, err := reconcile.New(reconcile.Config{Store: r.store, Decider: d, Authority: noAuthority{},
		Window:  durable.ReconcileWindow{After: time.Minute, Horizon: 3 * time.Hour},
		Backoff: []time.Duration{10 * time.Minute, time.Hour, 4 * time.Hour}, Rate: 1000,
		OnResult: func(ch, res string) { mu.Lock(); counted[ch+"/"+res]++; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	rc.SetQueriers(map[string]reconcile.Querier{"wx": wx, "ali": ali})
	ctx := context.Background()
	ask := func(no string) (reconcile.Report, error) {
		t.Helper()
		return rc.Ask(ctx, no)
	}

	r.order(t, "PENDING", "wx")
	wx.set("PENDING", query.Pending)
	for i, want := range []float64{600, 3600, -1} { // the third step would pass the horizon
		rep, err := ask("PENDING")
		if err != nil || rep.State != query.Pending || rep.Result != reconcile.ResultPending || rep.Status != string(durable.PendingPay) {
			t.Fatalf("ask %d: %+v %v", i, rep, err)
		}
		if in, step, errs := r.next(t, "PENDING"); !(near(in, want) || want == -1 && in == -1) || step != i+1 || errs != 0 {
			t.Fatalf("after answer %d: next in %.0fs, step %d, errors %d; want %.0fs", i+1, in, step, errs, want)
		}
	}
	if ali.times("PENDING") != 0 {
		t.Error("an order of wx was asked of ali")
	}

	r.order(t, "FLAKY", "wx")
	wx.set("FLAKY", query.Pending)
	wx.failWith(fmt.Errorf("%w: bad signature", query.ErrUnverified))
	for i, want := range []float64{60, 120, 240, 480, 600, 600} {
		if _, err := ask("FLAKY"); !errors.Is(err, reconcile.ErrNotAsked) {
			t.Fatalf("failure %d: %v, want ErrNotAsked", i, err)
		}
		if in, step, errs := r.next(t, "FLAKY"); !near(in, want) || step != 0 || errs != i+1 {
			t.Fatalf("after failure %d: next in %.0fs, step %d, errors %d; want %.0fs", i+1, in, step, errs, want)
		}
	}
	wx.failWith(nil)
	if _, err := ask("FLAKY"); err != nil {
		t.Fatal(err)
	}
	if in, step, errs := r.next(t, "FLAKY"); !near(in, 600) || step != 1 || errs != 0 {
		t.Fatalf("answered after failures: next in %.0fs, step %d, errors %d", in, step, errs)
	}

	r.order(t, "CLOSED", "ali")
	ali.set("CLOSED", query.Closed)
	if rep, err := ask("CLOSED"); err != nil || rep.Result != reconcile.ResultClosed || rep.Channel != "ali" {
		t.Fatalf("closed: %+v %v", rep, err)
	}
	if in, _, _ := r.next(t, "CLOSED"); in != -1 {
		t.Errorf("closed at the channel: asked again in %.0fs", in)
	}

	r.order(t, "GONE", "ali")
	if rep, err := ask("GONE"); err != nil || rep.Result != reconcile.ResultNotFound {
		t.Fatalf("not found: %+v %v", rep, err)
	}
	if in, _, _ := r.next(t, "GONE"); !near(in, 600) {
		t.Errorf("not found: asked again in %.0fs, want the back-off", in)
	}

	// No channel named: both asked; the payment decides.
	r.order(t, "ANY", "")
	wx.set("ANY", query.Pending)
	ali.set("ANY", query.Paid)
	rep, err := ask("ANY")
	if err != nil || rep.Channel != "ali" || rep.State != query.Paid || rep.Outcome != "applied" || rep.Status != "PAID" ||
		rep.Result != reconcile.ResultApplied {
		t.Fatalf("any channel: %+v %v", rep, err)
	}
	if wx.times("ANY") != 1 || ali.times("ANY") != 1 || d.count("ali ANY") != 1 || d.count("wx ANY") != 0 {
		t.Errorf("asked wx %d, ali %d; decided ali %d, wx %d", wx.times("ANY"), ali.times("ANY"), d.count("ali ANY"), d.count("wx ANY"))
	}
	if in, _, _ := r.next(t, "ANY"); in != -1 {
		t.Errorf("paid: asked again in %.0fs", in)
	}
	// Asked again by hand: the decision replays.
	if rep, err := ask("ANY"); err != nil || rep.Outcome != "replayed" || rep.Result != reconcile.ResultSkipped {
		t.Fatalf("asked again: %+v %v", rep, err)
	}

	// Paid, then refunded at the channel: never decided as a payment, a
	// review instead, not asked again.
	r.order(t, "REFUNDED", "wx")
	wx.set("REFUNDED", query.Refunded)
	if rep, err := ask("REFUNDED"); err != nil || rep.Result != reconcile.ResultRefunded || rep.Status != string(durable.PendingPay) {
		t.Fatalf("refunded at the channel: %+v %v", rep, err)
	}
	if d.count("wx REFUNDED") != 0 || d.count("REFUNDED_AT_CHANNEL wx REFUNDED") != 1 {
		t.Errorf("refunded at the channel: decided %d times, reviewed %d, want 0 and 1", d.count("wx REFUNDED"), d.count("REFUNDED_AT_CHANNEL wx REFUNDED"))
	}
	if in, _, _ := r.next(t, "REFUNDED"); in != -1 {
		t.Errorf("refunded at the channel: asked again in %.0fs", in)
	}

	// Paid, and the decision refused the answer without a review (a
	// malformed field, an unknown currency): an error, asked again soon,
	// never counted decided. Refused with a review: decided, not asked
	// again.
	d.refuse = map[string]edge.Outcome{"REFUSED": edge.OutcomeBadRequest, "HELD": edge.OutcomeAmountMismatch}
	r.order(t, "REFUSED", "wx")
	wx.set("REFUSED", query.Paid)
	if rep, err := ask("REFUSED"); !errors.Is(err, reconcile.ErrNotAsked) {
		t.Fatalf("refused without a review: %+v %v, want an error", rep, err)
	}
	if in, step, errs := r.next(t, "REFUSED"); !near(in, 60) || step != 0 || errs != 1 {
		t.Errorf("refused without a review: next in %.0fs, step %d, errors %d; want the error retry", in, step, errs)
	}
	r.order(t, "HELD", "wx")
	wx.set("HELD", query.Paid)
	if rep, err := ask("HELD"); err != nil || rep.Result != reconcile.ResultSkipped || rep.Outcome != "amount_mismatch" {
		t.Fatalf("held for review: %+v %v", rep, err)
	}
	if in, _, _ := r.next(t, "HELD"); in != -1 {
		t.Errorf("held for review: asked again in %.0fs", in)
	}
	// (Counted below: six failed queries and the refused answer.)

	// No channel named: one fails, the other says pending. Asked again
	// soon: the failed one may be the payer.
	r.order(t, "SPLIT", "")
	wx.set("SPLIT", query.Pending)
	ali.failWith(errors.New("connection refused"))
	if rep, err := ask("SPLIT"); err != nil || rep.State != query.Pending {
		t.Fatalf("split answers: %+v %v", rep, err)
	}
	ali.failWith(nil)
	if in, step, errs := r.next(t, "SPLIT"); !near(in, 60) || step != 0 || errs != 1 {
		t.Errorf("one channel failed: next in %.0fs, step %d, errors %d; want the error retry", in, step, errs)
	}
	// A correction registers the order again: its queries start over.
	if err := r.store.PatchOrder(ctx, "FLAKY", 200, "CNY"); err != nil {
		t.Fatal(err)
	}
	var pending bool
	if err := r.db.QueryRow(ctx, `SELECT reconcile_at IS NULL AND reconcile_step = 0 AND reconcile_errors = 0 FROM biz_order
		WHERE order_no = 'FLAKY'`).Scan(&pending); err != nil || !pending {
		t.Errorf("after PATCH the schedule was kept (%v)", err)
	}

	r.order(t, "ACME", "acme")
	if _, err := ask("ACME"); !errors.Is(err, reconcile.ErrNoQuerier) {
		t.Fatalf("a channel without query credentials: %v", err)
	}
	// Looked at again on the back-off: credentials may come with a reload.
	if in, step, errs := r.next(t, "ACME"); !near(in, 600) || step != 1 || errs != 0 {
		t.Errorf("a channel without query credentials: next in %.0fs, step %d, errors %d; want the back-off", in, step, errs)
	}
	rc.SetQueriers(map[string]reconcile.Querier{"wx": wx, "ali": ali, "acme": wx})
	wx.set("ACME", query.Pending)
	if rep, err := ask("ACME"); err != nil || rep.Channel != "acme" || rep.Result != reconcile.ResultPending {
		t.Fatalf("once the channel has credentials: %+v %v", rep, err)
	}
	if _, err := ask("NOBODY"); !errors.Is(err, durable.ErrUnknownOrder) {
		t.Fatalf("unknown order: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if counted["wx/error"] != 7 || counted["ali/error"] != 1 || counted["ali/applied"] != 1 || counted["ali/skipped"] != 1 || counted["ali/closed"] != 1 {
		t.Errorf("counted %v", counted)
	}
}

// Two reconcilers on one database: one leads, every due order is asked
// once (the next query is on the back-off, far away), and the standby takes
// over when the leader stops.
func TestRunOneLeaderAsksEachDueOrderOnce(t *testing.T) {
	r := newRig(t)
	const n = 30
	for i := range n {
		r.order(t, fmt.Sprintf("DUE-%02d", i), "wx")
	}
	// Due at once: registered a minute ago.
	if _, err := r.db.Exec(context.Background(), `UPDATE biz_order SET updated_at = now() - interval '1 minute'`); err != nil {
		t.Fatal(err)
	}
	wx := newAnswers()
	var mu sync.Mutex
	leaders := map[int]int{}
	start := func(id int) (*reconcile.Reconciler, context.CancelFunc, chan struct{}) {
		rc, err := reconcile.New(reconcile.Config{Store: r.store, Decider: &decisions{}, Authority: noAuthority{},
			Window: durable.ReconcileWindow{After: time.Second, Horizon: time.Hour}, Rate: 1000, Poll: 20 * time.Millisecond,
			OnState: func(st string) {
				if st == "leader" {
					mu.Lock()
					leaders[id]++
					mu.Unlock()
				}
			}})
		if err != nil {
			t.Fatal(err)
		}
		rc.SetQueriers(map[string]reconcile.Querier{"wx": wx})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); rc.Run(ctx) }()
		return rc, cancel, done
	}
	stops := map[int]func(){}
	for id := 1; id <= 2; id++ {
		_, stop, done := start(id)
		stops[id] = func() { stop(); <-done }
	}
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	wait.For(t, "every due order asked", func() (bool, string) {
		asked := 0
		for i := range n {
			if wx.times(fmt.Sprintf("DUE-%02d", i)) > 0 {
				asked++
			}
		}
		return asked == n, fmt.Sprintf("%d of %d asked", asked, n)
	})
	for i := range n {
		if got := wx.times(fmt.Sprintf("DUE-%02d", i)); got != 1 {
			t.Errorf("DUE-%02d asked %d times", i, got)
		}
	}
	mu.Lock()
	var leader int
	for id := range leaders {
		leader = id
	}
	first := len(leaders)
	mu.Unlock()
	if first != 1 {
		t.Fatalf("leaders %v, want one", leaders)
	}
	// The leader stops; the other takes over.
	stops[leader]()
	delete(stops, leader)
	wait.For(t, "the standby leads", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(leaders) == 2, fmt.Sprint(leaders)
	})
}

// Many failures in a row with a long first wait: the retry never passes
// the back-off's step, and never wraps around into the past.
func TestRetryNeverOverflows(t *testing.T) {
	r := newRig(t)
	wx := newAnswers()
	wx.failWith(errors.New("down"))
	rc, err := reconcile.New(reconcile.Config{Store: r.store, Decider: &decisions{}, Authority: noAuthority{},
		Window:  durable.ReconcileWindow{After: 3 * time.Hour, Horizon: 1000 * time.Hour},
		Backoff: []time.Duration{12 * time.Hour}, Rate: 1000})
	if err != nil {
		t.Fatal(err)
	}
	rc.SetQueriers(map[string]reconcile.Querier{"wx": wx})
	r.order(t, "LONG", "wx")
	if _, err := r.db.Exec(context.Background(), `UPDATE biz_order SET reconcile_errors = 40 WHERE order_no = 'LONG'`); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Ask(context.Background(), "LONG"); !errors.Is(err, reconcile.ErrNotAsked) {
		t.Fatalf("%v, want ErrNotAsked", err)
	}
	if in, _, errs := r.next(t, "LONG"); !near(in, 12*3600) || errs != 41 {
		t.Errorf("after 41 failures: next in %.0fs (errors %d), want the 12h step", in, errs)
	}
}

// Asked by hand (POST /orders/{no}/reconcile), queries come from a budget
// of their own: a burst of them leaves the background's budget whole, so
// the leader's queries are never delayed by them.
func TestManualAsksHaveTheirOwnBudget(t *testing.T) {
	r := newRig(t)
	wx := newAnswers()
	rc, err := reconcile.New(reconcile.Config{Store: r.store, Decider: &decisions{}, Authority: noAuthority{},
		Window: durable.ReconcileWindow{After: time.Minute, Horizon: time.Hour}, Rate: 1, ManualRate: 1000})
	if err != nil {
		t.Fatal(err)
	}
	rc.SetQueriers(map[string]reconcile.Querier{"wx": wx})
	for i := range 5 {
		no := fmt.Sprintf("M-%d", i)
		r.order(t, no, "wx")
		wx.set(no, query.Pending)
		if _, err := rc.Ask(context.Background(), no); err != nil {
			t.Fatal(err)
		}
	}
	if got := reconcile.Tokens(rc, "wx", false); got < 1 {
		t.Errorf("the background's budget after 5 manual asks: %.2f queries, want its whole burst (1)", got)
	}
	if wx.times("M-4") != 1 {
		t.Errorf("M-4 asked %d times", wx.times("M-4"))
	}
}

// failingSchedule is the store with every schedule write failing.
type failingSchedule struct{ *durable.Store }

func (failingSchedule) ScheduleReconcile(context.Context, string, durable.ReconcileWindow, durable.Reconciled) error {
	return errors.New("disk full")
}

// When the next query's time cannot be written, the order stays due: the
// leader waits Poll, doubling, before it reads the due orders again,
// instead of asking the channel about them at its full rate. However slow
// the machine, asks come no sooner than that: the count is bounded by the
// time that passed.
func TestScheduleFailureBacksOff(t *testing.T) {
	r := newRig(t)
	wx := newAnswers()
	const poll = 50 * time.Millisecond
	rc, err := reconcile.New(reconcile.Config{Store: failingSchedule{r.store}, Decider: &decisions{}, Authority: noAuthority{},
		Window: durable.ReconcileWindow{After: time.Millisecond, Horizon: time.Hour}, Rate: 1000, Poll: poll})
	if err != nil {
		t.Fatal(err)
	}
	rc.SetQueriers(map[string]reconcile.Querier{"wx": wx})
	r.order(t, "S-1", "wx")
	wx.set("S-1", query.Pending)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); rc.Run(ctx) }()
	wait.For(t, "four queries, each after a failed schedule write", func() (bool, string) {
		return wx.times("S-1") >= 4, fmt.Sprint(wx.times("S-1"))
	})
	cancel()
	<-done
	elapsed := time.Since(start)
	// Asked at 0, then after P, 2P, 4P, ...: by elapsed e, at most
	// 1 + log2(e/P + 1) times.
	most := 1 + int(math.Log2(float64(elapsed)/float64(poll)+1))
	if got := wx.times("S-1"); got > most {
		t.Errorf("asked %d times in %v with every schedule write failing, want at most %d (a back-off from %v)", got, elapsed, most, poll)
	}
}
