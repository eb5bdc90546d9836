package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/notifyedge/notifyedge/claimcache"
)

// errStarting is the cache epoch's read while edged still waits for
// Postgres: the cache answers nothing before it knows the epoch (Postgres
// decides, and the public listener is not open yet anyway).
var errStarting = errors.New("edged is starting: Postgres is not ready yet")

// cacheEpoch reads the store's cache epoch for the claim cache.
func (m *Main) cacheEpoch(ctx context.Context) (string, error) {
	s := m.ready.Load()
	if s == nil {
		return "", errStarting
	}
	return s.CacheEpoch(ctx)
}

// logEpochError logs a failed read of the cache epoch (the cache keeps the
// last one); it is not a Redis error, so notifyedge_cache_errors_total does
// not count it. Start-up, before Postgres is ready, is not a failure.
func logEpochError(log *slog.Logger, err error) bool {
	if !errors.Is(err, claimcache.ErrEpoch) {
		return false
	}
	if !errors.Is(err, errStarting) {
		log.Warn("cache epoch not read: the cache keeps answering under the last one", "error", err.Error())
	}
	return true
}

// The causes of a cache epoch change, by the part of the epoch
// ("<system identifier>-<timeline>-<counter>") that moved.
const (
	epochCauseCluster  = "cluster"  // another system identifier: another cluster, a logical restore into a fresh one
	epochCauseTimeline = "timeline" // a promoted standby, the end of a point-in-time recovery
	epochCauseCounter  = "counter"  // the operator counter: POST /cache/epoch
)

// epochCauses lists the causes, for the metric's series.
var epochCauses = []string{epochCauseCluster, epochCauseTimeline, epochCauseCounter}

// epochWatch logs and counts the cache epoch's changes by cause
// (notifyedge_cache_epoch_changes_total{cause}); the epoch read at start
// is not a change.
type epochWatch struct {
	mu      sync.Mutex
	last    string
	changes *prometheus.CounterVec
	log     *slog.Logger
}

func newEpochWatch(reg prometheus.Registerer, log *slog.Logger) (*epochWatch, error) {
	w := &epochWatch{log: log, changes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "notifyedge_cache_epoch_changes_total",
		Help: "Changes of the cache epoch this node saw, by cause: cluster (another database), timeline (a promotion, a point-in-time " +
			"recovery), counter (the operator's bump). After one, no entry cached before it answers a duplicate.",
	}, []string{"cause"})}
	for _, c := range epochCauses {
		w.changes.WithLabelValues(c)
	}
	if err := reg.Register(w.changes); err != nil {
		return nil, err
	}
	return w, nil
}

// seen is the claim cache's OnEpoch: the first epoch is logged, each
// change after it logged at WARN and counted.
func (w *epochWatch) seen(e string) {
	w.mu.Lock()
	last := w.last
	w.last = e
	w.mu.Unlock()
	if last == "" {
		w.log.Info("cache epoch", "epoch", e)
		return
	}
	cause := epochCause(last, e)
	w.changes.WithLabelValues(cause).Inc()
	w.log.Warn("cache epoch changed: no entry cached before answers a duplicate; Postgres decides each key again",
		"from", last, "to", e, "cause", cause)
}

// epochCause names what moved between two epochs.
func epochCause(from, to string) string {
	f, t := strings.Split(from, "-"), strings.Split(to, "-")
	switch {
	case len(f) != 3 || len(t) != 3 || f[0] != t[0]:
		return epochCauseCluster
	case f[1] != t[1]:
		return epochCauseTimeline
	}
	return epochCauseCounter
}
