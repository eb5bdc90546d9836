-- This migration created the first server-side functions of the decision
-- (notifyedge_apply, notifyedge_review, notifyedge_process,
-- notifyedge_transition), so that a first delivery is one round trip. The
-- functions are code now (durable/sql), installed after the migrations;
-- 0010 drops the overloads this migration once created on the databases
-- that ran it. tern runs no migration without a statement: a no-op stays.
SELECT 1;

---- create above / drop below ----

DROP FUNCTION IF EXISTS notifyedge_transition(text, text, text, text, text);
DROP FUNCTION IF EXISTS notifyedge_process(text, text, text, text, text, text, bigint, text,
    text, text, text, text, text);
DROP FUNCTION IF EXISTS notifyedge_review(text, text, text, text, text);
DROP FUNCTION IF EXISTS notifyedge_apply(text, text, text, text, text, text, bigint, text);
