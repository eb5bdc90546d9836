-- Trace context: the W3C traceparent of the callback that applied a
-- delivery, for the relay to carry with its outbox row's event, so that
-- the relay's, the forwarder's and the shipper's spans join the callback's
-- trace and the forwarded webhook carries it. Only sampled callbacks
-- write a row (one in a hundred at 1 % sampling); the decision's own
-- statement writes it, in the decision's transaction, so a row's event is
-- never published before its trace context is there.
--
-- A table of its own, not a column of the outbox: the outbox rows are
-- written by the decision functions, set-based for a whole batch, and a
-- side table keyed by biz_key (which every callback's outbox payload
-- names) leaves those functions and their cost untouched. Retention
-- deletes its rows with the published outbox rows (created_at, the outbox
-- retention).
CREATE TABLE notify_trace (
    biz_key     VARCHAR(160) PRIMARY KEY,
    traceparent VARCHAR(55) NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX notify_trace_created_at_idx ON notify_trace (created_at);

---- create above / drop below ----

DROP TABLE IF EXISTS notify_trace;
