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

// canonicalFormat is the stored answer of a DONE claim, byte for byte. A
// replay answers with the bytes of the first delivery, whichever build
// stored them, so they are written out here, not taken from the code
// under test.
const canonicalFormat = `{"http":200,"code":"SUCCESS","outcome":"%s","status":"%s"}`

// canonical is the stored answer of a DONE claim of outcome o, state s.
func canonical(o durable.Outcome, s durable.State) string { return fmt.Sprintf(canonicalFormat, o, s) }

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
	return &bundle{url: url, store: newStore(t, url, durable.Config{}), db: durabletest.Pool(t, url)}
}

func newStore(t *testing.T, url string, cfg durable.Config) *durable.Store {
	t.Helper()
	cfg.URL = url
	cfg.GroupCommit = cfg.GroupCommit || durabletest.GroupCommit()
	cfg.MaxConns = max(cfg.MaxConns, 16)
	cfg.MinConns = 2
	s, err := durable.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("durable.New: %v", err)
	}
	t.Cleanup(s.Close)
	return s
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
	return durable.State(durabletest.Status(t, b.db, orderNo))
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	return durabletest.Count(t, b.db, sql, args...)
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
// digest over the business fields: txn is the trade's txn id (the
// trade is "test:"+txn), and a REFUND_SUCCESS is a full refund without an id.
func note(txn string, e durable.Event, orderNo string, amount int64, currency string) durable.Notification {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\n%s\n%s\n%d\n%s", txn, e, orderNo, amount, currency))
	n := durable.Notification{
		BizKey:   fmt.Sprintf("test:%s:%s", txn, e),
		OrderNo:  orderNo,
		Event:    e,
		Amount:   amount,
		Currency: currency,
		Digest:   hex.EncodeToString(sum[:]),
		RawBody:  fmt.Appendf(nil, `{"channel_txn_id":%q,"event_type":%q,"order_no":%q,"amount":%d,"currency":%q}`, txn, e, orderNo, amount, currency),
		Trade:    "test:" + txn,
	}
	if e == durable.RefundSuccess {
		n.RefundAmount = amount
	}
	return n
}

// refundNote builds a REFUND_SUCCESS of trade "test:"+txn as the generic
// channel would: keyed by refundID when it has one, with the digest over
// the refund fields too.
func refundNote(txn, refundID, orderNo string, amount, refundAmount int64, cumulative bool) durable.Notification {
	n := note(txn, durable.RefundSuccess, orderNo, amount, "CNY")
	if refundID != "" {
		n.BizKey = fmt.Sprintf("test:%s:%s", refundID, durable.RefundSuccess)
		sum := sha256.Sum256(fmt.Appendf(nil, "%s\n%s\n%s\n%d\n%s\n%s\n%d", txn, durable.RefundSuccess, orderNo, amount, "CNY", refundID, refundAmount))
		n.Digest = hex.EncodeToString(sum[:])
	}
	n.RefundID, n.RefundAmount, n.Cumulative = refundID, refundAmount, cumulative
	return n
}

// seed inserts an order as another system (or an earlier build) left it:
// its payer ("" for none), its refunded amount, and refunds already
// recorded.
func (b *bundle) seed(t *testing.T, orderNo string, status durable.State, amount int64, payer string, refunded int64, refunds ...refund) {
	t.Helper()
	ctx := context.Background()
	var paidBy *string
	if payer != "" {
		paidBy = &payer
	}
	if _, err := b.db.Exec(ctx, `INSERT INTO biz_order (order_no, status, amount, currency, paid_by, refunded_amount)
		VALUES ($1, $2, $3, 'CNY', $4, $5)`, orderNo, string(status), amount, paidBy, refunded); err != nil {
		t.Fatalf("seed order: %v", err)
	}
	for _, r := range refunds {
		if _, err := b.db.Exec(ctx, `INSERT INTO trade_refund (trade, refund_id, order_no, amount) VALUES ($1, $2, $3, $4)`,
			r.Trade, r.RefundID, orderNo, r.Amount); err != nil {
			t.Fatalf("seed refund: %v", err)
		}
	}
}

// refund is a trade_refund row of an order.
type refund struct {
	Trade, RefundID string
	Amount          int64
}

// money reads what the order knows of its trade: paid_by ("" for NULL),
// refunded_amount, and its trade_refund rows by trade and refund id.
func (b *bundle) money(t *testing.T, orderNo string) (payer string, refunded int64, refunds []refund) {
	t.Helper()
	ctx := context.Background()
	var p *string
	if err := b.db.QueryRow(ctx, `SELECT paid_by, refunded_amount FROM biz_order WHERE order_no = $1`, orderNo).Scan(&p, &refunded); err != nil {
		t.Fatalf("read order: %v", err)
	}
	if p != nil {
		payer = *p
	}
	rows, err := b.db.Query(ctx, `SELECT trade, refund_id, amount FROM trade_refund WHERE order_no = $1 ORDER BY trade, refund_id`, orderNo)
	if err != nil {
		t.Fatal(err)
	}
	refunds, err = pgx.CollectRows(rows, pgx.RowToStructByPos[refund])
	if err != nil {
		t.Fatal(err)
	}
	return payer, refunded, nilIfEmpty(refunds)
}

// topics returns the order's outbox topics in id order.
func (b *bundle) topics(t *testing.T, orderNo string) []string {
	t.Helper()
	rows, err := b.db.Query(context.Background(), `SELECT topic FROM outbox WHERE order_no = $1 ORDER BY id`, orderNo)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return nilIfEmpty(out)
}

// payloads returns the order's outbox payloads in id order.
func (b *bundle) payloads(t *testing.T, orderNo string) []map[string]any {
	t.Helper()
	rows, err := b.db.Query(context.Background(), `SELECT payload FROM outbox WHERE order_no = $1 ORDER BY id`, orderNo)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[map[string]any])
	if err != nil {
		t.Fatal(err)
	}
	return nilIfEmpty(out)
}

// nilIfEmpty makes "no rows" compare equal to a want written as nil.
func nilIfEmpty[T any](l []T) []T {
	if len(l) == 0 {
		return nil
	}
	return l
}

// forget deletes the claims of the keys, as retention does once they are
// older than the claim retention.
func (b *bundle) forget(t *testing.T, keys ...string) {
	t.Helper()
	if _, err := b.db.Exec(context.Background(), `DELETE FROM notify_claim WHERE biz_key = ANY ($1)`, keys); err != nil {
		t.Fatal(err)
	}
}

// reviews returns the order's review rows as "REASON open" or "REASON
// resolved by WHO", in id order.
func (b *bundle) reviews(t *testing.T, orderNo string) []string {
	t.Helper()
	rows, err := b.db.Query(context.Background(), `SELECT reason || CASE WHEN resolved_at IS NULL THEN ' open'
		ELSE ' resolved by ' || coalesce(resolved_by, '?') END FROM notify_review WHERE order_no = $1 ORDER BY id`, orderNo)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return nilIfEmpty(out)
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
