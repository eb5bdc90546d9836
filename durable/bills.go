package durable

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
)

// The daily bill's bookkeeping: a channel's statement of one day is loaded
// into bill_row and compared with the ledger (biz_order.paid_by and
// paid_at for payments, trade_refund for refunds) by trade, never by day.
// What does not match becomes a bill_item; the caller acts on each (a
// repair through the same decision as a callback, or a review) and then
// records the run. Everything here runs on the operator pool.

// BillDay is the day of a statement, in the channel's zone (Asia/Shanghai
// for both channels): its ledger is what was recorded between the day's
// first and last instant there.
type BillDay struct {
	Date time.Time // midnight of the day in Loc
}

// NewBillDay returns the day date (YYYY-MM-DD) in loc.
func NewBillDay(date string, loc *time.Location) (BillDay, error) {
	t, err := time.ParseInLocation(time.DateOnly, date, loc)
	if err != nil {
		return BillDay{}, fmt.Errorf("bill date %q: want YYYY-MM-DD", date)
	}
	return BillDay{Date: t}, nil
}

// String is the day as YYYY-MM-DD.
func (d BillDay) String() string { return d.Date.Format(time.DateOnly) }

// start is the first instant of the day offset days from d.
func (d BillDay) start(offset int) time.Time {
	y, m, day := d.Date.Date()
	return time.Date(y, m, day+offset, 0, 0, 0, 0, d.Date.Location())
}

// BillRow is one payment or refund of a statement, as stored.
type BillRow struct {
	Kind     byte // 'P' payment, 'R' refund
	Trade    string
	RefundID string
	OrderNo  string
	// Amount is in fen: the trade's total, or the refund's amount.
	Amount int64
	// TradeTotal is a refund row's statement of the trade's total (0:
	// none).
	TradeTotal int64
	Line       int
}

// BillSide is one side's count and sums of a day.
type BillSide struct {
	Payments int   `json:"payments"`
	Paid     int64 `json:"paid"`
	Refunds  int   `json:"refunds"`
	Refunded int64 `json:"refunded"`
	Fees     int64 `json:"fees,omitempty"`
}

// The categories a bill row or ledger entry ends in.
const (
	BillMatched        = "matched"
	BillChannelOnly    = "channel_only"
	BillLedgerOnly     = "ledger_only"
	BillAmountMismatch = "amount_mismatch"
	BillPending        = "pending"
)

// BillCategories lists the categories, for metrics and pages.
var BillCategories = []string{BillMatched, BillChannelOnly, BillLedgerOnly, BillAmountMismatch, BillPending}

// The states of a bill run.
const (
	BillOK      = "ok"
	BillMissing = "missing"
	BillError   = "error"
)

// BillRun is one day's comparison of a channel's statement.
type BillRun struct {
	Channel   string     `json:"channel"`
	Date      string     `json:"date"`
	State     string     `json:"state"`
	Message   string     `json:"message,omitempty"`
	FetchedAt *time.Time `json:"fetched_at"`
	UpdatedAt time.Time  `json:"updated_at"`
	Bill      BillSide   `json:"bill"`
	Ledger    BillSide   `json:"ledger"`
	// Categories counts rows and entries by category.
	Categories map[string]int `json:"categories"`
	Items      []BillItem     `json:"items,omitempty"`
	// ItemsTruncated: the run has more than MaxBillItems items; Items
	// holds the first.
	ItemsTruncated bool `json:"items_truncated,omitempty"`
}

// BillItem is a bill row or ledger entry that did not match.
type BillItem struct {
	ID       int64  `json:"id"`
	Category string `json:"category"`
	Kind     string `json:"kind"` // payment, refund
	// Trade is {channel}:{transaction id}, as biz_order.paid_by holds it.
	Trade        string `json:"trade"`
	RefundID     string `json:"refund_id,omitempty"`
	OrderNo      string `json:"order_no"`
	BillAmount   *int64 `json:"bill_amount"`
	LedgerAmount *int64 `json:"ledger_amount"`
	// TradeTotal is the trade's total, for a refund's repair (a refund's
	// callback states it).
	TradeTotal *int64 `json:"trade_total,omitempty"`
	// RefundedThrough is, for a refund, the trade's refunds in the stored
	// statements up to and with this one: Alipay's refund_fee.
	RefundedThrough *int64 `json:"refunded_through,omitempty"`
	// Refunded: a payment the channel refunded too (never applied).
	Refunded   bool   `json:"refunded_at_channel,omitempty"`
	RecordedOn string `json:"recorded_on,omitempty"`
	Action     string `json:"action"`
	Detail     string `json:"detail,omitempty"`
}

// billRowsKept is how many days of statements stay in bill_row: a ledger
// entry of day D is looked for in the bills of D-1 to D+1, so a week
// leaves room for late and re-run days.
const billRowsKept = 7

// rowSource feeds COPY from a statement reader.
type rowSource struct {
	channel string
	date    time.Time
	next    func() (BillRow, error)
	row     BillRow
	err     error
}

func (r *rowSource) Next() bool {
	row, err := r.next()
	if err != nil {
		if !errors.Is(err, io.EOF) {
			r.err = err
		}
		return false
	}
	r.row = row
	return true
}

func (r *rowSource) Values() ([]any, error) {
	return []any{r.channel, r.date, string(r.row.Kind), r.row.Trade, r.row.RefundID, r.row.OrderNo,
		r.row.Amount, r.row.TradeTotal, r.row.Line}, nil
}

func (r *rowSource) Err() error { return r.err }

// CompareBill replaces channel's statement of day with the rows next
// returns (io.EOF at the end, after the statement's own checks) and
// compares it with the ledger, in one transaction: a statement that fails
// part way stores nothing. It writes the day's items (action "") and
// returns the counts; the bill's side is the rows stored.
//
//   - A payment row whose trade paid no order is channel_only (refunded
//     when the channel refunded the trade too, in any stored bill or here);
//     one that paid an order of another amount is amount_mismatch.
//   - A refund row not in trade_refund is channel_only; one of another
//     amount is amount_mismatch.
//   - A ledger entry recorded on the day before day, in none of the bills
//     of the day before it, that day and day, and not repaired by a bill,
//     is ledger_only; entries of day itself not in its bill or the one
//     before are pending until the next day's bill.
func (s *Store) CompareBill(ctx context.Context, channel string, day BillDay, next func() (BillRow, error)) (BillRun, error) {
	run := BillRun{Channel: channel, Date: day.String(), Categories: map[string]int{}}
	tx, err := s.ops.Begin(ctx)
	if err != nil {
		return run, wrap(ctx, "bill: begin", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// The rows stream from the channel's connection into one COPY, and
	// the comparison reads a day of the ledger: neither fits the operator
	// pool's statement timeout. ctx bounds them instead.
	if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = 0`); err != nil {
		return run, wrap(ctx, "bill: statement timeout", err)
	}
	date := day.Date
	if _, err := tx.Exec(ctx, `DELETE FROM bill_row WHERE channel = $1 AND (bill_date = $2 OR bill_date < $2::date - $3::int)`,
		channel, date, billRowsKept); err != nil {
		return run, wrap(ctx, "bill: clear the day's rows", err)
	}
	src := &rowSource{channel: channel, date: date, next: next}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"bill_row"},
		[]string{"channel", "bill_date", "kind", "trade", "refund_id", "order_no", "amount", "trade_total", "line"}, src); err != nil {
		if src.err != nil {
			return run, src.err // the statement's own error, as the reader said it
		}
		return run, wrap(ctx, "bill: store the rows", err)
	}
	prefix := channel + ":"
	args := pgx.NamedArgs{"channel": channel, "date": date, "prefix": prefix,
		"prev": day.start(-1), "start": day.start(0), "end": day.start(1), "zone": date.Location().String()}
	for _, q := range []struct{ what, sql string }{
		{"clear the day's items", `DELETE FROM bill_item WHERE channel = @channel::text AND bill_date = @date::date`},
		{"payments", sqlBillPayments},
		{"refunds", sqlBillRefunds},
		{"ledger payments", sqlBillLedgerPayments},
		{"ledger refunds", sqlBillLedgerRefunds},
	} {
		if _, err := tx.Exec(ctx, q.sql, args); err != nil {
			return run, wrap(ctx, "bill: "+q.what, err)
		}
	}
	var pending int
	if err := tx.QueryRow(ctx, sqlBillSides, args).Scan(
		&run.Bill.Payments, &run.Bill.Paid, &run.Bill.Refunds, &run.Bill.Refunded,
		&run.Ledger.Payments, &run.Ledger.Paid, &run.Ledger.Refunds, &run.Ledger.Refunded, &pending); err != nil {
		return run, wrap(ctx, "bill: count", err)
	}
	rows, err := tx.Query(ctx, `SELECT category, count(*) FILTER (WHERE recorded_on IS NULL), count(*) FROM bill_item
		WHERE channel = @channel::text AND bill_date = @date::date GROUP BY category`, args)
	if err != nil {
		return run, wrap(ctx, "bill: count the items", err)
	}
	inBill := 0
	for rows.Next() {
		var cat string
		var fromBill, n int
		if err := rows.Scan(&cat, &fromBill, &n); err != nil {
			rows.Close()
			return run, wrap(ctx, "bill: count the items", err)
		}
		run.Categories[cat] = n
		inBill += fromBill
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return run, wrap(ctx, "bill: count the items", err)
	}
	run.Categories[BillMatched] = run.Bill.Payments + run.Bill.Refunds - inBill
	run.Categories[BillPending] = pending
	for _, c := range BillCategories {
		run.Categories[c] += 0
	}
	if err := tx.Commit(ctx); err != nil {
		return run, wrap(ctx, "bill: commit", err)
	}
	return run, nil
}

// sqlBillPayments: the day's payment rows whose trade paid no order
// (channel_only) or an order of another amount (amount_mismatch). A trade
// a callback delivered that paid no order (a duplicate payment, a payment
// after close: its claim, or its review, records it) is recorded here: it
// counts as matched, for its review says the rest.
const sqlBillPayments = `
INSERT INTO bill_item (channel, bill_date, category, kind, trade, order_no, bill_amount, ledger_amount, refunded)
SELECT @channel::text, @date::date, CASE WHEN o.order_no IS NULL THEN 'channel_only' ELSE 'amount_mismatch' END, 'payment',
       @prefix::text || r.trade, coalesce(o.order_no, r.order_no), r.amount, o.amount,
       o.order_no IS NULL AND (
           EXISTS (SELECT 1 FROM bill_row x WHERE x.channel = @channel::text AND x.trade = r.trade AND x.kind = 'R')
        OR EXISTS (SELECT 1 FROM trade_refund t WHERE t.trade = @prefix::text || r.trade))
  FROM bill_row r LEFT JOIN biz_order o ON o.paid_by = @prefix::text || r.trade
 WHERE r.channel = @channel::text AND r.bill_date = @date::date AND r.kind = 'P'
   AND (o.order_no IS NULL OR o.amount <> r.amount)
   AND NOT (o.order_no IS NULL AND (
           EXISTS (SELECT 1 FROM notify_claim c WHERE c.biz_key = @prefix::text || r.trade || ':PAY_SUCCESS' AND c.claim_state = 'DONE')
        OR EXISTS (SELECT 1 FROM notify_review v WHERE v.biz_key = @prefix::text || r.trade || ':PAY_SUCCESS'
                      AND v.reason IN ('DUPLICATE_PAYMENT', 'PAID_AFTER_CLOSE'))))
 ORDER BY r.line`

// sqlBillRefunds: the day's refund rows not recorded (channel_only) or
// recorded with another amount (amount_mismatch). A refund's repair
// needs the trade's total (the row's own, else the order it paid, else the
// trade's payment row, else the order the row names) and, for a channel
// that states refunds as the trade's running total (Alipay's refund_fee),
// the sum of the trade's refunds in the stored statements up to this one.
const sqlBillRefunds = `
INSERT INTO bill_item (channel, bill_date, category, kind, trade, refund_id, order_no, bill_amount, ledger_amount, trade_total, refunded_through)
SELECT @channel::text, @date::date, CASE WHEN t.trade IS NULL THEN 'channel_only' ELSE 'amount_mismatch' END, 'refund',
       @prefix::text || r.trade, r.refund_id, coalesce(t.order_no, r.order_no), r.amount, t.amount,
       coalesce(nullif(r.trade_total, 0),
                (SELECT o.amount FROM biz_order o WHERE o.paid_by = @prefix::text || r.trade),
                (SELECT p.amount FROM bill_row p WHERE p.channel = @channel::text AND p.trade = r.trade AND p.kind = 'P' LIMIT 1),
                (SELECT o.amount FROM biz_order o WHERE o.order_no = r.order_no)),
       (SELECT sum(x.amount) FROM bill_row x WHERE x.channel = @channel::text AND x.trade = r.trade AND x.kind = 'R'
           AND (x.bill_date, x.line) <= (r.bill_date, r.line))
  FROM bill_row r LEFT JOIN trade_refund t ON t.trade = @prefix::text || r.trade AND t.refund_id = r.refund_id
 WHERE r.channel = @channel::text AND r.bill_date = @date::date AND r.kind = 'R'
   AND (t.trade IS NULL OR t.amount <> r.amount)
 ORDER BY r.line`

// sqlBillLedgerPayments: payments recorded the day before, in none of the
// bills of the day before it to this one, and not repaired by a bill. Only
// once those bills were compared (their runs ok, their rows still stored:
// a day re-run long after is not judged against pruned neighbours);
// otherwise the entries are left unjudged rather than called missing.
const sqlBillLedgerPayments = `
INSERT INTO bill_item (channel, bill_date, category, kind, trade, order_no, ledger_amount, recorded_on)
SELECT @channel::text, @date::date, 'ledger_only', 'payment', o.paid_by, o.order_no, o.amount, (o.paid_at AT TIME ZONE @zone::text)::date
  FROM biz_order o
 WHERE o.paid_at >= @prev::timestamptz AND o.paid_at < @start::timestamptz AND left(o.paid_by, length(@prefix::text)) = @prefix::text
   AND NOT EXISTS (SELECT 1 FROM bill_row r WHERE r.channel = @channel::text AND r.trade = substr(o.paid_by, length(@prefix::text) + 1)
                      AND r.kind = 'P' AND r.bill_date BETWEEN @date::date - 2 AND @date::date)
   AND NOT EXISTS (SELECT 1 FROM bill_item i WHERE i.category = 'channel_only' AND i.trade = o.paid_by AND i.refund_id = '')
   AND EXISTS (SELECT 1 FROM bill_run b WHERE b.channel = @channel::text AND b.bill_date = @date::date - 1 AND b.state = 'ok')
   AND EXISTS (SELECT 1 FROM bill_run b WHERE b.channel = @channel::text AND b.bill_date = @date::date - 2 AND b.state = 'ok')
   AND @date::date >= (SELECT max(x.bill_date) FROM bill_row x WHERE x.channel = @channel::text) - 5
 ORDER BY o.paid_at`

// sqlBillLedgerRefunds: the same for refunds; a refund recorded without a
// channel refund id can match no statement row and is never judged.
const sqlBillLedgerRefunds = `
INSERT INTO bill_item (channel, bill_date, category, kind, trade, refund_id, order_no, ledger_amount, recorded_on)
SELECT @channel::text, @date::date, 'ledger_only', 'refund', t.trade, t.refund_id, t.order_no, t.amount, (t.created_at AT TIME ZONE @zone::text)::date
  FROM trade_refund t
 WHERE t.created_at >= @prev::timestamptz AND t.created_at < @start::timestamptz AND left(t.trade, length(@prefix::text)) = @prefix::text
   AND NOT EXISTS (SELECT 1 FROM bill_row r WHERE r.channel = @channel::text AND r.trade = substr(t.trade, length(@prefix::text) + 1)
                      AND r.kind = 'R' AND r.refund_id = t.refund_id AND r.bill_date BETWEEN @date::date - 2 AND @date::date)
   AND NOT EXISTS (SELECT 1 FROM bill_item i WHERE i.category = 'channel_only' AND i.trade = t.trade AND i.refund_id = t.refund_id)
   AND t.refund_id <> ''
   AND EXISTS (SELECT 1 FROM bill_run b WHERE b.channel = @channel::text AND b.bill_date = @date::date - 1 AND b.state = 'ok')
   AND EXISTS (SELECT 1 FROM bill_run b WHERE b.channel = @channel::text AND b.bill_date = @date::date - 2 AND b.state = 'ok')
   AND @date::date >= (SELECT max(x.bill_date) FROM bill_row x WHERE x.channel = @channel::text) - 5
 ORDER BY t.created_at`

// sqlBillSides counts the bill's rows and the ledger's entries of the day,
// and the day's entries not yet in a bill (pending).
const sqlBillSides = `
WITH b AS (
    SELECT count(*) FILTER (WHERE kind = 'P') AS np, coalesce(sum(amount) FILTER (WHERE kind = 'P'), 0) AS sp,
           count(*) FILTER (WHERE kind = 'R') AS nr, coalesce(sum(amount) FILTER (WHERE kind = 'R'), 0) AS sr
      FROM bill_row WHERE channel = @channel::text AND bill_date = @date::date),
p AS (
    SELECT o.amount, EXISTS (SELECT 1 FROM bill_row r WHERE r.channel = @channel::text AND r.trade = substr(o.paid_by, length(@prefix::text) + 1)
                                AND r.kind = 'P' AND r.bill_date BETWEEN @date::date - 1 AND @date::date) AS seen
      FROM biz_order o
     WHERE o.paid_at >= @start::timestamptz AND o.paid_at < @end::timestamptz AND left(o.paid_by, length(@prefix::text)) = @prefix::text),
f AS (
    SELECT t.amount, EXISTS (SELECT 1 FROM bill_row r WHERE r.channel = @channel::text AND r.trade = substr(t.trade, length(@prefix::text) + 1)
                                AND r.kind = 'R' AND r.refund_id = t.refund_id AND r.bill_date BETWEEN @date::date - 1 AND @date::date) AS seen
      FROM trade_refund t
     WHERE t.created_at >= @start::timestamptz AND t.created_at < @end::timestamptz AND left(t.trade, length(@prefix::text)) = @prefix::text)
SELECT b.np, b.sp, b.nr, b.sr,
       (SELECT count(*) FROM p), (SELECT coalesce(sum(amount), 0) FROM p),
       (SELECT count(*) FROM f), (SELECT coalesce(sum(amount), 0) FROM f),
       (SELECT count(*) FROM p WHERE NOT seen) + (SELECT count(*) FROM f WHERE NOT seen)
  FROM b`

// BillItems returns up to limit items of the run after id after, in id
// order; pendingOnly keeps those not acted on yet.
func (s *Store) BillItems(ctx context.Context, channel string, day BillDay, after int64, limit int, pendingOnly bool) ([]BillItem, error) {
	rows, err := s.ops.Query(ctx, `
SELECT id, category, kind, trade, refund_id, order_no, bill_amount, ledger_amount, trade_total, refunded_through, refunded,
       coalesce(to_char(recorded_on, 'YYYY-MM-DD'), ''), action, detail
  FROM bill_item WHERE channel = $1 AND bill_date = $2 AND id > $3 AND (NOT $5 OR action = '')
 ORDER BY id LIMIT $4`, channel, day.Date, after, limit, pendingOnly)
	if err != nil {
		return nil, wrap(ctx, "bill items", err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BillItem, error) {
		var it BillItem
		err := r.Scan(&it.ID, &it.Category, &it.Kind, &it.Trade, &it.RefundID, &it.OrderNo, &it.BillAmount,
			&it.LedgerAmount, &it.TradeTotal, &it.RefundedThrough, &it.Refunded, &it.RecordedOn, &it.Action, &it.Detail)
		return it, err
	})
	if err != nil {
		return nil, wrap(ctx, "bill items", err)
	}
	return items, nil
}

// SetBillItemAction records what was done about item id.
func (s *Store) SetBillItemAction(ctx context.Context, id int64, action, detail string) error {
	if _, err := s.ops.Exec(ctx, `UPDATE bill_item SET action = $2, detail = $3 WHERE id = $1`, id, action, detail); err != nil {
		return wrap(ctx, "bill item action", err)
	}
	return nil
}

// SaveBillRun records run (replacing the day's earlier run). A run that is
// not ok keeps the day's earlier items only when it is missing or error
// before any comparison: CompareBill has replaced them otherwise.
func (s *Store) SaveBillRun(ctx context.Context, run BillRun) error {
	c := run.Categories
	_, err := s.ops.Exec(ctx, `
INSERT INTO bill_run (channel, bill_date, state, message, fetched_at, updated_at,
    bill_payments, bill_paid, bill_refunds, bill_refunded, bill_fees,
    ledger_payments, ledger_paid, ledger_refunds, ledger_refunded,
    matched, channel_only, ledger_only, amount_mismatch, pending)
VALUES ($1, $2, $3, nullif($4, ''), $5, now(), $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)
ON CONFLICT (channel, bill_date) DO UPDATE SET
    state = EXCLUDED.state, message = EXCLUDED.message, fetched_at = EXCLUDED.fetched_at, updated_at = now(),
    bill_payments = EXCLUDED.bill_payments, bill_paid = EXCLUDED.bill_paid, bill_refunds = EXCLUDED.bill_refunds,
    bill_refunded = EXCLUDED.bill_refunded, bill_fees = EXCLUDED.bill_fees,
    ledger_payments = EXCLUDED.ledger_payments, ledger_paid = EXCLUDED.ledger_paid,
    ledger_refunds = EXCLUDED.ledger_refunds, ledger_refunded = EXCLUDED.ledger_refunded,
    matched = EXCLUDED.matched, channel_only = EXCLUDED.channel_only, ledger_only = EXCLUDED.ledger_only,
    amount_mismatch = EXCLUDED.amount_mismatch, pending = EXCLUDED.pending`,
		run.Channel, run.Date, run.State, run.Message, run.FetchedAt,
		run.Bill.Payments, run.Bill.Paid, run.Bill.Refunds, run.Bill.Refunded, run.Bill.Fees,
		run.Ledger.Payments, run.Ledger.Paid, run.Ledger.Refunds, run.Ledger.Refunded,
		c[BillMatched], c[BillChannelOnly], c[BillLedgerOnly], c[BillAmountMismatch], c[BillPending])
	if err != nil {
		return wrap(ctx, "save bill run "+run.Channel+" "+run.Date, err)
	}
	return nil
}

// ErrNoBillRun: no run of that channel and day.
var ErrNoBillRun = errors.New("no bill run of that channel and day")

// BillRunQuery selects runs: Channel "" is every channel; From and To
// (YYYY-MM-DD, inclusive) bound the day when set.
type BillRunQuery struct {
	Channel, From, To string
	Limit             int
}

const sqlBillRunColumns = `channel, to_char(bill_date, 'YYYY-MM-DD'), state, coalesce(message, ''), fetched_at, updated_at,
    bill_payments, bill_paid, bill_refunds, bill_refunded, bill_fees,
    ledger_payments, ledger_paid, ledger_refunds, ledger_refunded,
    matched, channel_only, ledger_only, amount_mismatch, pending`

func scanBillRun(r pgx.CollectableRow) (BillRun, error) {
	var run BillRun
	var m, co, lo, am, p int
	err := r.Scan(&run.Channel, &run.Date, &run.State, &run.Message, &run.FetchedAt, &run.UpdatedAt,
		&run.Bill.Payments, &run.Bill.Paid, &run.Bill.Refunds, &run.Bill.Refunded, &run.Bill.Fees,
		&run.Ledger.Payments, &run.Ledger.Paid, &run.Ledger.Refunds, &run.Ledger.Refunded, &m, &co, &lo, &am, &p)
	run.Categories = map[string]int{BillMatched: m, BillChannelOnly: co, BillLedgerOnly: lo, BillAmountMismatch: am, BillPending: p}
	return run, err
}

// BillRuns lists runs, newest day first.
func (s *Store) BillRuns(ctx context.Context, q BillRunQuery) ([]BillRun, error) {
	if q.Limit <= 0 || q.Limit > 1000 {
		q.Limit = 100
	}
	rows, err := s.ops.Query(ctx, `SELECT `+sqlBillRunColumns+` FROM bill_run
 WHERE ($1 = '' OR channel = $1) AND ($2 = '' OR bill_date >= $2::date) AND ($3 = '' OR bill_date <= $3::date)
 ORDER BY bill_date DESC, channel LIMIT $4`, q.Channel, q.From, q.To, q.Limit)
	if err != nil {
		return nil, wrap(ctx, "bill runs", err)
	}
	runs, err := pgx.CollectRows(rows, scanBillRun)
	if err != nil {
		return nil, wrap(ctx, "bill runs", err)
	}
	return runs, nil
}

// BillRunOf returns the run of channel and day with its items (the first
// MaxBillItems); ErrNoBillRun when there is none.
func (s *Store) BillRunOf(ctx context.Context, channel string, day BillDay) (BillRun, error) {
	rows, err := s.ops.Query(ctx, `SELECT `+sqlBillRunColumns+` FROM bill_run WHERE channel = $1 AND bill_date = $2`, channel, day.Date)
	if err != nil {
		return BillRun{}, wrap(ctx, "bill run", err)
	}
	run, err := pgx.CollectExactlyOneRow(rows, scanBillRun)
	if errors.Is(err, pgx.ErrNoRows) {
		return BillRun{}, ErrNoBillRun
	}
	if err != nil {
		return BillRun{}, wrap(ctx, "bill run", err)
	}
	for after := int64(0); ; {
		items, err := s.BillItems(ctx, channel, day, after, 1000, false)
		if err != nil {
			return run, err
		}
		run.Items = append(run.Items, items...)
		if len(items) < 1000 {
			return run, nil
		}
		if len(run.Items) >= MaxBillItems {
			run.ItemsTruncated = true
			return run, nil
		}
		after = items[len(items)-1].ID
	}
}

// MaxBillItems is the most items BillRunOf returns with a run.
const MaxBillItems = 10_000

// BillRunState returns the state of channel's run of day ("" when the
// day has none).
func (s *Store) BillRunState(ctx context.Context, channel string, day BillDay) (string, error) {
	var state string
	err := s.ops.QueryRow(ctx, `SELECT state FROM bill_run WHERE channel = $1 AND bill_date = $2`, channel, day.Date).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", wrap(ctx, "bill run state", err)
	}
	return state, nil
}

// BillGauge is what a channel's bills say at the moment: when its last ok
// run was recorded, and the categories of its latest run.
type BillGauge struct {
	LastOK     time.Time
	Categories map[string]int
}

// BillGauges returns each channel's BillGauge.
func (s *Store) BillGauges(ctx context.Context) (map[string]BillGauge, error) {
	rows, err := s.ops.Query(ctx, `
SELECT l.channel, coalesce((SELECT max(updated_at) FROM bill_run o WHERE o.channel = l.channel AND o.state = 'ok'), 'epoch'),
       l.matched, l.channel_only, l.ledger_only, l.amount_mismatch, l.pending
  FROM (SELECT DISTINCT ON (channel) * FROM bill_run ORDER BY channel, bill_date DESC) l`)
	if err != nil {
		return nil, wrap(ctx, "bill gauges", err)
	}
	defer rows.Close()
	out := map[string]BillGauge{}
	for rows.Next() {
		var ch string
		var g BillGauge
		var m, co, lo, am, p int
		if err := rows.Scan(&ch, &g.LastOK, &m, &co, &lo, &am, &p); err != nil {
			return nil, wrap(ctx, "bill gauges", err)
		}
		g.Categories = map[string]int{BillMatched: m, BillChannelOnly: co, BillLedgerOnly: lo, BillAmountMismatch: am, BillPending: p}
		out[ch] = g
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(ctx, "bill gauges", err)
	}
	return out, nil
}

// BillsLockID is the session advisory lock that elects the one node that
// fetches the channels' statements on schedule.
const BillsLockID = int64(0x62696c6c73) // "bills"

// BillDayLockID is the session advisory lock a run of channel's day holds:
// one run of a day at a time, whichever node or path started it.
func BillDayLockID(channel string, day BillDay) int64 {
	h := fnv.New64a()
	h.Write([]byte("notifyedge bill " + channel + " " + day.String()))
	return int64(h.Sum64() &^ (1 << 63))
}

// PruneBills deletes runs and items of days before before, a batch at a
// time; it returns how many rows went.
func (s *Store) PruneBills(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	for _, q := range []string{
		`DELETE FROM bill_item WHERE id IN (SELECT id FROM bill_item WHERE bill_date < $1 LIMIT 5000)`,
		`DELETE FROM bill_run WHERE (channel, bill_date) IN (SELECT channel, bill_date FROM bill_run WHERE bill_date < $1 LIMIT 5000)`,
	} {
		for {
			tag, err := s.ops.Exec(ctx, q, before)
			if err != nil {
				return total, wrap(ctx, "prune bills", err)
			}
			total += tag.RowsAffected()
			if tag.RowsAffected() < 5000 {
				break
			}
		}
	}
	return total, nil
}

// BillReview opens a review (NOT_IN_BILL, BILL_MISMATCH) for item of
// channel's day, once: the same item compared again finds it open. Its
// key is the entry's as a callback would key it; its body says what the
// two sides hold.
func (s *Store) BillReview(ctx context.Context, channel, date string, item BillItem, reason ReviewReason) error {
	name := item.Trade[len(channel)+1:]
	event := "PAY_SUCCESS"
	if item.Kind == "refund" {
		name, event = item.RefundID, "REFUND_SUCCESS"
	}
	key := channel + ":" + name + ":" + event
	body, err := json.Marshal(map[string]any{"source": "bill", "channel": channel, "bill_date": date, "category": item.Category,
		"kind": item.Kind, "trade": item.Trade, "refund_id": item.RefundID, "order_no": item.OrderNo,
		"bill_amount": item.BillAmount, "ledger_amount": item.LedgerAmount, "recorded_on": item.RecordedOn})
	if err != nil {
		return fmt.Errorf("bill review: %w", err)
	}
	sum := sha256.Sum256([]byte(string(reason) + "\n" + item.Trade + "\n" + item.RefundID + "\n" + amountText(item.BillAmount) + "\n" + amountText(item.LedgerAmount)))
	orderNo := item.OrderNo
	if orderNo == "" {
		orderNo = "-"
	}
	if _, err := s.ops.Exec(ctx, sqlRecordReview, key, orderNo, string(reason), hex.EncodeToString(sum[:]), string(body)); err != nil {
		return wrap(ctx, "bill review "+key, err)
	}
	return nil
}

func amountText(a *int64) string {
	if a == nil {
		return "-"
	}
	return fmt.Sprint(*a)
}
