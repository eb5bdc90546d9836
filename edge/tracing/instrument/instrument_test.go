package instrument_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/edge/tracing/instrument"
	"github.com/notifyedge/notifyedge/edge/tracing/tracingtest"
)

func TestMain(m *testing.M) { durabletest.Main(m) }

// A query and a Redis command inside a recording span are its children,
// with the statement's text or the command's name and never their
// arguments; outside one they start nothing. Off, there is nothing to
// attach.
func TestClientsUnderACallback(t *testing.T) {
	if instrument.Postgres(nil) != nil || instrument.Redis(nil, nil) != nil {
		t.Fatal("tracing off: want no tracer and no hook")
	}
	p, rcv := tracingtest.Provider(t)
	ctx := context.Background()
	cc, err := pgx.ParseConfig(durabletest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cc.Tracer = instrument.Postgres(p)
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rs, err := claimcachetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rdb.Close()
	if err := instrument.Redis(p, rdb); err != nil {
		t.Fatal(err)
	}

	const secret = "raw-body-and-signature"
	run := func(ctx context.Context) {
		var got string
		if err := conn.QueryRow(ctx, "SELECT $1::text", secret).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if err := rdb.Set(ctx, "k", secret, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	run(ctx) // outside any span
	cctx, callback := p.Tracer("app").Start(ctx, "callback")
	run(cctx)
	callback.End()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	var query, set bool
	for _, s := range rcv.Spans() {
		if s.Name == "callback" {
			continue
		}
		if s.ParentSpanID != callback.SpanContext().SpanID().String() {
			t.Errorf("span %q (%s) is not the callback's child", s.Name, s.Scope)
		}
		query = query || s.Attributes["db.query.text"] == "SELECT $1::text"
		set = set || s.Name == "set"
		for k, v := range s.Attributes {
			if strings.Contains(v, secret) || strings.Contains(v, "k ") {
				t.Errorf("span %q attribute %s = %q holds an argument", s.Name, k, v)
			}
		}
	}
	if !query || !set {
		t.Errorf("query span %v, set span %v: want both; got %d spans", query, set, len(rcv.Spans()))
	}
}
