package edge

import (
	"sync/atomic"
	"testing"
	"time"
)

// The metrics' cost on the hot path: one counter Inc and one histogram
// Observe per request, beside a bare atomic add.
func BenchmarkMetricsObserve(b *testing.B) {
	m := NewMetrics([]string{"acme"})
	name := []byte("acme")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.observe(m.channel(name), OutcomeReplayedCache, PathCache, 300*time.Microsecond)
		}
	})
}

func BenchmarkAtomicAdd(b *testing.B) {
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n.Add(1)
		}
	})
}
