package edge

import (
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"
)

// httpLog is the HTTP layer's log. Rejected requests and fasthttp's own
// error lines share one rate limit, so one client sending garbage cannot
// fill the disk (a few lines a second at most, the rest counted as
// dropped). fasthttp's lines are redacted at the source: it copies the
// offending header or request bytes into its errors, and those may be a
// bearer token or a valid signature, so only addresses and numbers of a
// line survive.
type httpLog struct {
	log     *slog.Logger
	limit   *rate.Limiter
	dropped prometheus.Counter // nil: not counted
}

// newHTTPLog allows 5 lines a second with bursts of 20.
func newHTTPLog(log *slog.Logger, dropped prometheus.Counter) *httpLog {
	return &httpLog{log: log, limit: rate.NewLimiter(5, 20), dropped: dropped}
}

// NewHTTPLogger returns the HTTP layer's log for another listener of the
// process (the admin listener): the same redaction and rate limit.
func NewHTTPLogger(log *slog.Logger, dropped prometheus.Counter) fasthttp.Logger {
	return newHTTPLog(log, dropped)
}

// allow reports whether one more line may be written now.
func (l *httpLog) allow() bool {
	if l.limit.Allow() {
		return true
	}
	if l.dropped != nil {
		l.dropped.Inc()
	}
	return false
}

// Printf is fasthttp's Logger.
func (l *httpLog) Printf(format string, args ...any) {
	if !l.allow() {
		return
	}
	l.log.Warn("http layer error", "message", fmt.Sprintf(format, redact(args)...))
}

// redact keeps the arguments that cannot carry request bytes.
func redact(args []any) []any {
	safe := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case net.Addr:
			safe[i] = v.String()
		case int, int64, uint64, time.Duration:
			safe[i] = v
		default:
			safe[i] = "[redacted]"
		}
	}
	return safe
}
