package main

import (
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The result label values of notifyedge_forward_total.
const (
	resultDelivered = "delivered"
	resultRetried   = "retried"
	resultDead      = "dead"
)

// Metrics are the forwarder's Prometheus metrics.
type Metrics struct {
	// Registry holds every metric; the admin listener serves it.
	Registry *prometheus.Registry

	forward *prometheus.CounterVec
	active  prometheus.Gauge
	held    prometheus.Gauge
	lagFn   atomic.Pointer[func() float64]
}

// NewMetrics registers the forwarder's metrics on a registry of their own.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		forward: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifyedge_forward_total",
			Help: "Forwarded events by result: delivered (2xx, acknowledged), retried (a failed attempt that will be tried again), dead (moved to the dead-letter stream).",
		}, []string{"result"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifyedge_forward_active",
			Help: "1 while this forwarder holds its group's lease and forwards; 0 on standby.",
		}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifyedge_forward_held_orders",
			Help: "Orders waiting behind a failed event: its retry is scheduled or in flight, and the order's later events wait while other orders flow; 0 on standby.",
		}),
	}
	lag := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "notifyedge_forward_lag_seconds",
		Help: "Age (since XADD) of the oldest event this forwarder has read and not yet delivered or dead-lettered; 0 with nothing in hand or on standby.",
	}, func() float64 {
		if fn := m.lagFn.Load(); fn != nil {
			return (*fn)()
		}
		return 0
	})
	m.Registry.MustRegister(m.forward, m.active, m.held, lag,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every result shows from the start, so rate() and alerts see a 0.
	for _, r := range []string{resultDelivered, resultRetried, resultDead} {
		m.forward.WithLabelValues(r)
	}
	return m
}

func (m *Metrics) setLag(fn func() float64) {
	if fn == nil {
		m.lagFn.Store(nil)
		return
	}
	m.lagFn.Store(&fn)
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}
