// Command edgebench is bench's thin main.
//
//	edgebench demo [-orders 1000]              the incident replayed: naive design vs notifyedge
//	edgebench lag [-rate 1000 -duration 10s]   outbox lag at a steady callback rate
//	edgebench run [-duration 10s -workers 64]   every load scenario and ceiling, invariants checked
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/notifyedge/notifyedge/bench"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "lag" {
		lag(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "run" {
		run(os.Args[2:])
		return
	}
	if len(os.Args) < 2 || os.Args[1] != "demo" {
		fmt.Fprintln(os.Stderr, "usage: edgebench run|demo|lag [flags]")
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

func run(args []string) {
	fs := flag.NewFlagSet("edgebench run", flag.ExitOnError)
	duration := fs.Duration("duration", 0, "length of each attack (default 10s, -quick 1s)")
	workers := fs.Int("workers", 64, "closed-loop concurrency")
	quick := fs.Bool("quick", false, "a few seconds in all, on a small stack (the smoke test)")
	out := fs.String("out", "bench/results", "directory for the run's JSON file")
	fs.Parse(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := bench.Run(ctx, bench.Config{Duration: *duration, Workers: *workers, Quick: *quick, JSONDir: *out, Progress: os.Stderr})
	if rep != nil {
		fmt.Print(rep.Table())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "edgebench:", err)
		os.Exit(1)
	}
}
