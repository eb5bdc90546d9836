// Package invariant checks by SQL the money invariants that the durable
// schema keeps whatever the load, crashes and retries did: no order moves
// twice, one outbox row per applied claim and none without one, a DONE
// claim for every key answered SUCCESS, refunds that add up. It imports no
// test code, so benches and fault runs check in their own binaries what
// the tests check.
package invariant

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Querier is what Check reads through: *pgxpool.Pool, *pgx.Conn and
// pgx.Tx satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrViolated marks the error Check returns when the stored state breaks
// a money invariant (as opposed to a query that failed).
var ErrViolated = errors.New("invariant: money invariant violated")

// onceTopics are the topics an order moves through at most once. Partial
// refunds (ORDER_PARTIALLY_REFUNDED) may repeat, so they are not here.
var onceTopics = []string{"ORDER_PAID", "ORDER_SHIPPED", "ORDER_CLOSED", "ORDER_REFUNDED"}

// appliedClaim matches the result_json of an applied claim. The stored form
// is byte for byte canonical (the SQL function notifyedge_result writes
// every one), so a substring match is exact, and unlike a cast to jsonb it
// cannot fail on a malformed row.
const appliedClaim = `strpos(c.result_json, '"outcome":"applied"') > 0`

// maxExamples bounds how many offenders a violation names.
const maxExamples = 5

// Check checks by SQL the money invariants over the orders whose
// order_no starts with orderPrefix ("" = every order; % and _ in it are
// literal), as the callback path, internal transitions and partial refunds
// leave them:
//
//   - no (order_no, topic) appears twice in outbox for ORDER_PAID,
//     ORDER_SHIPPED, ORDER_CLOSED or ORDER_REFUNDED;
//   - every claim whose result_json says "outcome":"applied" has exactly one
//     outbox row whose payload biz_key is its biz_key, and every outbox row
//     with a non-null payload biz_key has an applied claim of that key
//     (rows with a null biz_key are internal transitions and count as their
//     own; claims keyed "@..." are internal API requests, whose rows carry a
//     null biz_key, and are skipped);
//   - every key in answeredSuccess (the biz_keys answered SUCCESS) has a
//     claim in state DONE, whatever its order;
//   - every order's refunded_amount is the sum of its paying trade's
//     (paid_by's) trade_refund rows for it (0 when paid_by is NULL), so a
//     refund counted in the amount is recorded and none is counted twice;
//   - refunded_amount lies between 0 and the amount;
//   - an order is REFUNDED exactly when refunded_amount equals its amount
//     (TRADE_CLOSED of the payer sets both, recording the rest as one
//     refund without an id, so this holds for it too).
//
// Retention deletes old claims and published outbox rows independently, so
// the claim and outbox checks hold only where retention has not run; the
// refund checks hold always (orders and trade_refund are never deleted), for
// orders durable has decided since migration 0004. An order that other
// systems moved themselves (REFUNDED written without refunded_amount, or a
// refunded order whose payer is still unknown) breaks them: that is what
// they exist to show.
//
// It returns nil, or one error (wrapping ErrViolated) that lists every
// violation with counts; a failed query is an error too (never a silent zero).
func Check(ctx context.Context, db Querier, orderPrefix string, answeredSuccess []string) error {
	like := likePrefix(orderPrefix)
	checks := []check{
		{
			name: "duplicate outbox topic",
			unit: "(order_no, topic) pairs written more than once",
			sql: `SELECT count(*), coalesce((array_agg(format('%s %s x%s', order_no, topic, n) ORDER BY order_no, topic))[1:$3], '{}')
FROM (SELECT order_no, topic, count(*) AS n FROM outbox
       WHERE order_no LIKE $1 ESCAPE '\' AND topic = ANY ($2)
       GROUP BY order_no, topic HAVING count(*) > 1) d`,
			args: []any{like, onceTopics, maxExamples},
		},
		{
			name: "applied claim without exactly one outbox row",
			unit: "claims",
			sql: `WITH o AS (
    SELECT payload->>'biz_key' AS biz_key, count(*) AS n FROM outbox
     WHERE order_no LIKE $1 ESCAPE '\' AND payload->>'biz_key' IS NOT NULL
     GROUP BY 1)
SELECT count(*), coalesce((array_agg(format('%s: %s rows', c.biz_key, coalesce(o.n, 0)) ORDER BY c.biz_key))[1:$2], '{}')
  FROM notify_claim c LEFT JOIN o ON o.biz_key = c.biz_key
 WHERE c.order_no LIKE $1 ESCAPE '\' AND c.biz_key NOT LIKE '@%' AND ` + appliedClaim + `
   AND coalesce(o.n, 0) <> 1`,
			args: []any{like, maxExamples},
		},
		{
			name: "outbox row without an applied claim",
			unit: "rows",
			sql: `SELECT count(*), coalesce((array_agg(format('id %s %s %s biz_key %s', x.id, x.order_no, x.topic, x.biz_key) ORDER BY x.id))[1:$2], '{}')
  FROM (SELECT id, order_no, topic, payload->>'biz_key' AS biz_key FROM outbox
         WHERE order_no LIKE $1 ESCAPE '\') x
 WHERE x.biz_key IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM notify_claim c WHERE c.biz_key = x.biz_key AND ` + appliedClaim + `)`,
			args: []any{like, maxExamples},
		},
		{
			name: "refunded amount is not its paying trade's recorded refunds",
			unit: "orders",
			sql: `SELECT count(*), coalesce((array_agg(format('%s: refunded_amount %s, refunds of paid_by %s: %s',
           o.order_no, o.refunded_amount, coalesce(o.paid_by, 'NULL'), coalesce(t.recorded, 0)) ORDER BY o.order_no))[1:$2], '{}')
  FROM biz_order o
  LEFT JOIN (SELECT trade, order_no, sum(amount) AS recorded FROM trade_refund
              WHERE order_no LIKE $1 ESCAPE '\' GROUP BY trade, order_no) t
         ON t.trade = o.paid_by AND t.order_no = o.order_no
 WHERE o.order_no LIKE $1 ESCAPE '\' AND o.refunded_amount <> coalesce(t.recorded, 0)`,
			args: []any{like, maxExamples},
		},
		{
			name: "refunded amount outside 0 to the amount",
			unit: "orders",
			sql: `SELECT count(*), coalesce((array_agg(format('%s: refunded %s of %s', order_no, refunded_amount, amount) ORDER BY order_no))[1:$2], '{}')
  FROM biz_order
 WHERE order_no LIKE $1 ESCAPE '\' AND (refunded_amount < 0 OR refunded_amount > amount)`,
			args: []any{like, maxExamples},
		},
		{
			name: "REFUNDED and fully refunded disagree",
			unit: "orders",
			sql: `SELECT count(*), coalesce((array_agg(format('%s: %s, refunded %s of %s', order_no, status, refunded_amount, amount) ORDER BY order_no))[1:$2], '{}')
  FROM biz_order
 WHERE order_no LIKE $1 ESCAPE '\' AND (status = 'REFUNDED') <> (refunded_amount = amount)`,
			args: []any{like, maxExamples},
		},
	}
	if len(answeredSuccess) > 0 {
		distinct := make(map[string]struct{}, len(answeredSuccess))
		for _, k := range answeredSuccess {
			distinct[k] = struct{}{}
		}
		checks = append(checks, check{
			name: "SUCCESS answered without a DONE claim",
			unit: "keys",
			sql: `SELECT count(*), coalesce((array_agg(a.k ORDER BY a.k))[1:$2], '{}')
  FROM (SELECT DISTINCT unnest($1::text[]) AS k) a
 WHERE NOT EXISTS (SELECT 1 FROM notify_claim c WHERE c.biz_key = a.k AND c.claim_state = 'DONE')`,
			args:  []any{answeredSuccess, maxExamples},
			total: len(distinct),
		})
	}

	var violations []string
	for _, c := range checks {
		var n int
		var examples []string
		if err := db.QueryRow(ctx, c.sql, c.args...).Scan(&n, &examples); err != nil {
			qerr := fmt.Errorf("invariant: check %q: %w", c.name, err)
			if len(violations) > 0 {
				return errors.Join(violated(violations), qerr)
			}
			return qerr
		}
		if n == 0 {
			continue
		}
		count := fmt.Sprint(n)
		if c.total > 0 {
			count = fmt.Sprintf("%d of %d", n, c.total)
		}
		more := ""
		if n > len(examples) {
			more = ", ..."
		}
		violations = append(violations, fmt.Sprintf("%s: %s %s (%s%s)", c.name, count, c.unit, strings.Join(examples, ", "), more))
	}
	if len(violations) > 0 {
		return violated(violations)
	}
	return nil
}

// check is one invariant's query: it returns the number of offenders and
// the first few of them, described.
type check struct {
	name  string // names the violation in the error
	unit  string // what the count counts
	sql   string
	args  []any
	total int // > 0: the count is "n of total"
}

func violated(violations []string) error {
	return fmt.Errorf("%w: %s", ErrViolated, strings.Join(violations, "; "))
}

// likePrefix returns the LIKE pattern (escape character \) that matches
// the strings starting with prefix: order numbers may contain % and _.
func likePrefix(prefix string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(prefix) + "%"
}
