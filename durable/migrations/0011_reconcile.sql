-- Reconciliation: orders still PENDING_PAY are asked of the channel, in
-- case every callback of their payment was lost.
--
-- channel: the channel the order system says the order is paid through
-- (PUT /orders takes it); NULL asks every channel that has query
-- credentials. reconcile_at: when the order is next asked (NULL: never
-- asked yet, first due -reconcile-after past updated_at; 'infinity': not
-- asked again, past the horizon or closed at the channel);
-- reconcile_step: queries answered so far (the back-off's position);
-- reconcile_errors: failed queries since the last answer (the retry's
-- doubling).
--
-- Adding columns with constant defaults rewrites nothing. The two partial
-- indexes hold PENDING_PAY orders only: a payment's UPDATE leaves them (no
-- insertion for a row that no longer matches), and the scheduler reads
-- the due ones by an index range, never by a scan of the orders.
ALTER TABLE biz_order
    ADD COLUMN channel          VARCHAR(32),
    ADD COLUMN reconcile_at     TIMESTAMPTZ,
    ADD COLUMN reconcile_step   SMALLINT NOT NULL DEFAULT 0,
    ADD COLUMN reconcile_errors SMALLINT NOT NULL DEFAULT 0;

CREATE INDEX biz_order_reconcile_first ON biz_order (updated_at)
    WHERE status = 'PENDING_PAY' AND reconcile_at IS NULL;
CREATE INDEX biz_order_reconcile_next ON biz_order (reconcile_at)
    WHERE status = 'PENDING_PAY' AND reconcile_at IS NOT NULL;

---- create above / drop below ----

DROP INDEX biz_order_reconcile_next;
DROP INDEX biz_order_reconcile_first;
ALTER TABLE biz_order
    DROP COLUMN reconcile_errors,
    DROP COLUMN reconcile_step,
    DROP COLUMN reconcile_at,
    DROP COLUMN channel;
