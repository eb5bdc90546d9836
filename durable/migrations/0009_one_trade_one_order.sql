-- One trade pays one order.
--
-- biz_order.paid_by is unique among orders (a partial unique index): the
-- schema, not only the functions, refuses a trade recorded as the payer of
-- two orders. Before building it, the upgrade looks for orders that share
-- a payer and, if it finds any, stops and lists them with what to do.
--
-- The functions decide by the same rule (durable/sql, installed after the
-- migrations): a payment whose trade paid another order is a conflict,
-- review PAYLOAD_CONFLICT, no claim stored, and an order without a payer
-- adopts only a trade that paid no other order (notifyedge_process); a
-- batch leaves such a payment to notifyedge_process, so its set UPDATE
-- never meets the index (notifyedge_process_batch).

-- The index, after the check. On a large table build it by hand first,
-- CREATE UNIQUE INDEX CONCURRENTLY biz_order_paid_by_uniq ON biz_order
-- (paid_by) WHERE paid_by IS NOT NULL (same name and definition): a valid
-- one makes the check and the build below no-ops. A concurrent build that
-- failed leaves an invalid index, which IF NOT EXISTS would keep although
-- it holds nothing: the check refuses it.
DO $$
DECLARE
    v_valid  boolean;
    v_trades bigint;
    v_list   text;
BEGIN
    SELECT i.indisvalid INTO v_valid FROM pg_index i
     WHERE i.indexrelid = to_regclass('biz_order_paid_by_uniq');
    IF v_valid THEN
        RETURN;
    ELSIF NOT v_valid THEN
        RAISE EXCEPTION 'index biz_order_paid_by_uniq exists but is not valid (a CREATE INDEX CONCURRENTLY that failed): drop it (DROP INDEX CONCURRENTLY biz_order_paid_by_uniq), then restart';
    END IF;
    -- The lock CREATE INDEX takes, taken before the check: no payment can
    -- add a duplicate between the check and the build.
    LOCK TABLE biz_order IN SHARE MODE;
    SELECT count(*),
           string_agg(format('%s paid %s', d.paid_by, d.orders), '; ' ORDER BY d.paid_by) FILTER (WHERE d.n <= 20)
      INTO v_trades, v_list
      FROM (SELECT paid_by, row_number() OVER (ORDER BY paid_by) AS n,
                   array_to_string((array_agg(order_no ORDER BY order_no))[1:5], ', ')
                   || CASE WHEN count(*) > 5 THEN format(' and %s more', count(*) - 5) ELSE '' END AS orders
              FROM biz_order WHERE paid_by IS NOT NULL
             GROUP BY paid_by HAVING count(*) > 1) d;
    IF v_trades > 0 THEN
        RAISE EXCEPTION 'one trade pays one order, but % trade(s) are the payer (biz_order.paid_by) of several orders%: %. '
            'For each trade, decide which order it paid (the channel''s bill; GET /orders/{order_no} shows each order''s claims and events); '
            'set paid_by of every other order to NULL (a paid order without a payer takes the first trade a refund or close names) '
            'or to the trade that did pay it; then restart: the upgrade checks again and adds the unique index on biz_order.paid_by',
            v_trades, CASE WHEN v_trades > 20 THEN ' (the first 20)' ELSE '' END, v_list;
    END IF;
END $$;

CREATE UNIQUE INDEX IF NOT EXISTS biz_order_paid_by_uniq ON biz_order (paid_by) WHERE paid_by IS NOT NULL;

---- create above / drop below ----

-- The functions do not depend on the index: it only backs them up.
DROP INDEX IF EXISTS biz_order_paid_by_uniq;
