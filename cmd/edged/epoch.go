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

// cachePosition reads how far the store's database has written, for the
// claim cache's watermark.
func (m *Main) cachePosition(ctx context.Context) (uint64, error) {
	s := m.ready.Load()
	if s == nil {
		return 0, errStarting
	}
	return s.CachePosition(ctx)
}

// logEpochError logs a failed read of the cache epoch (the cache keeps the
// last one); it is not a Redis error, so notifyedge_cache_errors_total does
// not count it. Start-up, before Postgres is ready, is not a failure.
func logEpochError(log *slog.Logger, err error) bool {
	if errors.Is(err, claimcache.ErrBehind) {
		log.Error("the database is behind the cache's watermark and its epoch could not be moved on: the cache answers nothing until it is",
			"error", err.Error())
		return true
	}
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
	epochCauseCounter  = "counter"  // the operator counter: POST /cache/epoch, or another node's restore
	epochCauseRestore  = "restore"  // this node found the database behind the cache's watermark
)

// epochCauses lists the causes, for the metric's series.
var epochCauses = []string{epochCauseCluster, epochCauseTimeline, epochCauseCounter, epochCauseRestore}

// epochWatch logs and counts the cache epoch's changes by cause
// (notifyedge_cache_epoch_changes_total{cause}); the epoch read at start
// is not a change.
type epochWatch struct {
	mu   sync.Mutex
	last string
	// restoredTo is the epoch this node moved to on finding the database
	// behind the watermark: logged and counted already.
	restoredTo string
	changes    *prometheus.CounterVec
	log        *slog.Logger
}

func newEpochWatch(reg prometheus.Registerer, log *slog.Logger) (*epochWatch, error) {
	w := &epochWatch{log: log, changes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "notifyedge_cache_epoch_changes_total",
		Help: "Changes of the cache epoch this node saw, by cause: cluster (another database), timeline (a promotion, a point-in-time " +
			"recovery), counter (the operator's bump, or another node's restore), restore (this node found the database behind the cache's " +
			"watermark: restored from a snapshot or a base backup). After one, no entry cached before it answers a duplicate.",
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
	last, restored := w.last, w.restoredTo == e
	w.last = e
	w.mu.Unlock()
	if restored || last == e { // logged already, or not a change (a check that could not be made)
		return
	}
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

// restored logs and counts this node's finding: the database is at pos,
// behind epoch's watermark mark (it was restored from a snapshot or a base
// backup, which keep the epoch), and the cache moves on to next. At start
// too: it is not the first epoch read but a change.
func (w *epochWatch) restored(epoch, next string, pos, mark uint64) {
	w.mu.Lock()
	w.restoredTo = next
	w.mu.Unlock()
	w.changes.WithLabelValues(epochCauseRestore).Inc()
	w.log.Warn("the database is behind what the claim cache holds (restored from a snapshot or a base backup?): "+
		"the cache epoch moves on, and no entry cached before answers a duplicate; Postgres decides each key again",
		"from", epoch, "to", next, "database_position", pos, "watermark", mark)
}
