package durable

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Review errors.
var (
	// ErrReviewNotFound: no review row has that id.
	ErrReviewNotFound = errors.New("durable: review not found")
	// ErrReviewResolved: the review row was resolved already.
	ErrReviewResolved = errors.New("durable: review already resolved")
)

// Review is one row of the review queue.
type Review struct {
	ID          int64
	BizKey      string
	OrderNo     string
	Reason      ReviewReason
	PayloadHash string
	RawBody     string
	CreatedAt   time.Time
	ResolvedAt  *time.Time
	Resolution  *string
	ResolvedBy  *string
}

// ReviewState selects review rows by resolution.
type ReviewState string

// The review states a listing may select.
const (
	ReviewOpen     ReviewState = "open"
	ReviewResolved ReviewState = "resolved"
	ReviewAll      ReviewState = "all"
)

// ReviewQuery selects a page of the review queue, newest first.
type ReviewQuery struct {
	State ReviewState // default open
	Limit int         // default 50, at most 1000
	// AfterID, when > 0, returns rows with a smaller id (the next page);
	// 0 or less returns the first page. Any int64 is valid: ids are BIGINT.
	AfterID int64
	// Reason, when set, keeps rows of that reason only.
	Reason ReviewReason
}

const reviewColumns = `id, biz_key, order_no, reason, payload_hash, raw_body,
created_at, resolved_at, resolution, resolved_by`

// sqlReviews is one statement per state rather than one that tests the
// state in SQL, so that every plan, generic or custom, can take its index:
// open rows through notify_review_open_id_idx, the others through the
// primary key. The page bound is always a bigint ($1::bigint): an untyped
// parameter compared with an integer literal would be typed int4, which
// fails for ids of 2^31 and above.
var sqlReviews = map[ReviewState]string{
	ReviewOpen:     sqlReviewPage(`resolved_at IS NULL AND `),
	ReviewResolved: sqlReviewPage(`resolved_at IS NOT NULL AND `),
	ReviewAll:      sqlReviewPage(``),
}

func sqlReviewPage(filter string) string {
	return `SELECT ` + reviewColumns + ` FROM notify_review
WHERE ` + filter + `id < $1::bigint AND ($3::text = '' OR reason = $3::text)
ORDER BY id DESC LIMIT $2::bigint`
}

// Reviews returns a page of the review queue, newest first. It reads on the
// operator pool, under the operator timeouts.
func (s *Store) Reviews(ctx context.Context, q ReviewQuery) ([]Review, error) {
	if q.State == "" {
		q.State = ReviewOpen
	}
	sql, ok := sqlReviews[q.State]
	if !ok {
		return nil, fmt.Errorf("%w: review state %q", ErrInvalid, q.State)
	}
	if q.Limit <= 0 {
		q.Limit = 50
	}
	q.Limit = min(q.Limit, 1000)
	before := q.AfterID
	if before <= 0 {
		before = math.MaxInt64 // the first page: every id is smaller
	}
	if q.Reason != "" && !slices.Contains(ReviewReasons, q.Reason) {
		return nil, fmt.Errorf("%w: review reason %q", ErrInvalid, q.Reason)
	}
	rows, err := s.ops.Query(ctx, sql, before, int64(q.Limit), string(q.Reason))
	if err != nil {
		return nil, wrap(ctx, "list reviews", err)
	}
	out, err := pgx.CollectRows(rows, scanReview)
	if err != nil {
		return nil, wrap(ctx, "list reviews", err)
	}
	return out, nil
}

const sqlResolve = `WITH upd AS (
    UPDATE notify_review SET resolved_at = now(), resolution = $2, resolved_by = $3
     WHERE id = $1 AND resolved_at IS NULL
    RETURNING ` + reviewColumns + `)
SELECT true, * FROM upd
UNION ALL
SELECT false, ` + reviewColumns + ` FROM notify_review
 WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM upd)`

// ResolveReview closes an open review row with an operator's resolution. A
// problem that recurs afterwards opens a new row. It runs on the operator
// pool, under the operator timeouts.
func (s *Store) ResolveReview(ctx context.Context, id int64, resolution, by string) (Review, error) {
	var r Review
	var updated bool
	err := s.commit(ctx, s.ops, func(ctx context.Context, conn *pgxpool.Conn) error {
		return conn.QueryRow(ctx, sqlResolve, id, resolution, by).Scan(&updated,
			&r.ID, &r.BizKey, &r.OrderNo, &r.Reason, &r.PayloadHash, &r.RawBody,
			&r.CreatedAt, &r.ResolvedAt, &r.Resolution, &r.ResolvedBy)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Review{}, fmt.Errorf("resolve review %d: %w", id, ErrReviewNotFound)
	case err != nil:
		return Review{}, wrap(ctx, fmt.Sprintf("resolve review %d", id), err)
	case !updated:
		return r, fmt.Errorf("resolve review %d: %w", id, ErrReviewResolved)
	}
	return r, nil
}

// OpenReviews counts the open review rows by reason (every reason present,
// zero included), for the notifyedge_review_open gauge. It reads on the
// operator pool.
func (s *Store) OpenReviews(ctx context.Context) (map[ReviewReason]int64, error) {
	rows, err := s.ops.Query(ctx, `SELECT reason, count(*) FROM notify_review WHERE resolved_at IS NULL GROUP BY reason`)
	if err != nil {
		return nil, wrap(ctx, "count open reviews", err)
	}
	out := make(map[ReviewReason]int64, len(ReviewReasons))
	for _, r := range ReviewReasons {
		out[r] = 0
	}
	var reason string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&reason, &n}, func() error {
		out[ReviewReason(reason)] = n
		return nil
	})
	if err != nil {
		return nil, wrap(ctx, "count open reviews", err)
	}
	return out, nil
}

func scanReview(row pgx.CollectableRow) (Review, error) {
	var r Review
	err := row.Scan(&r.ID, &r.BizKey, &r.OrderNo, &r.Reason, &r.PayloadHash, &r.RawBody,
		&r.CreatedAt, &r.ResolvedAt, &r.Resolution, &r.ResolvedBy)
	return r, err
}

const sqlRecordReview = `SELECT notifyedge_review($1, $2, $3, $4, $5)`

// RecordReview opens a review row for a delivery the edge refused before
// Process (a merchant or app id that is not the channel's), unless the same
// problem is already open. No claim is made: once an operator fixes the
// cause, the channel's retry is decided afresh.
func (s *Store) RecordReview(ctx context.Context, n Notification, reason ReviewReason) error {
	return s.recordReviewOn(ctx, s.pool, n, reason)
}

// RecordReviewOps is RecordReview on the operator pool: for deliveries
// that did not come as callbacks (reconciliation's answers), which never
// take the callbacks' connections.
func (s *Store) RecordReviewOps(ctx context.Context, n Notification, reason ReviewReason) error {
	return s.recordReviewOn(ctx, s.ops, n, reason)
}

func (s *Store) recordReviewOn(ctx context.Context, pool *pgxpool.Pool, n Notification, reason ReviewReason) error {
	if err := n.validate(); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, sqlRecordReview, n.BizKey, n.OrderNo, string(reason), n.Digest, textSafe(n.RawBody)); err != nil {
		return wrap(ctx, "record review "+n.BizKey, err)
	}
	return nil
}
