package durable

import (
	"context"
	"time"
)

// OutboxBacklog returns how many outbox rows wait for the broker and the age
// of the oldest (0 when none).
func (s *Store) OutboxBacklog(ctx context.Context) (pending int64, oldest time.Duration, err error) {
	var secs float64
	err = s.pool.QueryRow(ctx, `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
		FROM outbox WHERE published_at IS NULL`).Scan(&pending, &secs)
	if err != nil {
		return 0, 0, wrap(ctx, "outbox backlog", err)
	}
	return pending, time.Duration(secs * float64(time.Second)), nil
}
