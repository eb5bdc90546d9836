// Command edgebench is bench's thin main.
//
//	edgebench demo [-orders 1000]              the incident replayed: naive design vs notifyedge
//	edgebench lag [-rate 1000 -duration 10s]   outbox lag at a steady callback rate
//	edgebench run [-duration 10s -workers 64]   every load scenario and ceiling: speed, CPU per request, invariants
//	edgebench compare -old a.json,b.json -new c.json,d.json
//	                                            two builds' runs side by side: medians and ratios
//	edgebench bills -edged bin/edged [-rows 100000,1000000]
//	                                            a daily statement fetched and compared: time and edged's peak memory
//	edgebench scale -edged bin/edged -shipper bin/shipper
//	                                            three edged behind haproxy, a Redis Cluster, a synchronous
//	                                            standby; kills a node, a Redis master and the primary
//	edgebench ha -edged bin/edged [-modes sync,async,sync-before]
//	                                            three edged behind haproxy on Postgres managed by Patroni
//	                                            and etcd: a switchover, the leader killed, etcd's leader
//	                                            killed, the standby restarted
//	edgebench soak -edged bin/edged -shipper bin/shipper -forwarder bin/forwarder [-duration 1h]
//	                                            an hour at half the peak with retention and the relay
//	                                            running: latency and memory over time
//	edgebench bloat [-claims 1000000 -week 3m30s -weeks 2]
//	                                            a week of claims and outbox rows turned over in minutes
//	                                            under retention and autovacuum: the tables' sizes by day
//	edgebench plot -json FILE [-out DIR]         a run's retention plots drawn again from its JSON file
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/notifyedge/notifyedge/bench"
)

func main() {
	// The bench runs the edge, the relay and the shipper as this binary
	// re-executed: such a process serves its part and never returns here.
	bench.ChildMain()
	if len(os.Args) > 1 && os.Args[1] == "lag" {
		lag(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "run" {
		run(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "compare" {
		compare(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "bills" {
		bills(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "scale" {
		scale(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "ha" {
		ha(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "soak" {
		soak(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "bloat" {
		bloat(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "plot" {
		replot(os.Args[2:])
		return
	}
	if len(os.Args) < 2 || os.Args[1] != "demo" {
		fmt.Fprintln(os.Stderr, "usage: edgebench run|demo|lag|compare|bills|scale|ha|soak|bloat|plot [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("edgebench demo", flag.ExitOnError)
	orders := fs.Int("orders", 1000, "orders to replay the incident on")
	workers := fs.Int("workers", 32, "orders in flight at once")
	fs.Parse(os.Args[2:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := bench.RunIncident(ctx, bench.IncidentConfig{Orders: *orders, Workers: *workers, Progress: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "edgebench:", err)
		os.Exit(1)
	}
	fmt.Print(rep.Table())
	if rep.NotifyEdge.ShippedTwice != 0 {
		fmt.Fprintln(os.Stderr, "edgebench: notifyedge shipped an order twice")
		os.Exit(1)
	}
}

func lag(args []string) {
	fs := flag.NewFlagSet("edgebench lag", flag.ExitOnError)
	rate := fs.Int("rate", 1000, "first deliveries per second")
	duration := fs.Duration("duration", 10*time.Second, "how long to send")
	fs.Parse(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := bench.RunLag(ctx, bench.LagConfig{Rate: *rate, Duration: *duration, Progress: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "edgebench:", err)
		os.Exit(1)
	}
	fmt.Print(rep.Table())
}

// replot draws again the plots a run's JSON file holds the figures for
// (its retention rows' p99 by second).
func replot(args []string) {
	fs := flag.NewFlagSet("edgebench plot", flag.ExitOnError)
	from := fs.String("json", "", "a run's JSON file (edgebench run -out)")
	out := fs.String("out", "bench/results", "directory for the plots")
	fs.Parse(args)
	if *from == "" && fs.NArg() == 1 {
		*from = fs.Arg(0)
	}
	if *from == "" {
		fmt.Fprintln(os.Stderr, "usage: edgebench plot -json FILE [-out DIR]")
		os.Exit(2)
	}
	rep, err := bench.ReadReport(*from)
	if err != nil {
		fmt.Fprintln(os.Stderr, "edgebench:", err)
		os.Exit(1)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "edgebench:", err)
		os.Exit(1)
	}
	paths, err := bench.WritePlots(rep, *out)
	for _, p := range paths {
		fmt.Println(p)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "edgebench:", err)
		os.Exit(1)
	}
	if len(paths) == 0 {
		fmt.Fprintf(os.Stderr, "edgebench: %s holds no figures to plot\n", *from)
		os.Exit(1)
	}
}

func run(args []string) {
	fs := flag.NewFlagSet("edgebench run", flag.ExitOnError)
	duration := fs.Duration("duration", 0, "length of each attack (default 10s, -quick 1s)")
	workers := fs.Int("workers", 64, "closed-loop concurrency")
	quick := fs.Bool("quick", false, "a few seconds in all, on a small stack (the smoke test)")
	out := fs.String("out", "bench/results", "directory for the run's JSON file and plots")
	scenario := fs.String("scenario", "", "comma-separated scenario or ceiling names (prefixes), e.g. first,hotdup (default all)")
	rate := fs.Int("rate", 0, "constant rate of the vegeta attacks (default: a share of the measured peak)")
	target := fs.String("target", "", "an existing edge's public URL (default: start our own stack)")
	admin := fs.String("admin", "", "with -target: its admin URL, for /metrics")
	db := fs.String("db", os.Getenv("DATABASE_URL"), "with -target: its DATABASE_URL (orders are seeded under a prefix of this run's own)")
	secret := fs.String("secret", os.Getenv("EDGE_SIGN_SECRET"), "with -target: a generic channel's secret (EDGE_SIGN_SECRET)")
	channel := fs.String("channel", "bench", "with -target: that channel's name")
	breakdown := fs.Bool("breakdown", false, "own stack only: each row's Redis commands and Postgres statements per request (pg_stat_statements on)")
	streamRedis := fs.Bool("stream-redis", false, "own stack only: the outbox stream on a redis-server of its own (the redis column is then the claim cache's alone)")
	traceSample := fs.Float64("trace-sample", -1, "own stack only: the edge exports spans to a receiver in the bench, sampling this share (0 to 1) of the callbacks (default: tracing off)")
	fs.Parse(args)
	cfg := bench.Config{Duration: *duration, Workers: *workers, Quick: *quick, JSONDir: *out, Progress: os.Stderr, Rate: *rate, Breakdown: *breakdown, StreamRedis: *streamRedis,
		Traces: *traceSample >= 0, TraceSample: max(*traceSample, 0)}
	if *scenario != "" {
		cfg.Scenarios = strings.Split(*scenario, ",")
	}
	if *target != "" {
		if *db == "" || *secret == "" {
			fmt.Fprintln(os.Stderr, "edgebench: -target needs -db and -secret")
			os.Exit(2)
		}
		cfg.Target = &bench.Target{URL: *target, AdminURL: *admin, DBURL: *db, Secret: *secret, Channel: *channel}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := bench.Run(ctx, cfg)
	if rep != nil {
		fmt.Print(rep.Table())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "edgebench:", err)
		os.Exit(1)
	}
}

func scale(args []string) {
	fs := flag.NewFlagSet("edgebench scale", flag.ExitOnError)
	edged := fs.String("edged", "bin/edged", "the edged binary")
	shipper := fs.String("shipper", "bin/shipper", "the shipper binary")
	workers := fs.Int("workers", 64, "the driver's concurrency")
	phase := fs.Duration("phase", 10*time.Second, "each throughput phase")
	faults := fs.Duration("faults", 60*time.Second, "the fault run")
	fs.Parse(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := bench.RunScale(ctx, bench.ScaleConfig{Edged: *edged, Shipper: *shipper, Workers: *workers,
		Phase: *phase, Faults: *faults, Progress: os.Stderr})
	if rep != nil {
		fmt.Print(rep.Table())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "edgebench:", err)
		os.Exit(1)
	}
}

// ha runs the HA scenario (bench.RunHA) once per mode: sync and async
// are Patroni's synchronous_mode on and off; sync-before is sync with
// haproxy checking edged as readiness worked before nodes told a shared
// outage from their own.
func ha(args []string) {
	fs := flag.NewFlagSet("edgebench ha", flag.ExitOnError)
	edged := fs.String("edged", "bin/edged", "the edged binary")
	modes := fs.String("modes", "sync,async,sync-before", "the runs, in order: sync, async, sync-before")
	rate := fs.Int("rate", 100, "callbacks a second, half of them re-deliveries")
	settle := fs.Duration("settle", 10*time.Second, "steady load before the first fault and after each")
	jsonOut := fs.String("json", "", "also write the reports as JSON to this file")
	keep := fs.Bool("keep", false, "keep each run's directory: every process's log and configuration")
	fs.Parse(args)
	// Patroni's Postgres servers outlive a killed parent: a SIGTERM tears
	// the stack down as an interrupt does.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var reps []*bench.HAReport
	failed := false
	for _, mode := range strings.Split(*modes, ",") {
		cfg := bench.HAConfig{Edged: *edged, Rate: *rate, Settle: *settle, Keep: *keep, Progress: os.Stderr}
		switch mode {
		case "sync":
			cfg.Synchronous = true
		case "async":
		case "sync-before":
			cfg.Synchronous, cfg.LeaveOnAnyOutage = true, true
		default:
			fmt.Fprintf(os.Stderr, "edgebench: unknown mode %q (sync, async, sync-before)\n", mode)
			os.Exit(2)
		}
		fmt.Fprintf(os.Stderr, "== %s ==\n", mode)
		rep, err := bench.RunHA(ctx, cfg)
		if rep != nil {
			fmt.Print(rep.Table(), "\n")
			reps = append(reps, rep)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "edgebench:", err)
			failed = true
		}
		if ctx.Err() != nil {
			break
		}
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(reps, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "edgebench:", err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

// soak runs the soak (bench.RunSoak).
func soak(args []string) {
	fs := flag.NewFlagSet("edgebench soak", flag.ExitOnError)
	var cfg bench.SoakConfig
	fs.StringVar(&cfg.Edged, "edged", "bin/edged", "the edged binary")
	fs.StringVar(&cfg.Shipper, "shipper", "bin/shipper", "the shipper binary")
	fs.StringVar(&cfg.Forwarder, "forwarder", "bin/forwarder", "the forwarder binary")
	fs.DurationVar(&cfg.Duration, "duration", time.Hour, "the soak's length")
	fs.DurationVar(&cfg.Slice, "slice", time.Minute, "one attack's length: a point of the latency series")
	fs.DurationVar(&cfg.Warmup, "warmup", 10*time.Minute, "resident memory must stay flat after this")
	fs.DurationVar(&cfg.LeadIn, "lead-in", 10*time.Minute, "the soak's rate run before the measured duration, outside its figures")
	fs.Float64Var(&cfg.Share, "share", 0.5, "the rate, as a share of the closed-loop peak")
	fs.StringVar(&cfg.TableOptions, "table-options", "", "storage parameters set on notify_claim and outbox, e.g. autovacuum_vacuum_scale_factor = 0.02")
	fs.StringVar(&cfg.Out, "out", "bench/results", "where the JSON and the plots go")
	fs.Parse(args)
	cfg.Progress = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := bench.RunSoak(ctx, cfg)
	if rep != nil {
		fmt.Print(rep.Table())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "edgebench:", err)
		os.Exit(1)
	}
}

// bloat turns weeks of claims and outbox rows over under retention and
// autovacuum (bench.RunBloat).
func bloat(args []string) {
	fs := flag.NewFlagSet("edgebench bloat", flag.ExitOnError)
	var cfg bench.BloatConfig
	fs.Int64Var(&cfg.Claims, "claims", 1_000_000, "the week of claims kept (the outbox keeps 0.67 of that)")
	fs.DurationVar(&cfg.Week, "week", 210*time.Second, "the wall time a simulated week takes")
	fs.IntVar(&cfg.Weeks, "weeks", 2, "the weeks turned over after the seeded one")
	variants := fs.String("variants", "", "the autovacuum settings to run, comma-separated (default all)")
	fs.StringVar(&cfg.Out, "out", "bench/results", "where the JSON and the plot go")
	fs.Parse(args)
	if *variants != "" {
		for _, v := range strings.Split(*variants, ",") {
			cfg.Variants = append(cfg.Variants, strings.TrimSpace(v))
		}
	}
	cfg.Progress = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := bench.RunBloat(ctx, cfg)
	if rep != nil {
		fmt.Print(rep.Table())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "edgebench:", err)
		os.Exit(1)
	}
}

// bills measures a daily statement's run (bench.RunBills).
func bills(args []string) {
	fs := flag.NewFlagSet("edgebench bills", flag.ExitOnError)
	edged := fs.String("edged", "bin/edged", "the edged binary")
	rows := fs.String("rows", "100000,1000000", "the statements' sizes, comma-separated")
	fs.Parse(args)
	var sizes []int
	for _, r := range strings.Split(*rows, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || n < 1000 {
			fmt.Fprintf(os.Stderr, "edgebench bills: -rows %q: want sizes of at least 1000\n", r)
			os.Exit(2)
		}
		sizes = append(sizes, n)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := bench.RunBills(ctx, bench.BillsConfig{Edged: *edged, Rows: sizes, Progress: os.Stderr})
	fmt.Print(rep.Table())
	if err != nil {
		fmt.Fprintln(os.Stderr, "edgebench:", err)
		os.Exit(1)
	}
}

// compare prints two builds' runs side by side (bench.Compare).
func compare(args []string) {
	fs := flag.NewFlagSet("edgebench compare", flag.ExitOnError)
	oldFiles := fs.String("old", "", "the first build's run files (JSON, comma-separated)")
	newFiles := fs.String("new", "", "the second build's run files (JSON, comma-separated)")
	oldLabel := fs.String("old-label", "old", "the first build's name")
	newLabel := fs.String("new-label", "new", "the second build's name")
	fs.Parse(args)
	read := func(label, list string) bench.Build {
		b := bench.Build{Label: label}
		for _, p := range strings.Split(list, ",") {
			if p == "" {
				continue
			}
			r, err := bench.ReadReport(p)
			if err != nil {
				fmt.Fprintln(os.Stderr, "edgebench:", err)
				os.Exit(1)
			}
			b.Runs = append(b.Runs, r)
		}
		if len(b.Runs) == 0 {
			fmt.Fprintf(os.Stderr, "edgebench compare: no run files for %s\n", label)
			os.Exit(2)
		}
		return b
	}
	fmt.Print(bench.Compare(read(*oldLabel, *oldFiles), read(*newLabel, *newFiles)))
}
