package durable_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
)

func TestMain(m *testing.M) { durabletest.Main(m) }

// bundle is one test's database: a Store under test and a plain pool the
// test checks invariants with.
type bundle struct {
	url   string
	store *durable.Store
	db    *pgxpool.Pool
}

func setup(t *testing.T) *bundle {
	t.Helper()
	url := durabletest.NewDatabase(t)
	return &bundle{url: url, store: newStore(t, url, durable.Config{}), db: newPool(t, url)}
}

func newStore(t *testing.T, url string, cfg durable.Config) *durable.Store {
	t.Helper()
	cfg.URL = url
	cfg.MaxConns = max(cfg.MaxConns, 16)
	cfg.MinConns = 2
	s, err := durable.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("durable.New: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func (b *bundle) order(t *testing.T, orderNo string, status durable.State, amount int64, currency string) {
	t.Helper()
	_, err := b.db.Exec(context.Background(),
		`INSERT INTO biz_order (order_no, status, amount, currency) VALUES ($1, $2, $3, $4)`,
		orderNo, string(status), amount, currency)
	if err != nil {
		t.Fatalf("seed order: %v", err)
	}
}

func (b *bundle) status(t *testing.T, orderNo string) durable.State {
	t.Helper()
	var s string
	if err := b.db.QueryRow(context.Background(), `SELECT status FROM biz_order WHERE order_no = $1`, orderNo).Scan(&s); err != nil {
		t.Fatalf("read status: %v", err)
	}
	return durable.State(s)
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (b *bundle) claims(t *testing.T, key string) int {
	return b.count(t, `SELECT count(*) FROM notify_claim WHERE biz_key = $1`, key)
}

func (b *bundle) outbox(t *testing.T, orderNo string) int {
	return b.count(t, `SELECT count(*) FROM outbox WHERE order_no = $1`, orderNo)
}

func (b *bundle) openReviews(t *testing.T, key string, reason durable.ReviewReason) int {
	return b.count(t, `SELECT count(*) FROM notify_review WHERE biz_key = $1 AND reason = $2 AND resolved_at IS NULL`, key, string(reason))
}

// note builds a notification as the generic channel "test" would, with the
// contract's digest over the business fields.
func note(txn string, e durable.Event, orderNo string, amount int64, currency string) durable.Notification {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\n%s\n%s\n%d\n%s", txn, e, orderNo, amount, currency))
	return durable.Notification{
		BizKey:   fmt.Sprintf("test:%s:%s", txn, e),
		OrderNo:  orderNo,
		Event:    e,
		Amount:   amount,
		Currency: currency,
		Digest:   hex.EncodeToString(sum[:]),
		RawBody:  fmt.Appendf(nil, `{"channel_txn_id":%q,"event_type":%q,"order_no":%q,"amount":%d,"currency":%q}`, txn, e, orderNo, amount, currency),
	}
}

func process(t *testing.T, s *durable.Store, n durable.Notification) durable.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.Process(ctx, n)
	if err != nil {
		t.Fatalf("Process(%s): %v", n.BizKey, err)
	}
	return r
}

// lockOrder holds the order's row lock until release (durabletest.LockOrder).
func (b *bundle) lockOrder(t testing.TB, orderNo string) (release func()) {
	t.Helper()
	return durabletest.LockOrder(t, b.db, orderNo)
}

func pgxCopyRows(rows [][]any) pgx.CopyFromSource { return pgx.CopyFromRows(rows) }

// durabletestCreateEmpty returns the URL of a new, unmigrated database.
func durabletestCreateEmpty(t *testing.T) string {
	return durabletest.Shared(t).URL(durabletest.CreateDatabase(t, false))
}

func durabletestNewDatabaseB(b *testing.B) string { return durabletest.NewDatabase(b) }

func newPoolB(b *testing.B, url string) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = 40, 40
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	return p
}
