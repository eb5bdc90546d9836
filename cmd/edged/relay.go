package main

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/tracing/instrument"
)

// startRelay runs the outbox relay to EDGE_STREAM_URL in the background:
// leader on one node at a time, standby elsewhere. With -stream-replicas
// above the replicas the stream's Redis has online it warns at start,
// naming both; while too few replicas hold what it appended, the relay is
// "degraded" (its reason in /readyz's relay_detail), counts
// notifyedge_relay_replica_shortfall_total, and appends nothing twice. The
// stream's backlog by consumer group is read at scrape time.
func (m *Main) startRelay(ctx context.Context, metrics *edge.Metrics) error {
	client, err := redisstream.NewClient(m.Config.StreamURL)
	if err != nil {
		return err
	}
	m.relayClient = client
	if err := instrument.Redis(m.tracing, client); err != nil {
		return err
	}
	shortfall := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "notifyedge_relay_replica_shortfall_total",
		Help: "Relay publishes that fewer replicas of the stream's master held than -stream-replicas asks: the rows stay unpublished and are checked again.",
	})
	publisher := redisstream.NewPublisher(client, m.Config.StreamName, 0)
	for _, c := range []prometheus.Collector{shortfall, streamCollector{pub: publisher}} {
		if err := metrics.Registry.Register(c); err != nil {
			return fmt.Errorf("relay metrics: %w", err)
		}
	}
	publisher.Replicas = m.Config.StreamReplicas
	publisher.OnTrimError = func(err error) { m.Logger.Warn("outbox stream trim", "error", err.Error()) }
	if want := m.Config.StreamReplicas; want > 0 {
		if have, err := publisher.ConnectedReplicas(ctx); err != nil {
			m.Logger.Warn("stream replicas: could not count the stream's replicas", "error", err.Error())
		} else if have < want {
			m.Logger.Warn(fmt.Sprintf("stream replicas: -stream-replicas (EDGE_STREAM_REPLICAS) asks for %d, the stream's Redis has %d online: "+
				"an event is appended once and stays unpublished (relay degraded), the events behind it waiting, until enough replicas hold it; set it to %d or attach replicas", want, have, have),
				"stream_replicas", want, "connected_replicas", have)
		}
	}
	rctx, cancel := context.WithCancel(context.Background())
	m.stopRelay, m.relayDone = cancel, make(chan struct{})
	m.relayState.Store("standby")
	go func() {
		defer close(m.relayDone)
		m.store.RunRelay(rctx, durable.RelayConfig{
			Publisher: publisher,
			OnState: func(st string) {
				if st != "degraded" {
					m.relayDetail.Store("")
				}
				if m.relayState.Swap(st) != st {
					m.Logger.Info("outbox relay", "state", st)
				}
			},
			OnUnconfirmed: func(err error) {
				shortfall.Inc()
				// Logged once a degraded spell; /readyz has the latest.
				if m.relayDetail.Swap(err.Error()) == "" {
					m.Logger.Warn("outbox relay degraded", "error", err.Error())
				}
			},
			OnError: func(err error) { m.Logger.Warn("outbox relay", "error", err.Error()) },
		})
	}()
	return nil
}

var (
	descStreamEntries = prometheus.NewDesc("notifyedge_stream_entries",
		"Entries in the outbox stream. An entry a consumer group has not read and acknowledged is never trimmed, so a group that stops reading makes this grow.", nil, nil)
	descStreamBehind = prometheus.NewDesc("notifyedge_stream_group_behind",
		"Entries of the outbox stream the consumer group has not read, or has read and not acknowledged.", []string{"group"}, nil)
)

// streamCollector reads notifyedge_stream_entries and
// notifyedge_stream_group_behind from the stream's Redis at scrape time.
type streamCollector struct{ pub *redisstream.Publisher }

func (c streamCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descStreamEntries
	ch <- descStreamBehind
}

func (c streamCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	b, err := c.pub.Backlog(ctx)
	if err != nil {
		return // unreadable: the series go stale rather than read 0
	}
	ch <- prometheus.MustNewConstMetric(descStreamEntries, prometheus.GaugeValue, float64(b.Entries))
	for group, n := range b.Behind {
		ch <- prometheus.MustNewConstMetric(descStreamBehind, prometheus.GaugeValue, float64(n), group)
	}
}
