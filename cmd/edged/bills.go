package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/admin"
	"github.com/notifyedge/notifyedge/edge/reconcile"
	"github.com/notifyedge/notifyedge/edge/reconcile/bills"
)

// billMetrics are the daily bills' metrics: notifyedge_bill_runs_total
// counted by the node that ran, and notifyedge_bill_items and
// notifyedge_bill_last_ok_seconds read from Postgres at scrape time (every
// node reports the same figures, whichever ran).
type billMetrics struct {
	runs *prometheus.CounterVec
}

// billGauges reads the runs' figures (*durable.Store).
type billGauges interface {
	BillGauges(ctx context.Context) (map[string]durable.BillGauge, error)
}

func newBillMetrics(reg prometheus.Registerer, store billGauges, on func() bool) (*billMetrics, error) {
	m := &billMetrics{runs: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "notifyedge_bill_runs_total",
		Help: "Daily statements fetched and compared, by result: ok, missing (not ready, or given up), error (not fetched, " +
			"failed verification, or failed its own totals: nothing applied).",
	}, []string{"channel", "result"})}
	for _, c := range []prometheus.Collector{m.runs, &billCollector{store: store, on: on}} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("bill metrics: %w", err)
		}
	}
	return m, nil
}

// channels makes every result's series of each channel exist from the
// start, at 0.
func (m *billMetrics) channels(names []string) {
	for _, n := range names {
		for _, r := range []string{durable.BillOK, durable.BillMissing, durable.BillError} {
			m.runs.WithLabelValues(n, r)
		}
	}
}

var (
	descBillItems = prometheus.NewDesc("notifyedge_bill_items",
		"The latest run's rows and ledger entries by category: matched, channel_only (repaired: each is a lost callback), "+
			"ledger_only (recorded here, in no statement), amount_mismatch, pending (waiting for the next day's statement).",
		[]string{"channel", "category"}, nil)
	descBillLastOK = prometheus.NewDesc("notifyedge_bill_last_ok_seconds",
		"Unix time of the channel's last ok run (0 when none): more than a day and the give-up time old, a day was not compared.",
		[]string{"channel"}, nil)
)

// billCollector reads the runs' figures at scrape time, on the operator
// pool; a node that does not run bills reports none.
type billCollector struct {
	store billGauges
	on    func() bool
}

func (c *billCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descBillItems
	ch <- descBillLastOK
}

func (c *billCollector) Collect(ch chan<- prometheus.Metric) {
	if !c.on() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	gauges, err := c.store.BillGauges(ctx)
	if err != nil {
		return // no figure rather than a wrong one
	}
	for name, g := range gauges {
		last := 0.0
		if g.LastOK.Unix() > 0 {
			last = float64(g.LastOK.Unix())
		}
		ch <- prometheus.MustNewConstMetric(descBillLastOK, prometheus.GaugeValue, last, name)
		for _, cat := range durable.BillCategories {
			ch <- prometheus.MustNewConstMetric(descBillItems, prometheus.GaugeValue, float64(g.Categories[cat]), name, cat)
		}
	}
}

// adminBills adapts the runner and the store to the admin listener's
// /bills endpoints.
type adminBills struct {
	r     *bills.Runner
	store *durable.Store
	zone  *time.Location
}

func (a adminBills) RunDay(ctx context.Context, channel, date string) (durable.BillRun, error) {
	run, err := a.r.RunDay(ctx, channel, date)
	switch {
	case errors.Is(err, bills.ErrNoBiller):
		err = fmt.Errorf("%w: %w", admin.ErrNoBiller, err)
	case errors.Is(err, bills.ErrInProgress):
		err = fmt.Errorf("%w: %w", admin.ErrBillInProgress, err)
	case errors.Is(err, bills.ErrFetch):
		err = fmt.Errorf("%w: %w", admin.ErrBillFetch, err)
	}
	return run, err
}

func (a adminBills) BillRuns(ctx context.Context, q durable.BillRunQuery) ([]durable.BillRun, error) {
	return a.store.BillRuns(ctx, q)
}

func (a adminBills) BillRunOf(ctx context.Context, channel, date string) (durable.BillRun, error) {
	day, err := durable.NewBillDay(date, a.zone)
	if err != nil {
		return durable.BillRun{}, err
	}
	return a.store.BillRunOf(ctx, channel, day)
}

// startBills builds the bills' runner over the store and the channels'
// clients and, unless -bills=false, runs the schedule in the background
// (one node at a time fetches; the others stand by). POST /bills runs a
// day whatever -bills says.
func (m *Main) startBills(metrics *edge.Metrics) error {
	cfg := m.Config
	on := func() bool {
		m.qmu.Lock()
		r := m.billRunner
		m.qmu.Unlock()
		return r != nil && len(r.Channels()) > 0
	}
	bm, err := newBillMetrics(metrics.Registry, m.store, on)
	if err != nil {
		return err
	}
	r, err := bills.New(bills.Config{
		Store: m.store, Decider: m.server, Authority: opsAuthority{m.store},
		Zone: cfg.BillsZone, At: cfg.BillsAt, GiveUp: cfg.BillsGiveUp, Retention: cfg.BillRetention,
		OnRun: func(ch, state string) { bm.runs.WithLabelValues(ch, state).Inc() },
		OnState: func(st string) {
			if m.billsState.Swap(st) != st {
				m.Logger.Info("bills", "state", st)
			}
		},
		Logger: m.Logger,
	})
	if err != nil {
		return err
	}
	m.qmu.Lock()
	m.billRunner, m.billMetrics = r, bm
	qs := m.queriers
	m.qmu.Unlock()
	m.setBillers(qs)
	if !cfg.Bills {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.stopBills, m.billsDone = cancel, make(chan struct{})
	go func() {
		defer close(m.billsDone)
		r.Run(ctx)
	}()
	return nil
}

// setBillers hands the runner the channels whose clients fetch
// statements (every query client does), at start and on each reload.
func (m *Main) setBillers(qs map[string]reconcile.Querier) {
	bs := map[string]bills.Biller{}
	names := make([]string, 0, len(qs))
	for n, q := range qs {
		if b, ok := q.(bills.Biller); ok {
			bs[n] = b
			names = append(names, n)
		}
	}
	m.qmu.Lock()
	r, bm := m.billRunner, m.billMetrics
	m.qmu.Unlock()
	if r == nil {
		return
	}
	r.SetBillers(bs)
	bm.channels(names)
}
