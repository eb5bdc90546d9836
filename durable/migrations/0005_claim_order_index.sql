-- The orders API answers "what happened to this order?" with its claims,
-- found by order_no. The index costs every first delivery one more index
-- entry. It is built in the migration's transaction, which blocks writes
-- to notify_claim while it builds: on a large claim table, build it by hand
-- first with CREATE INDEX CONCURRENTLY (same name); IF NOT EXISTS then
-- makes this a no-op. (CONCURRENTLY cannot run here: it waits for every
-- other transaction, among them the other nodes' migrators waiting for
-- this one's lock, a deadlock.)
CREATE INDEX IF NOT EXISTS notify_claim_order_no_idx ON notify_claim (order_no);

---- create above / drop below ----

DROP INDEX IF EXISTS notify_claim_order_no_idx;
