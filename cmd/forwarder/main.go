// Command forwarder is the second reference consumer of the outbox stream:
// it reads the stream in a consumer group and POSTs every event to
// FORWARD_URL as a Standard Webhooks message (webhook-id = the row's
// event_id), acknowledging only after a 2xx. Each order's events reach the receiver
// in outbox order: one forwarder per group is active (a lease in Redis),
// and within it each order's events go one by one while other orders go
// beside them, so an order whose receiver refuses it holds back only its
// own later events. An event that fails for longer than FORWARD_MAX_AGE
// moves to the dead-letter stream with every later event of its order;
// -redrive-dead delivers them once the receiver is fixed.
//
//	EDGE_STREAM_URL=redis://... FORWARD_URL=https://... FORWARD_SECRET=whsec_... forwarder [flags]
//	... forwarder -redrive-dead     (with no forwarder of the group running)
//	forwarder secret                (prints a new FORWARD_SECRET)
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/tracing"
	"github.com/notifyedge/notifyedge/edge/tracing/instrument"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options is the command line and environment, parsed.
type options struct {
	streamURL   string
	cfg         Config
	adminListen string
	redrive     bool
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "secret" {
		return printSecret(stdout, stderr)
	}
	opts, err := parseOptions(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "forwarder:", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	// go-redis prints its own plain-text lines otherwise, which would break
	// the JSON log stream.
	redis.SetLogger(&redisLogger{log: log, limit: rateLog{every: time.Second}})
	client, err := redisstream.NewClient(opts.streamURL)
	if err != nil {
		fmt.Fprintln(stderr, "forwarder: EDGE_STREAM_URL:", err)
		return 2
	}
	defer client.Close()
	cfg := opts.cfg
	cfg.Client, cfg.Logger, cfg.Metrics = client, log, NewMetrics()
	// With an OTLP endpoint in the environment, each send is a span of the
	// callback's trace (the SDK reads its own variables).
	tp, err := tracing.Setup(ctx, "forwarder", getenv)
	if err != nil {
		fmt.Fprintln(stderr, "forwarder:", err)
		return 2
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		tp.Shutdown(sctx)
		cancel()
	}()
	cfg.Tracer = tp.Tracer("github.com/notifyedge/notifyedge/cmd/forwarder")
	if err := instrument.Redis(tp, client); err != nil {
		fmt.Fprintln(stderr, "forwarder:", err)
		return 2
	}

	if opts.redrive {
		res, err := Redrive(ctx, cfg)
		if err != nil {
			log.Error("re-drive failed", "error", err.Error(), "delivered", res.Delivered)
			return 1
		}
		if res.Remaining > 0 {
			log.Error("re-drive left entries in the dead-letter stream", "remaining", res.Remaining,
				"still_dead_orders", res.StillDead)
			return 1
		}
		return 0
	}

	ln, err := net.Listen("tcp", opts.adminListen)
	if err != nil {
		fmt.Fprintln(stderr, "forwarder: admin listener:", err)
		return 1
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", cfg.Metrics.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "ok\n")
	})
	admin := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := admin.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin listener", "error", err.Error())
		}
	}()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		admin.Shutdown(sctx)
		cancel()
	}()

	target, _ := url.Parse(cfg.URL)
	log.Info("forwarder starting", "stream", cfg.Stream, "group", cfg.Group, "name", cfg.Name,
		"url", target.Redacted(), "dead_stream", cfg.DeadStream, "partitions", cfg.Partitions, "max_held", cfg.MaxHeld,
		"max_age", cfg.MaxAge.String(), "admin", ln.Addr().String())
	if err := Run(ctx, cfg); err != nil {
		log.Error("forwarder stopped", "error", err.Error())
		return 1
	}
	log.Info("forwarder stopped")
	return 0
}

// parseOptions reads flags, whose defaults come from the environment.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	var errs []error
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	dur := func(name string, def time.Duration) time.Duration {
		v := getenv(name)
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("%s: %q is not a positive duration", name, v))
			return def
		}
		return d
	}
	num := func(name string, def int) int {
		v := getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			errs = append(errs, fmt.Errorf("%s: %q is not a positive integer", name, v))
			return def
		}
		return n
	}
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("forwarder", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &o.cfg
	fs.StringVar(&c.Group, "group", env("FORWARD_GROUP", "forwarder"), "consumer group (FORWARD_GROUP)")
	fs.StringVar(&c.Name, "name", env("FORWARD_NAME", fmt.Sprintf("%s-%d", host, os.Getpid())), "consumer name within the group (FORWARD_NAME)")
	fs.StringVar(&c.DeadStream, "dead-stream", getenv("FORWARD_DEAD_STREAM"), "dead-letter stream (FORWARD_DEAD_STREAM; default <stream>:dead)")
	fs.DurationVar(&c.Timeout, "timeout", dur("FORWARD_TIMEOUT", 10*time.Second), "HTTP timeout of one POST, response included (FORWARD_TIMEOUT)")
	fs.DurationVar(&c.MaxAge, "max-age", dur("FORWARD_MAX_AGE", 24*time.Hour), "an event failing longer than this after it was published is dead-lettered (FORWARD_MAX_AGE)")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", dur("FORWARD_LEASE_TTL", 10*time.Second), "single-active-forwarder lease; a killed forwarder's successor waits up to this (FORWARD_LEASE_TTL)")
	fs.DurationVar(&c.BackoffMin, "backoff-min", dur("FORWARD_BACKOFF_MIN", 100*time.Millisecond), "first retry delay ceiling (full jitter) (FORWARD_BACKOFF_MIN)")
	fs.DurationVar(&c.BackoffMax, "backoff-max", dur("FORWARD_BACKOFF_MAX", 30*time.Second), "retry delay cap (FORWARD_BACKOFF_MAX)")
	fs.IntVar(&c.Partitions, "partitions", num("FORWARD_PARTITIONS", 8), "events POSTed at once, each of a different order; one order's events always go one by one (FORWARD_PARTITIONS)")
	fs.IntVar(&c.MaxHeld, "max-held", num("FORWARD_MAX_HELD", 100000), "events of orders held behind a failed event kept in memory; beyond it, reading pauses (FORWARD_MAX_HELD)")
	fs.DurationVar(&c.RedriveGiveUp, "redrive-give-up", dur("FORWARD_REDRIVE_GIVE_UP", time.Minute), "with -redrive-dead: how long to retry one entry before leaving its order dead (FORWARD_REDRIVE_GIVE_UP)")
	fs.StringVar(&o.adminListen, "admin-listen", env("FORWARD_ADMIN_LISTEN", "127.0.0.1:9091"), "admin listener for /metrics and /healthz (FORWARD_ADMIN_LISTEN)")
	fs.BoolVar(&o.redrive, "redrive-dead", false, "deliver the dead-letter stream in order, clear the orders delivered, and exit (0 when it is empty)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	o.streamURL = getenv("EDGE_STREAM_URL")
	if o.streamURL == "" {
		errs = append(errs, errors.New("EDGE_STREAM_URL is required"))
	}
	c.Stream = env("EDGE_STREAM_NAME", redisstream.DefaultStream)
	if c.DeadStream == "" {
		c.DeadStream = c.Stream + deadSuffix
	}
	c.URL = getenv("FORWARD_URL")
	if u, err := url.Parse(c.URL); c.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, errors.New("FORWARD_URL is required: an http:// or https:// URL"))
	}
	c.Secret = getenv("FORWARD_SECRET")
	if file := getenv("FORWARD_SECRET_FILE"); c.Secret == "" && file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			errs = append(errs, fmt.Errorf("FORWARD_SECRET_FILE: %w", err))
		}
		c.Secret = strings.TrimSpace(string(b))
	}
	if c.Secret == "" {
		errs = append(errs, errors.New("FORWARD_SECRET (or FORWARD_SECRET_FILE) is required"))
	} else if _, err := channel.DecodeWebhookSecret(c.Secret); err != nil {
		// The error names the rule, never the key.
		errs = append(errs, fmt.Errorf("FORWARD_SECRET: %w", err))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"-timeout", c.Timeout}, {"-max-age", c.MaxAge}, {"-lease-ttl", c.LeaseTTL}, {"-backoff-min", c.BackoffMin}, {"-backoff-max", c.BackoffMax}, {"-redrive-give-up", c.RedriveGiveUp}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", d.name))
		}
	}
	if c.LeaseTTL < time.Second {
		errs = append(errs, errors.New("-lease-ttl must be at least 1s"))
	}
	if c.Partitions <= 0 {
		errs = append(errs, errors.New("-partitions must be positive"))
	}
	if c.MaxHeld <= 0 {
		errs = append(errs, errors.New("-max-held must be positive"))
	}
	return o, errors.Join(errs...)
}

// redisLogger routes go-redis's own log lines into slog, at a bounded rate.
type redisLogger struct {
	log   *slog.Logger
	limit rateLog
}

// Printf implements go-redis's logger.
func (l *redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if ok, suppressed := l.limit.allow(); ok {
		l.log.Warn("go-redis", "message", fmt.Sprintf(format, v...), "suppressed", suppressed)
	}
}

// printSecret writes a new signing secret for FORWARD_SECRET and the
// receiver: "whsec_" and 32 random bytes in base64, the form the Standard
// Webhooks libraries read.
func printSecret(stdout, stderr io.Writer) int {
	var key [32]byte
	if _, err := rand.Read(key[:]); err != nil {
		fmt.Fprintln(stderr, "forwarder secret:", err)
		return 1
	}
	fmt.Fprintln(stdout, "whsec_"+base64.StdEncoding.EncodeToString(key[:]))
	return 0
}
