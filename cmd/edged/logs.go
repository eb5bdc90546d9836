package main

import (
	"context"
	"fmt"
	"log/slog"

	"golang.org/x/time/rate"
)

// redisLogger sends go-redis's own lines (a dial that failed, a pool that
// could not connect) into edged's JSON log instead of plain text on stderr,
// at a bounded rate: while Redis is down it would print one per attempt,
// and the breaker and the cache error counter already tell the story.
type redisLogger struct {
	log   *slog.Logger
	limit *rate.Limiter
}

func newRedisLogger(log *slog.Logger) *redisLogger {
	return &redisLogger{log: log, limit: rate.NewLimiter(1, 5)}
}

// Printf is go-redis's internal.Logging.
func (l *redisLogger) Printf(_ context.Context, format string, v ...any) {
	if l.limit.Allow() {
		l.log.Warn("redis client", "message", fmt.Sprintf(format, v...))
	}
}
