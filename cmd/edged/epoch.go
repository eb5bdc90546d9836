package main

import (
	"context"
	"errors"
	"log/slog"

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
