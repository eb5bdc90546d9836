package durabletest_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
)

func TestMain(m *testing.M) { durabletest.Main(m) }

// The connections Invariants is documented to read through.
var (
	_ durabletest.Querier = (*pgxpool.Pool)(nil)
	_ durabletest.Querier = (*pgx.Conn)(nil)
	_ durabletest.Querier = pgx.Tx(nil)
)

// prefix holds every LIKE metacharacter: were one passed unescaped, the
// pattern would reach the decoy orders (% or _) or match nothing (\).
const prefix = `T%_\`

// The decoys are one character off the prefix where an unescaped % or _
// would still match.
const (
	decoyPercent    = `T%X\decoy`
	decoyUnderscore = `TX_\decoy`
)

// Names of the violations, as Invariants words them.
const (
	dupTopic      = "duplicate outbox topic"
	claimRows     = "applied claim without exactly one outbox row"
	orphanRow     = "outbox row without an applied claim"
	successNoDone = "SUCCESS answered without a DONE claim"
	notRecorded   = "refunded amount is not its paying trade's recorded refunds"
	outOfRange    = "refunded amount outside 0 to the amount"
	refundedState = "REFUNDED and fully refunded disagree"
)

var violationNames = []string{dupTopic, claimRows, orphanRow, successNoDone, notRecorded, outOfRange, refundedState}

const appliedJSON = `{"http":200,"code":"SUCCESS","outcome":"applied","status":"PAID"}`

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func mustExec(t *testing.T, db execer, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// invariantsDB returns a database whose orders under prefix are in a clean
// state, made by durable itself (payments, a second payment, shipping, a
// close, a full refund, partial refunds, a partial refund then TRADE_CLOSED
// of the payer, a refund of the second payment) plus the rows of a path
// durable does not have yet (an internal API request), and whose decoy
// orders break every claim and outbox invariant but the answered-SUCCESS
// one. answered are the keys durable answered SUCCESS for.
func invariantsDB(t *testing.T) (db *pgxpool.Pool, answered []string) {
	t.Helper()
	ctx := context.Background()
	url := durabletest.NewDatabase(t)
	var orders []pgtemp.Order
	for i, no := range []string{"paid", "shipped", "closed", "refunded", "partial", "api", "tradeclosed"} {
		orders = append(orders, pgtemp.Order{No: prefix + no, Status: "PENDING_PAY", Amount: int64(100 * (i + 1)), Currency: "CNY"})
	}
	orders = append(orders,
		pgtemp.Order{No: decoyPercent, Status: "PENDING_PAY", Amount: 100, Currency: "CNY"},
		pgtemp.Order{No: decoyUnderscore, Status: "PENDING_PAY", Amount: 100, Currency: "CNY"})
	if err := pgtemp.SeedOrders(ctx, url, orders); err != nil {
		t.Fatal(err)
	}
	store, err := durable.New(ctx, durable.Config{URL: url, MaxConns: 4, MinConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	// deliver sends e of trade "test:"+txn; a refund with refundID is keyed
	// by it, one without refunds the whole amount.
	deliver := func(txn string, e durable.Event, orderNo string, amount int64, refundID string, refundAmount int64, want durable.Outcome) {
		t.Helper()
		key := txn
		if refundID != "" {
			key = refundID
		}
		if e == durable.RefundSuccess && refundAmount == 0 {
			refundAmount = amount
		}
		sum := sha256.Sum256([]byte(txn + string(e) + orderNo + refundID))
		n := durable.Notification{BizKey: "test:" + key + ":" + string(e), OrderNo: orderNo, Event: e,
			Amount: amount, Currency: "CNY", Digest: hex.EncodeToString(sum[:]), RawBody: []byte("{}"),
			Trade: "test:" + txn, RefundID: refundID, RefundAmount: refundAmount}
		r, err := store.Process(ctx, n)
		if err != nil || r.Outcome != want {
			t.Fatalf("%s: %+v %v, want %v", n.BizKey, r, err, want)
		}
		answered = append(answered, n.BizKey)
	}
	deliver("P1", durable.PaySuccess, prefix+"paid", 100, "", 0, durable.Applied)
	deliver("P1", durable.PaySuccess, prefix+"paid", 100, "", 0, durable.Applied)           // a replay: answered twice
	deliver("P2", durable.PaySuccess, prefix+"paid", 100, "", 0, durable.Skipped)           // a second payment: no outbox row
	deliver("P2", durable.RefundSuccess, prefix+"paid", 100, "P2-back", 0, durable.Skipped) // its refund: recorded, order untouched
	deliver("S1", durable.PaySuccess, prefix+"shipped", 200, "", 0, durable.Applied)
	if m, err := store.Transition(ctx, prefix+"shipped", durable.Ship); err != nil || !m.Applied {
		t.Fatalf("ship: %+v %v", m, err) // an internal move: its outbox biz_key is null
	}
	deliver("C1", durable.PayClosed, prefix+"closed", 300, "", 0, durable.Applied)
	deliver("R1", durable.PaySuccess, prefix+"refunded", 400, "", 0, durable.Applied)
	deliver("R1", durable.RefundSuccess, prefix+"refunded", 400, "R2", 0, durable.Applied)
	deliver("PR0", durable.PaySuccess, prefix+"partial", 500, "", 0, durable.Applied)
	// Two partial refunds of one order: the same topic twice, legal for them.
	deliver("PR0", durable.RefundSuccess, prefix+"partial", 500, "PR1", 200, durable.Applied)
	deliver("PR0", durable.RefundSuccess, prefix+"partial", 500, "PR2", 100, durable.Applied)
	deliver("A0", durable.PaySuccess, prefix+"api", 600, "", 0, durable.Applied)
	deliver("TC0", durable.PaySuccess, prefix+"tradeclosed", 700, "", 0, durable.Applied)
	deliver("TC0", durable.RefundSuccess, prefix+"tradeclosed", 700, "TC1", 300, durable.Applied)
	deliver("TC0", durable.TradeClosed, prefix+"tradeclosed", 700, "", 0, durable.Applied)
	deliver("D1", durable.PaySuccess, decoyPercent, 100, "", 0, durable.Applied)
	deliver("D2", durable.PaySuccess, decoyUnderscore, 100, "", 0, durable.Applied)

	db, err = pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	// An internal API request: a claim keyed "@...", an outbox row whose
	// biz_key is null.
	mustExec(t, db, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json)
VALUES ('@req-1', $1, repeat('c', 64), 'DONE', '{"http":200,"code":"SUCCESS","outcome":"applied","status":"SHIPPED"}')`, prefix+"api")
	mustExec(t, db, `INSERT INTO outbox (topic, order_no, payload)
VALUES ('ORDER_SHIPPED', $1::text, jsonb_build_object('order_no', $1::text, 'biz_key', NULL))`, prefix+"api")
	answered = append(answered, "@req-1")

	// The decoys: each ORDER_PAID row twice (a, and b: a claim with two
	// rows), an outbox row of a key never claimed and an applied claim
	// without a row (b both ways).
	mustExec(t, db, `INSERT INTO outbox (topic, order_no, payload)
SELECT topic, order_no, payload FROM outbox WHERE order_no IN ($1, $2)`, decoyPercent, decoyUnderscore)
	mustExec(t, db, `INSERT INTO outbox (topic, order_no, payload) VALUES ('ORDER_SHIPPED', $1, '{"biz_key":"test:ghost:SHIP"}')`, decoyUnderscore)
	mustExec(t, db, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json)
VALUES ('test:decoy-lost:PAY_SUCCESS', $1, repeat('d', 64), 'DONE', $2)`, decoyPercent, appliedJSON)
	return db, answered
}

// wantViolations checks that err is an ErrInvariant naming exactly the
// violations in want, each with the text that follows its name.
func wantViolations(t *testing.T, err error, want map[string]string) {
	t.Helper()
	if !errors.Is(err, durabletest.ErrInvariant) {
		t.Fatalf("err %v, want ErrInvariant", err)
	}
	msg := err.Error()
	for _, name := range violationNames {
		detail, named := want[name]
		switch {
		case named && !strings.Contains(msg, name+": "+detail):
			t.Errorf("error does not name %q with %q:\n%s", name, detail, msg)
		case !named && strings.Contains(msg, name):
			t.Errorf("error names %q, which is not violated:\n%s", name, msg)
		}
	}
}

func TestInvariants(t *testing.T) {
	db, answered := invariantsDB(t)
	ctx := context.Background()

	t.Run("clean state passes", func(t *testing.T) {
		if err := durabletest.Invariants(ctx, db, prefix, answered); err != nil {
			t.Fatal(err)
		}
		conn, err := db.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		if err := durabletest.Invariants(ctx, conn.Conn(), prefix, nil); err != nil {
			t.Fatalf("through a *pgx.Conn: %v", err)
		}
	})

	t.Run("empty prefix is every order", func(t *testing.T) {
		err := durabletest.Invariants(ctx, db, "", answered)
		wantViolations(t, err, map[string]string{
			dupTopic:  "2 (order_no, topic) pairs",
			claimRows: "3 claims",
			orphanRow: "1 rows",
		})
		for _, s := range []string{decoyPercent + " ORDER_PAID x2", "test:D2:PAY_SUCCESS: 2 rows", "test:decoy-lost:PAY_SUCCESS: 0 rows", "test:ghost:SHIP"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error does not show %q:\n%v", s, err)
			}
		}
	})

	// Each violation alone, in a transaction rolled back afterwards.
	for _, c := range []struct {
		name     string
		sql      []string // each run with the prefix as $1, where it has one
		answered []string // added to the keys answered SUCCESS
		want     map[string]string
	}{
		{
			name: "an order paid twice",
			sql:  []string{`INSERT INTO outbox (topic, order_no, payload) VALUES ('ORDER_PAID', $1 || 'paid', '{"biz_key":null}')`},
			want: map[string]string{dupTopic: `1 (order_no, topic) pairs written more than once (` + prefix + `paid ORDER_PAID x2)`},
		},
		{
			name: "an order refunded twice by an internal path",
			sql:  []string{`INSERT INTO outbox (topic, order_no, payload) VALUES ('ORDER_REFUNDED', $1 || 'refunded', '{}')`},
			want: map[string]string{dupTopic: "1 (order_no, topic) pairs"},
		},
		{
			name: "an applied claim without its outbox row",
			sql: []string{`INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json)
VALUES ('test:lost:PAY_SUCCESS', $1 || 'paid', repeat('e', 64), 'DONE', '` + appliedJSON + `')`},
			want: map[string]string{claimRows: "1 claims (test:lost:PAY_SUCCESS: 0 rows)"},
		},
		{
			name: "an applied claim with two outbox rows",
			sql: []string{`INSERT INTO outbox (topic, order_no, payload)
VALUES ('ORDER_PARTIALLY_REFUNDED', $1 || 'refunded', '{"biz_key":"test:R2:REFUND_SUCCESS"}')`},
			want: map[string]string{claimRows: "1 claims (test:R2:REFUND_SUCCESS: 2 rows)"},
		},
		{
			name: "an outbox row of a skipped claim",
			sql: []string{`INSERT INTO outbox (topic, order_no, payload)
VALUES ('ORDER_PARTIALLY_REFUNDED', $1 || 'paid', '{"biz_key":"test:P2:PAY_SUCCESS"}')`},
			want: map[string]string{orphanRow: "1 rows"},
		},
		{
			name:     "SUCCESS answered for a key never claimed, or claimed but pending",
			answered: []string{"test:never:PAY_SUCCESS", "test:pending:PAY_SUCCESS", "test:never:PAY_SUCCESS"},
			sql: []string{`INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state)
VALUES ('test:pending:PAY_SUCCESS', $1 || 'paid', repeat('f', 64), 'PENDING')`},
			want: map[string]string{successNoDone: "2 of "},
		},
		{
			name: "a refunded amount no refund explains",
			sql:  []string{`UPDATE biz_order SET refunded_amount = 30 WHERE order_no = $1 || 'paid'`},
			want: map[string]string{notRecorded: `1 orders (` + prefix + `paid: refunded_amount 30, refunds of paid_by test:P1: 0)`},
		},
		{
			name: "a refund recorded and not counted",
			sql: []string{`INSERT INTO trade_refund (trade, refund_id, order_no, amount)
VALUES ('test:PR0', 'PR3', $1 || 'partial', 50)`},
			want: map[string]string{notRecorded: `1 orders (` + prefix + `partial: refunded_amount 300, refunds of paid_by test:PR0: 350)`},
		},
		{
			name: "refunds counted against another trade than the payer",
			sql:  []string{`UPDATE biz_order SET paid_by = 'test:P2' WHERE order_no = $1 || 'partial'`},
			want: map[string]string{notRecorded: `1 orders (` + prefix + `partial: refunded_amount 300, refunds of paid_by test:P2: 0)`},
		},
		{
			name: "refunded beyond the amount",
			sql: []string{
				`ALTER TABLE biz_order DROP CONSTRAINT biz_order_refunded_amount_check`, // the schema's own backstop
				`UPDATE biz_order SET refunded_amount = 600 WHERE order_no = $1 || 'partial'`,
				`INSERT INTO trade_refund (trade, refund_id, order_no, amount) VALUES ('test:PR0', 'PR3', $1 || 'partial', 300)`,
			},
			want: map[string]string{outOfRange: `1 orders (` + prefix + `partial: refunded 600 of 500)`},
		},
		{
			name: "REFUNDED with part of the amount refunded",
			sql:  []string{`UPDATE biz_order SET status = 'REFUNDED' WHERE order_no = $1 || 'partial'`},
			want: map[string]string{refundedState: `1 orders (` + prefix + `partial: REFUNDED, refunded 300 of 500)`},
		},
		{
			name: "fully refunded and not REFUNDED",
			sql:  []string{`UPDATE biz_order SET status = 'SHIPPED' WHERE order_no = $1 || 'tradeclosed'`},
			want: map[string]string{refundedState: `1 orders (` + prefix + `tradeclosed: SHIPPED, refunded 700 of 700)`},
		},
		{
			name:     "every kind at once",
			answered: []string{"test:never:PAY_SUCCESS"},
			sql: []string{
				`INSERT INTO outbox (topic, order_no, payload) VALUES ('ORDER_CLOSED', $1 || 'closed', '{"biz_key":null}')`,
				`INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json)
VALUES ('test:lost:PAY_SUCCESS', $1 || 'paid', repeat('e', 64), 'DONE', '` + appliedJSON + `')`,
				`INSERT INTO outbox (topic, order_no, payload) VALUES ('ORDER_SHIPPED', $1 || 'paid', '{"biz_key":"test:ghost:SHIP"}')`,
			},
			want: map[string]string{dupTopic: "1 ", claimRows: "1 ", orphanRow: "1 ", successNoDone: "1 of "},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			tx, err := db.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			for _, sql := range c.sql {
				if strings.Contains(sql, "$1") {
					mustExec(t, tx, sql, prefix)
				} else {
					mustExec(t, tx, sql) // DDL takes no parameters
				}
			}
			err = durabletest.Invariants(ctx, tx, prefix, slices.Concat(answered, c.answered))
			wantViolations(t, err, c.want)
			if c.answered != nil && !strings.Contains(err.Error(), "test:never:PAY_SUCCESS") {
				t.Errorf("error does not name the key:\n%v", err)
			}
		})
	}

	t.Run("a failed query is an error, not a pass", func(t *testing.T) {
		empty := durabletest.Shared(t).URL(durabletest.CreateDatabase(t, false))
		conn, err := pgx.Connect(ctx, empty)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		err = durabletest.Invariants(ctx, conn, "", nil)
		if err == nil || errors.Is(err, durabletest.ErrInvariant) || !strings.Contains(err.Error(), "outbox") {
			t.Fatalf("err %v, want the failed query's error", err)
		}
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		if err := durabletest.Invariants(cancelled, db, prefix, answered); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled: err %v, want context.Canceled", err)
		}
	})
}
