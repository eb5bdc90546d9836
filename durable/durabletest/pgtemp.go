package durabletest

import (
	"context"

	"github.com/notifyedge/notifyedge/durable/pgtemp"
)

// The throwaway cluster lives in durable/pgtemp, which bin/edged may link
// (package testing may not). These names keep the tests that reach it
// through durabletest compiling; new code uses pgtemp directly.

// ErrNoServer is pgtemp.ErrNoServer.
var ErrNoServer = pgtemp.ErrNoServer

// Options is pgtemp.Options.
type Options = pgtemp.Options

// Cluster is pgtemp.Cluster.
type Cluster = pgtemp.Cluster

// Order is pgtemp.Order.
type Order = pgtemp.Order

// Start is pgtemp.Start.
func Start(ctx context.Context, o Options) (*Cluster, error) { return pgtemp.Start(ctx, o) }

// TCPURL is pgtemp.TCPURL.
func TCPURL(addr, db string) string { return pgtemp.TCPURL(addr, db) }

// SeedOrders is pgtemp.SeedOrders.
func SeedOrders(ctx context.Context, url string, orders []Order) error {
	return pgtemp.SeedOrders(ctx, url, orders)
}
