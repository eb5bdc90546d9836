-- Group commit: concurrent first deliveries decided together, in one
-- transaction and one round trip (durable/group.go sends the batch).
--
-- This migration created notifyedge_process_batch and gave
-- notifyedge_process the key's advisory lock; both are code now
-- (durable/sql), installed after the migrations. It changed no schema:
-- tern runs no migration without a statement, so a no-op stays.
SELECT 1;

---- create above / drop below ----

DROP FUNCTION IF EXISTS notifyedge_process_batch(text[], text[], text[], text[], text[], bigint[], text[], text[], text[],
    bigint[], boolean[], text, text[], int[], int[], text[], text[], text[], text[], text[], text[], text[], boolean[]);
