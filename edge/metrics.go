package edge

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/notifyedge/notifyedge/durable"
)

// Metrics are notifyedge's Prometheus metrics (the README's names). The
// counters and histograms of each (channel, outcome) and (channel, path) are
// resolved once, so a request does no label lookup and no allocation.
type Metrics struct {
	// Registry holds every metric; the admin listener serves it.
	Registry *prometheus.Registry
	// CacheErrors counts Redis errors and timeouts.
	CacheErrors prometheus.Counter
	// BreakerOpen is 1 while a cache breaker is open, by node: "" for a
	// single Redis, a master's address on a Redis Cluster (one breaker per
	// master).
	BreakerOpen *prometheus.GaugeVec
	// ConnsRefused counts connections the public listener refused, by
	// reason (per_ip, total).
	ConnsRefused *prometheus.CounterVec
	// LogsDropped counts log lines the rate limit dropped.
	LogsDropped prometheus.Counter
	// Starting is 1 while the process waits for Postgres at start.
	Starting prometheus.Gauge

	byChannel map[string]*channelMetrics
	unknown   *channelMetrics
}

// Path is the histogram's path label: where the answer came from.
type Path uint8

// The request paths of notifyedge_request_duration_seconds.
const (
	PathCache Path = iota
	PathDurable
	PathRejected
	numPaths
)

var pathLabels = [numPaths]string{"cache", "durable", "rejected"}

type channelMetrics struct {
	requests [numOutcomes]prometheus.Counter
	duration [numPaths]prometheus.Observer
}

// UnknownChannel is the channel label of requests for a channel that is not
// configured: attackers must not mint label values.
const UnknownChannel = "unknown"

// latencyBuckets cover a 200 ms budget finely and its breaches coarsely.
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .15, .2, .3, .5, 1, 2.5}

// NewMetrics registers the metrics for the configured channel names.
func NewMetrics(channels []string) *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "notifyedge_requests_total",
		Help: "Callback requests by channel and outcome.",
	}, []string{"channel", "outcome"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "notifyedge_request_duration_seconds",
		Help:    "Time from request read to response, by channel and path (cache, durable, rejected).",
		Buckets: latencyBuckets,
	}, []string{"channel", "path"})
	m := &Metrics{
		Registry: reg,
		CacheErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "notifyedge_cache_errors_total",
			Help: "Redis errors and timeouts on the claim cache (each sent the request to Postgres).",
		}),
		BreakerOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "notifyedge_cache_breaker_open",
			Help: "1 while a cache breaker is open (that Redis node's keys go to Postgres), else 0; by node (a Redis Cluster master's address, \"\" for a single Redis).",
		}, []string{"node"}),
		ConnsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifyedge_connections_refused_total",
			Help: "Connections the public listener refused: per_ip (one address over its cap) or total.",
		}, []string{"reason"}),
		LogsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "notifyedge_log_lines_dropped_total",
			Help: "Log lines of rejected requests and HTTP-layer errors dropped by the log rate limit.",
		}),
		Starting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifyedge_starting",
			Help: "1 while edged waits for Postgres at start (connect, migrate, warm-up), else 0.",
		}),
		byChannel: make(map[string]*channelMetrics, len(channels)),
	}
	m.BreakerOpen.WithLabelValues("") // a single Redis's breaker reads 0 from the start
	reg.MustRegister(requests, duration, m.CacheErrors, m.BreakerOpen, m.ConnsRefused, m.LogsDropped, m.Starting)
	resolve := func(name string) *channelMetrics {
		cm := &channelMetrics{}
		for o := range numOutcomes {
			cm.requests[o] = requests.WithLabelValues(name, o.String())
		}
		for p := range numPaths {
			cm.duration[p] = duration.WithLabelValues(name, pathLabels[p])
		}
		return cm
	}
	for _, name := range channels {
		m.byChannel[name] = resolve(name)
	}
	m.unknown = resolve(UnknownChannel)
	return m
}

// channel returns the metrics of a channel name (request-scoped bytes).
func (m *Metrics) channel(name []byte) *channelMetrics {
	if cm, ok := m.byChannel[string(name)]; ok {
		return cm
	}
	return m.unknown
}

// observe counts one answered request.
func (m *Metrics) observe(cm *channelMetrics, o Outcome, p Path, elapsed time.Duration) {
	cm.requests[o].Inc()
	cm.duration[p].Observe(elapsed.Seconds())
}

// Backlog reads the queues an operator must watch. durable.Store
// satisfies it.
type Backlog interface {
	OpenReviews(ctx context.Context) (map[durable.ReviewReason]int64, error)
	OutboxBacklog(ctx context.Context) (durable.Backlog, error)
}

// RegisterBacklog adds notifyedge_review_open{reason},
// notifyedge_outbox_pending and notifyedge_outbox_oldest_pending_seconds,
// read from b at scrape time (Postgres is the truth; nothing is cached).
func (m *Metrics) RegisterBacklog(b Backlog) {
	m.Registry.MustRegister(&backlogCollector{src: b})
}

var (
	descReviewOpen = prometheus.NewDesc("notifyedge_review_open",
		"Open review rows by reason: each needs a human.", []string{"reason"}, nil)
	descOutboxPending = prometheus.NewDesc("notifyedge_outbox_pending",
		"Outbox rows not yet acknowledged by the broker (counted up to a cap: see notifyedge_outbox_pending_exact).", nil, nil)
	descOutboxExact = prometheus.NewDesc("notifyedge_outbox_pending_exact",
		"1 when notifyedge_outbox_pending is the exact count, 0 when the count stopped at its cap (the backlog is larger).", nil, nil)
	descOutboxOldest = prometheus.NewDesc("notifyedge_outbox_oldest_pending_seconds",
		"Age of the oldest unpublished outbox row (0 when none).", nil, nil)
	descBacklogUp = prometheus.NewDesc("notifyedge_backlog_scrape_ok",
		"1 when the review and outbox gauges could be read from Postgres.", nil, nil)
)

type backlogCollector struct{ src Backlog }

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descReviewOpen
	ch <- descOutboxPending
	ch <- descOutboxOldest
	ch <- descOutboxExact
	ch <- descBacklogUp
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ok := 1.0
	if open, err := c.src.OpenReviews(ctx); err == nil {
		for reason, n := range open {
			ch <- prometheus.MustNewConstMetric(descReviewOpen, prometheus.GaugeValue, float64(n), string(reason))
		}
	} else {
		ok = 0
	}
	if b, err := c.src.OutboxBacklog(ctx); err == nil {
		exact := 0.0
		if b.Exact {
			exact = 1
		}
		ch <- prometheus.MustNewConstMetric(descOutboxPending, prometheus.GaugeValue, float64(b.Pending))
		ch <- prometheus.MustNewConstMetric(descOutboxOldest, prometheus.GaugeValue, b.Oldest.Seconds())
		ch <- prometheus.MustNewConstMetric(descOutboxExact, prometheus.GaugeValue, exact)
	} else {
		ok = 0
	}
	ch <- prometheus.MustNewConstMetric(descBacklogUp, prometheus.GaugeValue, ok)
}
