package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/notifyedge/notifyedge/claimcache"
)

// CacheEpoch reads the store's cache epoch: errStarting until Postgres is
// ready, so the cache answers nothing before it knows the epoch (Postgres
// decides, and the public listener is not open yet anyway).
func (l *lazyStore) CacheEpoch(ctx context.Context) (string, error) {
	s, err := l.get()
	if err != nil {
		return "", err
	}
	return s.CacheEpoch(ctx)
}

// BumpCacheEpoch serves POST /cache/epoch (503 while starting).
func (l *lazyStore) BumpCacheEpoch(ctx context.Context) (string, error) {
	s, err := l.get()
	if err != nil {
		return "", err
	}
	return s.BumpCacheEpoch(ctx)
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
