-- Trades and refunds: money moves only against the trade it belongs to.
--
-- A trade is one payment at a channel, "{channel}:{channel_txn_id}". The
-- order records the trade that paid it (paid_by) and how much of it was
-- refunded (refunded_amount); every applied refund is a row of trade_refund,
-- and a refund is applied only by inserting its row, so a refund delivered
-- again after retention deleted its claim can never be applied twice.
--
-- This migration runs outside a transaction (the tern directive below),
-- one statement at a time, each written to be run again after a crash
-- part way (IF NOT EXISTS, backfills that pick only the rows they have
-- not done): inside one transaction, the ACCESS EXCLUSIVE lock of the
-- ALTER TABLE would be held on biz_order until the backfills had scanned
-- the claims and the orders, stopping every callback for as long; here it
-- lasts the instant the catalog change takes, and the backfills lock only
-- the rows they write.
--
-- The functions of 0002 and 0003 stayed: nodes of the previous build
-- called them (by their own signatures) until a rolling deploy had
-- replaced them. Orders they paid got no paid_by, which the "Upgrading"
-- rule covers (a paid order without paid_by takes the first trade a
-- refund or close names). 0010 drops them.
---- tern: disable-tx ----

-- Both columns are metadata only (PG >= 11: no rewrite of a big table); the
-- CHECK is NOT VALID so adding it scans nothing: it holds for every row
-- written from now on, and the existing rows pass it (0, or the amount for
-- REFUNDED once the backfill below ran).
ALTER TABLE biz_order
    ADD COLUMN IF NOT EXISTS paid_by VARCHAR(100),
    ADD COLUMN IF NOT EXISTS refunded_amount BIGINT NOT NULL DEFAULT 0,
    DROP CONSTRAINT IF EXISTS biz_order_refunded_amount_check,
    ADD CONSTRAINT biz_order_refunded_amount_check
        CHECK (refunded_amount >= 0 AND refunded_amount <= amount) NOT VALID;

-- One row per trade and refund id ('' for a refund without one), never
-- deleted by retention: the durable memory of what was refunded.
CREATE TABLE IF NOT EXISTS trade_refund (
    trade      VARCHAR(100) NOT NULL,
    refund_id  VARCHAR(64)  NOT NULL,
    order_no   VARCHAR(64)  NOT NULL,
    amount     BIGINT       NOT NULL CHECK (amount >= 0),
    created_at TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (trade, refund_id)
);
-- The orders API lists an order's refunds.
CREATE INDEX IF NOT EXISTS trade_refund_order_no_idx ON trade_refund (order_no);

-- The open review rows that close themselves (an UNKNOWN_ORDER or
-- AMOUNT_MISMATCH row once its key is applied, a DUPLICATE_PAYMENT or
-- PAID_AFTER_CLOSE row once its trade is refunded), by key: every first
-- delivery probes it, so it must be the index the probe takes whatever the
-- statistics say when a connection plans it; its predicate, the narrowest
-- that matches, makes it so. notify_review is small: a plain CREATE INDEX.
CREATE INDEX IF NOT EXISTS notify_review_open_key_idx ON notify_review (biz_key)
    WHERE resolved_at IS NULL
      AND reason IN ('UNKNOWN_ORDER', 'AMOUNT_MISMATCH', 'DUPLICATE_PAYMENT', 'PAID_AFTER_CLOSE');

-- The functions over these columns and tables (notifyedge_move and the
-- new signatures of notifyedge_process, notifyedge_transition and
-- notifyedge_ship) are code (durable/sql), installed after the migrations.

-- Upgrading: orders paid before this migration learn their payer from the
-- applied PAY_SUCCESS claim still within retention (biz_key
-- "{channel}:{txn}:PAY_SUCCESS" names trade "{channel}:{txn}"; the latest
-- applied one, should an operator have reopened an order). Orders whose
-- claim is gone keep paid_by NULL and take the first trade a refund or
-- close names.
UPDATE biz_order o
   SET paid_by = c.trade
  FROM (SELECT DISTINCT ON (order_no) order_no,
               left(biz_key, length(biz_key) - length(':PAY_SUCCESS')) AS trade
          FROM notify_claim
         WHERE right(biz_key, length(':PAY_SUCCESS')) = ':PAY_SUCCESS'
           AND strpos(result_json, '"outcome":"applied"') > 0
         ORDER BY order_no, id DESC) c
 WHERE o.order_no = c.order_no
   AND o.paid_by IS NULL
   AND o.status IN ('PAID', 'SHIPPED', 'REFUNDED');

-- Before this migration only full refunds existed: a REFUNDED order was
-- refunded in full. Its payer's rows must sum to refunded_amount, so a
-- known payer gets the refund as one without an id (as TRADE_CLOSED
-- records it); an unknown one gets it when adopted.
WITH r AS (
    UPDATE biz_order SET refunded_amount = amount
     WHERE status = 'REFUNDED' AND refunded_amount = 0
    RETURNING order_no, paid_by, amount)
INSERT INTO trade_refund (trade, refund_id, order_no, amount)
SELECT paid_by, '', order_no, amount FROM r WHERE paid_by IS NOT NULL
ON CONFLICT (trade, refund_id) DO NOTHING;

---- create above / drop below ----

DROP FUNCTION IF EXISTS notifyedge_ship(text, bigint, text, text[], text[], text[], text[]);
DROP FUNCTION IF EXISTS notifyedge_transition(text, text, text[], text[], text[], text[]);
DROP FUNCTION IF EXISTS notifyedge_process(text, text, text, text, text, text, bigint, text,
    text, text, bigint, boolean, text[], text[], text[], text[], text[], text[], text, boolean);
DROP FUNCTION IF EXISTS notifyedge_move(text, text, text, bigint, text, text, text, text, text, text, bigint, bigint, text);
DROP TABLE trade_refund;
DROP INDEX notify_review_open_key_idx;
ALTER TABLE biz_order DROP CONSTRAINT biz_order_refunded_amount_check,
    DROP COLUMN refunded_amount, DROP COLUMN paid_by;
