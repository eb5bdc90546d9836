-- Retention (durable/retention.go) deletes, oldest first, the rows older
-- than their retention, and the gauge notifyedge_oldest_row_age_seconds
-- reads the oldest of each: both walk an index from its low end, so their
-- cost follows the rows they delete, not the table's size.
--
--   notify_claim   created_at: its index is 0001's.
--   outbox         published_at: walked in id order instead (the primary
--                  key): the relay publishes in id order, so published_at
--                  grows with id. An index here would be built under a lock
--                  that stops every first delivery (each writes an outbox
--                  row) for the whole build, on a table that holds every
--                  event since the first deploy until retention first runs.
--   consumer_inbox processed_at: below. Only consumers write the table.
--   notify_review  resolved_at (resolved rows only): below. Open rows are
--                  inserted with resolved_at NULL, outside the index.
--
-- Neither index costs a first delivery anything. Both are built in the
-- migration's transaction, like 0004's on notify_review: meanwhile a
-- consumer's inbox insert, and a callback that opens a review row, wait.
-- Not CONCURRENTLY: that waits for every older snapshot, among them those
-- of the statements waiting in pg_advisory_lock (the other nodes'
-- migrators: a deadlock; their standby relays: for ever). On a large
-- table, build them by hand first with CREATE INDEX CONCURRENTLY (same
-- name and definition, and check the index is valid); IF NOT EXISTS then
-- makes this a no-op.
CREATE INDEX IF NOT EXISTS consumer_inbox_processed_at_idx ON consumer_inbox (processed_at);
CREATE INDEX IF NOT EXISTS notify_review_resolved_at_idx ON notify_review (resolved_at)
    WHERE resolved_at IS NOT NULL;

---- create above / drop below ----

DROP INDEX IF EXISTS notify_review_resolved_at_idx;
DROP INDEX IF EXISTS consumer_inbox_processed_at_idx;
