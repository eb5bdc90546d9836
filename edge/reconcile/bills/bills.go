// Package bills compares each channel's daily statement (对账单) with the
// ledger and repairs what a lost callback left behind, through the same
// decision as a callback: a payment or refund the channel shows and the
// ledger lacks is decided as that payment's or refund's callback would be
// (the adapter's mapping, key and digest, so a callback arriving later is
// a replay); a trade the channel refunded is never applied as a payment;
// amounts that differ and entries the channel never saw are held for
// review.
//
// One node fetches on schedule (a session advisory lock), the previous
// day's statement after a time of day in the channels' zone, again every
// half hour while it is not ready or fails, until a give-up time. A day's
// run holds a lock of its own, so a run asked for through the API and the
// scheduled one never overlap. Everything runs on the operator pool.
package bills

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/reconcile/bill"
	"github.com/notifyedge/notifyedge/edge/reconcile/query"
)

// Store is what a run reads and writes. *durable.Store satisfies it.
type Store interface {
	CompareBill(ctx context.Context, channel string, day durable.BillDay, next func() (durable.BillRow, error)) (durable.BillRun, error)
	BillItems(ctx context.Context, channel string, day durable.BillDay, after int64, limit int, pendingOnly bool) ([]durable.BillItem, error)
	SetBillItemAction(ctx context.Context, id int64, action, detail string) error
	SaveBillRun(ctx context.Context, run durable.BillRun) error
	BillRunState(ctx context.Context, channel string, day durable.BillDay) (string, error)
	BillReview(ctx context.Context, channel, date string, item durable.BillItem, reason durable.ReviewReason) error
	PruneBills(ctx context.Context, before time.Time) (int64, error)
	RunLeader(ctx context.Context, cfg durable.LeaderConfig, lead func(context.Context) error)
	WithLock(ctx context.Context, lockID int64, name string, run func(context.Context) error) error
}

// Decider decides a stored delivery through the channel's adapter and an
// authority, or opens a review for it. *edge.Server satisfies it.
type Decider interface {
	DecideStored(ctx context.Context, a edge.Authority, channelName string, body []byte, review bool) (channel.Verdict, edge.Outcome, error)
	ReviewStored(ctx context.Context, a edge.Authority, channelName string, body []byte, reason durable.ReviewReason) error
}

// Biller fetches a channel's statement and builds the stored deliveries of
// its rows. The channels' clients of package query satisfy it.
type Biller interface {
	Bill(ctx context.Context, date string) (query.Statement, error)
	BillPayment(trade, orderNo string, total int64) []byte
	BillRefund(trade, orderNo, refundID string, total, refund, refundedTotal int64) []byte
}

// Config configures a Runner. Zero fields take the defaults noted.
type Config struct {
	Store   Store
	Decider Decider
	// Authority decides on the operator pool; the runner names its
	// decisions "bill" (the outbox payload's via).
	Authority edge.Authority
	// Zone is the channels' day (default Asia/Shanghai).
	Zone *time.Location
	// At is when, past midnight in Zone, the previous day's statement is
	// first fetched (default 10h30m); GiveUp when a day that is still not
	// ready is given up as missing (default 18h).
	At, GiveUp time.Duration
	// Retry is the wait between attempts at a day (default 30m).
	Retry time.Duration
	// Retention is how long runs and their items are kept (default
	// 2160h).
	Retention time.Duration
	// Poll is how often the leader looks at the schedule, and a standby
	// tries for leadership (default 1m).
	Poll time.Duration
	// DecideTimeout bounds one item's decision (default 5s).
	DecideTimeout time.Duration
	// Clock is the schedule's clock (default the system's).
	Clock clockwork.Clock
	// OnRun counts a recorded run by channel and state
	// (notifyedge_bill_runs_total).
	OnRun func(channel, state string)
	// OnState reports "leader" or "standby".
	OnState func(string)
	Logger  *slog.Logger
}

// Runner fetches and compares statements. Its channel set is swapped whole
// (SetBillers) when the credentials are reloaded.
type Runner struct {
	cfg     Config
	billers atomic.Pointer[map[string]Biller]
	// tried is when the scheduled run last tried each channel's day.
	mu    sync.Mutex
	tried map[string]time.Time
}

// New returns a Runner for cfg.
func New(cfg Config) (*Runner, error) {
	if cfg.Store == nil || cfg.Decider == nil || cfg.Authority == nil {
		return nil, errors.New("bills: Store, Decider and Authority are required")
	}
	if cfg.Zone == nil {
		z, err := time.LoadLocation("Asia/Shanghai")
		if err != nil {
			return nil, fmt.Errorf("bills: %w", err)
		}
		cfg.Zone = z
	}
	if cfg.At == 0 && cfg.GiveUp == 0 {
		cfg.At, cfg.GiveUp = 10*time.Hour+30*time.Minute, 18*time.Hour
	}
	if cfg.At < 0 || cfg.GiveUp <= cfg.At || cfg.GiveUp > 24*time.Hour {
		return nil, fmt.Errorf("bills: the give-up time (%s) must come after the fetch time (%s), both within the day", clockText(cfg.GiveUp), clockText(cfg.At))
	}
	if cfg.Retry <= 0 {
		cfg.Retry = 30 * time.Minute
	}
	if cfg.Retention <= 0 {
		cfg.Retention = 2160 * time.Hour
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Minute
	}
	if cfg.DecideTimeout <= 0 {
		cfg.DecideTimeout = 5 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.OnRun == nil {
		cfg.OnRun = func(string, string) {}
	}
	if cfg.OnState == nil {
		cfg.OnState = func(string) {}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Authority = billAuthority{cfg.Authority}
	r := &Runner{cfg: cfg, tried: map[string]time.Time{}}
	r.SetBillers(nil)
	return r, nil
}

// clockText prints a time of day.
func clockText(d time.Duration) string {
	return fmt.Sprintf("%02d:%02d", int(d.Hours()), int(d.Minutes())%60)
}

// billAuthority decides through its Authority, naming the path a
// statement's repair took ("via": bill).
type billAuthority struct{ edge.Authority }

func (b billAuthority) Process(ctx context.Context, n durable.Notification) (durable.Result, error) {
	n.Via = durable.ViaBill
	return b.Authority.Process(ctx, n)
}

// SetBillers swaps in the channels whose statements are fetched.
func (r *Runner) SetBillers(bs map[string]Biller) {
	m := make(map[string]Biller, len(bs))
	for k, v := range bs {
		m[k] = v
	}
	r.billers.Store(&m)
}

// Channels lists the channels whose statements are fetched, sorted.
func (r *Runner) Channels() []string {
	bs := *r.billers.Load()
	names := make([]string, 0, len(bs))
	for n := range bs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Errors of RunDay.
var (
	// ErrNoBiller: no such channel, or it has no query credentials.
	ErrNoBiller = errors.New("bills: no such channel with query credentials")
	// ErrInProgress: a run of that channel's day is in progress.
	ErrInProgress = errors.New("bills: a run of that day is in progress")
	// ErrFetch: the channel could not be reached or its answer failed
	// verification; the run was recorded as error.
	ErrFetch = errors.New("bills: the statement could not be fetched")
)

// RunDay fetches channel's statement of date (YYYY-MM-DD), compares it
// and acts on what does not match, and records the run, which it returns
// whatever its state: ok; missing (not ready); error (a statement that
// failed its own checks, or ErrFetch). Running a day again replaces its
// run and applies nothing twice.
func (r *Runner) RunDay(ctx context.Context, channel, date string) (durable.BillRun, error) {
	b, ok := (*r.billers.Load())[channel]
	if !ok {
		return durable.BillRun{}, fmt.Errorf("%w: %q", ErrNoBiller, channel)
	}
	day, err := durable.NewBillDay(date, r.cfg.Zone)
	if err != nil {
		return durable.BillRun{}, fmt.Errorf("bills: %w", err)
	}
	ctx, span := otel.Tracer(tracerName).Start(ctx, "bill run",
		trace.WithAttributes(attribute.String("notifyedge.channel", channel), attribute.String("notifyedge.bill_date", date)))
	defer span.End()
	var run durable.BillRun
	defer func() {
		span.SetAttributes(attribute.String("notifyedge.bill_state", run.State))
		for category, n := range run.Categories {
			span.SetAttributes(attribute.Int("notifyedge.bill."+category, n))
		}
	}()
	err = r.cfg.Store.WithLock(ctx, durable.BillDayLockID(channel, day), "bill", func(lctx context.Context) error {
		var err error
		run, err = r.runDay(lctx, channel, day, b)
		return err
	})
	if errors.Is(err, durable.ErrNotLeader) {
		return durable.BillRun{}, fmt.Errorf("%w: %s %s", ErrInProgress, channel, date)
	}
	if err != nil {
		span.SetStatus(codes.Error, "the day's run failed")
	}
	return run, err
}

// tracerName is the bill runs' instrumentation scope.
const tracerName = "github.com/notifyedge/notifyedge/edge/reconcile/bills"

// runDay is RunDay holding the day's lock.
func (r *Runner) runDay(ctx context.Context, channel string, day durable.BillDay, b Biller) (durable.BillRun, error) {
	date := day.String()
	log := r.cfg.Logger.With("channel", channel, "bill_date", date)
	st, err := b.Bill(ctx, date)
	now := r.cfg.Clock.Now()
	if err != nil {
		run := durable.BillRun{Channel: channel, Date: date, State: durable.BillError, Categories: map[string]int{}}
		if errors.Is(err, query.ErrNotReady) {
			run.State = durable.BillMissing
			run.Message = fmt.Sprintf("channel %s has no statement of %s yet: asked again every %s until %s", channel, date,
				r.cfg.Retry, clockText(r.cfg.GiveUp))
			log.Info("bill: not ready", "error", err.Error())
		} else {
			run.Message = fmt.Sprintf("channel %s: the statement of %s could not be fetched: %v", channel, date, err)
			log.Warn("bill: fetch failed", "error", err.Error())
		}
		if serr := r.save(ctx, run); serr != nil {
			return run, serr
		}
		if run.State == durable.BillError {
			return run, fmt.Errorf("%w: %s", ErrFetch, run.Message)
		}
		return run, nil
	}
	defer st.Close()
	run, err := r.cfg.Store.CompareBill(ctx, channel, day, func() (durable.BillRow, error) {
		row, err := st.Next()
		if err != nil {
			return durable.BillRow{}, err
		}
		return durable.BillRow{Kind: byte(row.Kind), Trade: row.Trade, RefundID: row.RefundID, OrderNo: row.OrderNo,
			Amount: row.Amount, TradeTotal: row.TradeTotal, Line: row.Line}, nil
	})
	fetched := now
	run.FetchedAt = &fetched
	if err != nil {
		if !errors.Is(err, bill.ErrFormat) && !errors.Is(err, bill.ErrTotals) && !errors.Is(err, query.ErrUnverified) && ctx.Err() == nil &&
			!isTransport(err) {
			return run, fmt.Errorf("bills: %s %s: %w", channel, date, err) // Postgres: nothing recorded
		}
		run.State, run.Message = durable.BillError, fmt.Sprintf("channel %s: the statement of %s was not compared, nothing applied: %v", channel, date, err)
		run.Categories = map[string]int{}
		log.Warn("bill: statement refused", "error", err.Error())
		if serr := r.save(ctx, run); serr != nil {
			return run, serr
		}
		if errors.Is(err, query.ErrUnverified) || isTransport(err) {
			return run, fmt.Errorf("%w: %s", ErrFetch, run.Message)
		}
		return run, nil
	}
	run.Bill.Fees = bill.FenOfFee(st.Totals().Fees)
	if err := r.act(ctx, channel, day, b); err != nil {
		return run, err
	}
	run.State = durable.BillOK
	if err := r.save(ctx, run); err != nil {
		return run, err
	}
	c := run.Categories
	if c[durable.BillChannelOnly]+c[durable.BillLedgerOnly]+c[durable.BillAmountMismatch] > 0 {
		log.Warn("bill: compared, with differences", "channel_only", c[durable.BillChannelOnly],
			"ledger_only", c[durable.BillLedgerOnly], "amount_mismatch", c[durable.BillAmountMismatch], "matched", c[durable.BillMatched])
	} else {
		log.Info("bill: compared", "matched", c[durable.BillMatched], "pending", c[durable.BillPending])
	}
	if _, err := r.cfg.Store.PruneBills(ctx, day.Date.Add(-r.cfg.Retention)); err != nil {
		log.Warn("bill: pruning old runs", "error", err.Error())
	}
	return run, nil
}

// isTransport reports whether err came from reading the channel's
// connection (the file cut off), not from the statement's content.
func isTransport(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF)
}

// save records run and counts it.
func (r *Runner) save(ctx context.Context, run durable.BillRun) error {
	if err := r.cfg.Store.SaveBillRun(ctx, run); err != nil {
		return err
	}
	r.cfg.OnRun(run.Channel, run.State)
	return nil
}

// itemPage is how many items are acted on per read.
const itemPage = 200

// act takes each item of the day not acted on yet and records what was
// done.
func (r *Runner) act(ctx context.Context, channel string, day durable.BillDay, b Biller) error {
	for after := int64(0); ; {
		items, err := r.cfg.Store.BillItems(ctx, channel, day, after, itemPage, true)
		if err != nil {
			return err
		}
		for _, it := range items {
			action, detail, err := r.actOn(ctx, channel, day, b, it)
			if err != nil {
				// Recorded as what happened; the day can be run again.
				action, detail = "error", err.Error()
				r.cfg.Logger.Warn("bill: acting on an item failed", "channel", channel, "bill_date", day.String(),
					"trade", it.Trade, "refund_id", it.RefundID, "error", err.Error())
			}
			if err := r.cfg.Store.SetBillItemAction(ctx, it.ID, action, detail); err != nil {
				return err
			}
		}
		if len(items) < itemPage {
			return nil
		}
		after = items[len(items)-1].ID
	}
}

// actOn acts on one item: a repair, or a review.
func (r *Runner) actOn(ctx context.Context, channel string, day durable.BillDay, b Biller, it durable.BillItem) (action, detail string, err error) {
	date := day.String()
	switch it.Category {
	case durable.BillAmountMismatch:
		return review(r.cfg.Store.BillReview(ctx, channel, date, it, durable.ReviewBillMismatch), durable.ReviewBillMismatch)
	case durable.BillLedgerOnly:
		return review(r.cfg.Store.BillReview(ctx, channel, date, it, durable.ReviewNotInBill), durable.ReviewNotInBill)
	case durable.BillChannelOnly:
	default:
		return "", "", fmt.Errorf("unknown category %q", it.Category)
	}
	trade := it.Trade[len(channel)+1:]
	dctx, cancel := context.WithTimeout(ctx, r.cfg.DecideTimeout)
	defer cancel()
	if it.Kind == "payment" {
		body := b.BillPayment(trade, it.OrderNo, deref(it.BillAmount))
		if it.Refunded {
			// Paid and refunded at the channel: never applied, for goods
			// would ship against money the buyer got back.
			err := r.cfg.Decider.ReviewStored(dctx, r.cfg.Authority, channel, body, durable.ReviewRefundedAtChannel)
			return review(err, durable.ReviewRefundedAtChannel)
		}
		return r.decide(dctx, channel, body)
	}
	// The trade's refunded total with this one, as the statements show it
	// (Alipay's refund_fee states that; WeChat Pay's each refund alone).
	refunded := max(deref(it.RefundedThrough), deref(it.BillAmount))
	total := deref(it.TradeTotal)
	if total == 0 {
		total = deref(it.BillAmount)
	}
	return r.decide(dctx, channel, b.BillRefund(trade, it.OrderNo, it.RefundID, total, deref(it.BillAmount), refunded))
}

// decide decides a repair through the same decision as a callback.
func (r *Runner) decide(ctx context.Context, channel string, body []byte) (string, string, error) {
	v, o, err := r.cfg.Decider.DecideStored(ctx, r.cfg.Authority, channel, body, true)
	if err != nil {
		return "", "", err
	}
	name := o.String()
	if o == edge.OutcomeReplayedDB {
		name = "replayed"
	}
	return name, v.Status, nil
}

// review names the action of an opened review.
func review(err error, reason durable.ReviewReason) (string, string, error) {
	if err != nil {
		return "", "", err
	}
	return "review", string(reason), nil
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// Run fetches on schedule while this node holds the bills' lock (durable's
// RunLeader: one node at a time), and stands by while another node does,
// until ctx ends.
func (r *Runner) Run(ctx context.Context) {
	r.cfg.Store.RunLeader(ctx, durable.LeaderConfig{Name: "bills", LockID: durable.BillsLockID, Retry: r.cfg.Poll,
		Eligible: func() bool { return len(*r.billers.Load()) > 0 }, OnState: r.cfg.OnState,
		OnError: func(err error) { r.cfg.Logger.Warn("bills", "error", err.Error()) },
	}, r.lead)
}

// lead runs what the schedule says is due, every Poll, while some channel
// has query credentials.
func (r *Runner) lead(ctx context.Context) error {
	for ctx.Err() == nil {
		if len(*r.billers.Load()) == 0 {
			return nil // the credentials went with a reload: another node may fetch
		}
		if err := r.Tick(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-r.cfg.Clock.After(r.cfg.Poll):
		}
	}
	return nil
}

// Tick runs, for each channel, the previous day when the schedule says it
// is due: past At in Zone, no ok run of it yet, its last attempt Retry ago
// or more; until GiveUp, and after it only a day never tried at all. An
// error reading the schedule ends the leadership (it is tried again).
func (r *Runner) Tick(ctx context.Context) error {
	now := r.cfg.Clock.Now().In(r.cfg.Zone)
	y, m, d := now.Date()
	midnight := time.Date(y, m, d, 0, 0, 0, 0, r.cfg.Zone)
	since := now.Sub(midnight)
	if since < r.cfg.At {
		return nil
	}
	day := durable.BillDay{Date: time.Date(y, m, d-1, 0, 0, 0, 0, r.cfg.Zone)}
	for _, ch := range r.Channels() {
		state, err := r.cfg.Store.BillRunState(ctx, ch, day)
		if err != nil {
			return err
		}
		key := ch + " " + day.String()
		r.mu.Lock()
		last, tried := r.tried[key]
		r.mu.Unlock()
		switch {
		case state == durable.BillOK:
			continue
		case since >= r.cfg.GiveUp && (tried || state != ""):
			continue // given up: the run stays missing (or error)
		case tried && now.Sub(last) < r.cfg.Retry:
			continue
		}
		r.mu.Lock()
		r.tried[key] = now
		for k, t := range r.tried {
			if now.Sub(t) > 48*time.Hour {
				delete(r.tried, k)
			}
		}
		r.mu.Unlock()
		if _, err := r.RunDay(ctx, ch, day.String()); err != nil && !errors.Is(err, ErrFetch) && !errors.Is(err, ErrInProgress) {
			r.cfg.Logger.Warn("bills: scheduled run", "channel", ch, "bill_date", day.String(), "error", err.Error())
		}
	}
	return nil
}
