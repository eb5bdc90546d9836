// Command shipper is the reference downstream consumer: it reads the outbox
// stream as a consumer group and ships every paid order exactly once in
// effect. A redelivered ORDER_PAID, a stale one after SHIPPED, and the
// messages of a consumer that died holding them all ship nothing extra.
//
//	DATABASE_URL=... EDGE_STREAM_URL=redis://... shipper [-group shipper] [-name host-pid]
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/durable/shipping"
	"github.com/notifyedge/notifyedge/edge/tracing"
	"github.com/notifyedge/notifyedge/edge/tracing/instrument"
)

func main() {
	host, _ := os.Hostname()
	group := flag.String("group", "shipper", "consumer group")
	name := flag.String("name", fmt.Sprintf("%s-%d", host, os.Getpid()), "consumer name within the group")
	claimIdle := flag.Duration("claim-idle", 30*time.Second, "claim messages pending this long with a dead consumer")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	dbURL, streamURL := os.Getenv("DATABASE_URL"), os.Getenv("EDGE_STREAM_URL")
	if dbURL == "" || streamURL == "" {
		fmt.Fprintln(os.Stderr, "shipper: DATABASE_URL and EDGE_STREAM_URL are required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// With an OTLP endpoint in the environment, each batch that carries a
	// callback's trace context is a span of that trace, with its queries
	// and Redis commands as spans under it.
	tp, err := tracing.Setup(ctx, "shipper", os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "shipper:", err)
		os.Exit(2)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		tp.Shutdown(sctx)
		cancel()
	}()
	store, err := durable.New(ctx, durable.Config{URL: dbURL, Application: "notifyedge-shipper", MaxConns: 8, MinConns: 2, Tracer: instrument.Postgres(tp)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "shipper:", err)
		os.Exit(1)
	}
	defer store.Close()
	client, err := redisstream.NewClient(streamURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "shipper:", err)
		os.Exit(2)
	}
	defer client.Close()
	if err := instrument.Redis(tp, client); err != nil {
		fmt.Fprintln(os.Stderr, "shipper:", err)
		os.Exit(2)
	}
	log.Info("shipper consuming", "stream", os.Getenv("EDGE_STREAM_NAME"), "group", *group, "name", *name)
	err = redisstream.RunConsumer(ctx, redisstream.ConsumerConfig{
		Client: client, Stream: os.Getenv("EDGE_STREAM_NAME"), Group: *group, Name: *name, ClaimIdle: *claimIdle,
		HandleBatch: traced(tp.Tracer("github.com/notifyedge/notifyedge/cmd/shipper"),
			shipping.OnPaidBatch(store, *group, func(m redisstream.Message, r durable.ShipResult) {
				log.Info("order", "order_no", m.OrderNo, "outbox_id", m.OutboxID, "result", r.String())
			})),
		OnError: func(err error) { log.Warn("shipper", "error", err.Error()) },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "shipper:", err)
		os.Exit(1)
	}
}
