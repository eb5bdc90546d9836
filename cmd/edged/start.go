package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/tern/v2/migrate"
)

// startBackoff bounds the waits between attempts to reach Postgres at
// start: short first, and capped low, so that a node serves within about
// a second of Postgres accepting (a refused connection costs nothing; the
// log shows one line per attempt).
const (
	startBackoffMin = 100 * time.Millisecond
	startBackoffMax = 500 * time.Millisecond
	// startAttemptMax bounds one attempt (connect, migrate, warm up): a
	// node waiting longer for another node's migration tries again.
	startAttemptMax = 15 * time.Second
)

// dbTarget is what start-up may say about DATABASE_URL: the URL with its
// password masked, and the hosts it names (with fallbacks, in order).
type dbTarget struct {
	redacted string
	hosts    []string
	user     string
}

// parseDatabaseURL checks DATABASE_URL once, before any waiting: a
// malformed one is a configuration error that no retry fixes.
func parseDatabaseURL(raw string) (dbTarget, error) {
	t := dbTarget{redacted: redactURL(raw)}
	cfg, err := pgconn.ParseConfig(raw)
	if err != nil {
		// pgconn's parse errors can quote the string: say only that it is malformed.
		return t, fmt.Errorf("DATABASE_URL %s is malformed", t.redacted)
	}
	t.user = cfg.User
	t.hosts = append(t.hosts, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	for _, fb := range cfg.Fallbacks {
		h := net.JoinHostPort(fb.Host, strconv.Itoa(int(fb.Port)))
		if !contains(t.hosts, h) {
			t.hosts = append(t.hosts, h)
		}
	}
	return t, nil
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// redactURL masks the password of a postgres:// URL (parsable or not) and
// of a "password=..." keyword, whatever else the string holds.
func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	raw = urlPassword.ReplaceAllString(raw, "${1}xxxxx@")
	return keywordPassword.ReplaceAllString(raw, "${1}xxxxx")
}

var (
	urlPassword     = regexp.MustCompile(`(?i)(://[^:/@\s]*:)[^@\s]*@`)
	keywordPassword = regexp.MustCompile(`(?i)(password=)[^&\s]*`)
)

// scrub removes the password from an error text, should a driver ever
// quote it.
func scrub(msg, raw string) string {
	if cfg, err := pgconn.ParseConfig(raw); err == nil && cfg.Password != "" {
		msg = strings.ReplaceAll(msg, cfg.Password, "xxxxx")
	}
	return msg
}

// errStartTimeout ends a start-up that waited -start-timeout for Postgres.
var errStartTimeout = errors.New("Postgres not ready")

// errStartRefused ends a start-up at once: Postgres answered with an error
// that no wait fixes (a refused login, a database that does not exist, a
// missing privilege, a schema from a newer build).
var errStartRefused = errors.New("Postgres refused this node")

// permanentStartError says what to fix when err is one that waiting never
// fixes; ok is false for errors that can pass (Postgres down, starting,
// in recovery, a failover under way, a lock held by another node).
func permanentStartError(err error, user string) (msg string, ok bool) {
	var bad migrate.BadVersionError
	if errors.As(err, &bad) {
		return fmt.Sprintf("the database's schema is from a newer build of edged (%s): run that build or a newer one", string(bad)), true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return "", false
	}
	switch pgErr.Code {
	case "28P01", "28000":
		return fmt.Sprintf("Postgres refused the login of user %q (SQLSTATE %s: %s): check the user and password in DATABASE_URL, "+
			"and pg_hba.conf for this host", user, pgErr.Code, pgErr.Message), true
	case "3D000":
		return fmt.Sprintf("the database named in DATABASE_URL does not exist (SQLSTATE 3D000: %s): create it (CREATE DATABASE ... OWNER %s) "+
			"or fix the URL", pgErr.Message, user), true
	case "42501":
		return fmt.Sprintf("user %q lacks a privilege edged needs to migrate the schema (SQLSTATE 42501: %s): make it the database's owner, "+
			"or as the owner run GRANT CREATE, USAGE ON SCHEMA public TO %s", user, pgErr.Message, user), true
	}
	return "", false
}

// waitForPostgres calls open until it succeeds, with capped exponential
// back-off and full jitter between attempts, for at most timeout (0: no
// limit); an error no wait fixes (permanentStartError) ends it at once,
// saying what to fix. Each failure is one log line (attempt, hosts, error, next wait),
// never the password. Past the timeout the error names DATABASE_URL
// (redacted), every host and the last error.
func waitForPostgres[T any](ctx context.Context, log *slog.Logger, raw string, t dbTarget, timeout time.Duration, open func(context.Context) (T, error)) (T, error) {
	var zero T
	deadline := time.Time{}
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	wait := startBackoffMin
	var last error
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, startAttemptMax)
		if !deadline.IsZero() {
			actx, cancel = context.WithDeadline(ctx, minTime(deadline, time.Now().Add(startAttemptMax)))
		}
		v, err := open(actx)
		cancel()
		if err == nil {
			if attempt > 1 {
				log.Info("postgres ready", "attempt", attempt)
			}
			return v, nil
		}
		last = err
		if ctx.Err() != nil {
			return zero, ctx.Err()
		}
		if msg, permanent := permanentStartError(err, t.user); permanent {
			return zero, fmt.Errorf("%w: %s", errStartRefused, scrub(msg, raw))
		}
		sleep := time.Duration(rand.Int64N(int64(wait))) + time.Millisecond
		if !deadline.IsZero() && time.Now().Add(sleep).After(deadline) {
			return zero, fmt.Errorf("%w after %v: DATABASE_URL=%s (hosts tried: %s): last error: %s",
				errStartTimeout, timeout, t.redacted, strings.Join(t.hosts, ", "), scrub(last.Error(), raw))
		}
		log.Warn("waiting for postgres", "attempt", attempt, "hosts", t.hosts,
			"error", scrub(err.Error(), raw), "next_wait", sleep.Round(time.Millisecond).String())
		select {
		case <-time.After(sleep):
		case <-ctx.Done():
			return zero, ctx.Err()
		}
		wait = min(wait*2, startBackoffMax)
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
