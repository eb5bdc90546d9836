package edge

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/notifyedge/notifyedge/durable"
)

// GroupCommit is where group commit's counters are read (*durable.Store;
// nil stats when it is off).
type GroupCommit interface {
	GroupStats() *durable.GroupStats
}

// RegisterGroupCommit adds notifyedge_group_batches_total and
// notifyedge_group_deliveries_total{how}, read from g at scrape time:
// how deliveries were decided (batched, alone, handed back busy, retried
// after a failed batch) and how many batches; batched ÷ batches is the
// mean batch size.
func (m *Metrics) RegisterGroupCommit(g GroupCommit) {
	m.Registry.MustRegister(groupCollector{src: g})
}

var (
	descGroupBatches = prometheus.NewDesc("notifyedge_group_batches_total",
		"Batch transactions of group commit (two or more deliveries each).", nil, nil)
	descGroupDeliveries = prometheus.NewDesc("notifyedge_group_deliveries_total",
		"Deliveries by how group commit decided them: batched, alone (a transaction of its own), "+
			"busy (handed back by a batch: another transaction held its key or order), "+
			"retried (decided again alone after its batch failed).", []string{"how"}, nil)
)

type groupCollector struct{ src GroupCommit }

func (c groupCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descGroupBatches
	ch <- descGroupDeliveries
}

func (c groupCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.GroupStats()
	if st == nil {
		return
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(descGroupBatches, st.Batches.Load())
	counter(descGroupDeliveries, st.Batched.Load(), "batched")
	counter(descGroupDeliveries, st.Alone.Load(), "alone")
	counter(descGroupDeliveries, st.Busy.Load(), "busy")
	counter(descGroupDeliveries, st.Retried.Load(), "retried")
}
