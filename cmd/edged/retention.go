package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge"
)

// retentionConfig is durable's retention as the flags configure it.
func (c Config) retentionConfig() durable.RetentionConfig {
	return durable.RetentionConfig{ClaimRetention: c.ClaimRetention, OutboxRetention: c.OutboxRetention, ReviewRetention: c.ReviewRetention}
}

// startRetention runs retention in the background on every node (one at a
// time leads, durable.RunRetention) and registers its metrics:
// notifyedge_retention_deleted_total{table}, counted here as the leader
// deletes, and notifyedge_oldest_row_age_seconds{table}, read from
// Postgres at scrape time (whichever node leads, every node reports it).
func (m *Main) startRetention(metrics *edge.Metrics) error {
	cfg := m.Config.retentionConfig()
	if err := durable.ValidateRetention(cfg); err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	deleted := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "notifyedge_retention_deleted_total",
		Help: "Rows retention deleted on this node (while it leads), by table.",
	}, []string{"table"})
	for _, t := range durable.RetentionTables {
		deleted.WithLabelValues(t) // every table's series exists from the start, at 0
	}
	if err := metrics.Registry.Register(deleted); err != nil {
		return fmt.Errorf("retention metrics: %w", err)
	}
	if err := metrics.Registry.Register(&oldestRowCollector{store: m.store}); err != nil {
		return fmt.Errorf("retention metrics: %w", err)
	}
	cfg.OnDeleted = func(table string, n int64) { deleted.WithLabelValues(table).Add(float64(n)) }
	cfg.OnCycle = func(c durable.RetentionCycle) {
		for _, n := range c.Deleted {
			if n > 0 {
				m.Logger.Info("retention cycle", "deleted", c.Deleted, "took", c.Took.Round(time.Millisecond).String())
				return
			}
		}
	}
	var state atomic.Value
	cfg.OnState = func(st string) {
		if state.Swap(st) != st {
			m.Logger.Info("retention", "state", st)
		}
	}
	cfg.OnError = func(err error) { m.Logger.Warn("retention", "error", err.Error()) }
	ctx, cancel := context.WithCancel(context.Background())
	m.stopRetention, m.retentionDone = cancel, make(chan struct{})
	go func() {
		defer close(m.retentionDone)
		m.store.RunRetention(ctx, cfg) // validated above: it returns when ctx ends
	}()
	return nil
}

var descOldestRowAge = prometheus.NewDesc("notifyedge_oldest_row_age_seconds",
	"Age of the oldest row retention deletes once old enough, by table (claims by created_at, published outbox rows by published_at, "+
		"consumer-inbox rows by processed_at, resolved review rows by resolved_at; 0 when none): above its retention plus a few minutes, "+
		"retention is not keeping up.", []string{"table"}, nil)

// oldestRowCollector reads notifyedge_oldest_row_age_seconds from Postgres
// at scrape time, on the operator pool (one index probe per table).
type oldestRowCollector struct{ store *durable.Store }

func (c *oldestRowCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descOldestRowAge }

func (c *oldestRowCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ages, err := c.store.OldestRowAges(ctx)
	if err != nil {
		return // no figure rather than a wrong one; notifyedge_backlog_scrape_ok tells Postgres is unreadable
	}
	for _, t := range durable.RetentionTables {
		ch <- prometheus.MustNewConstMetric(descOldestRowAge, prometheus.GaugeValue, ages[t].Seconds(), t)
	}
}
