-- Daily bills: the channel's statement against the ledger.
--
-- biz_order.paid_at is the day a payment was recorded here (the ledger's
-- side of the comparison). The move that applies a PAY_SUCCESS sets it;
-- orders paid before this migration take the time of their payment's
-- claim where retention has not deleted it yet (NULL otherwise: they are
-- past every bill that could still be compared).
--
-- bill_row holds the rows of the statements compared in the last days:
-- a ledger entry recorded on day D is looked for in the bills of D-1, D
-- and D+1, so the bills of earlier days stay for a week (each run deletes
-- its channel's older ones). bill_run is a day's comparison; bill_item
-- each row or ledger entry that did not match, and what was done about
-- it. Both are kept -bill-retention.
--
-- This migration runs outside a transaction (the tern directive below),
-- one statement at a time, each safe to run again after a crash part way:
-- the paid_at index is built CONCURRENTLY, never blocking the callbacks'
-- writes of biz_order, and the backfill locks only the rows it writes.
---- tern: disable-tx ----

ALTER TABLE biz_order ADD COLUMN IF NOT EXISTS paid_at TIMESTAMPTZ;

UPDATE biz_order o SET paid_at = c.created_at
  FROM notify_claim c
 WHERE o.paid_at IS NULL AND o.paid_by IS NOT NULL
   AND c.biz_key = o.paid_by || ':PAY_SUCCESS' AND c.claim_state = 'DONE';

CREATE INDEX CONCURRENTLY IF NOT EXISTS biz_order_paid_at ON biz_order (paid_at) WHERE paid_at IS NOT NULL;

CREATE INDEX CONCURRENTLY IF NOT EXISTS trade_refund_created_at ON trade_refund (created_at);

CREATE TABLE IF NOT EXISTS bill_row (
    channel     VARCHAR(32)  NOT NULL,
    bill_date   DATE         NOT NULL,
    kind        CHAR(1)      NOT NULL,  -- P payment, R refund
    trade       VARCHAR(64)  NOT NULL,  -- the channel's transaction id
    refund_id   VARCHAR(64)  NOT NULL,  -- '' for a payment
    order_no    VARCHAR(64)  NOT NULL,
    amount      BIGINT       NOT NULL,  -- fen, positive: the trade's total, or the refund's
    trade_total BIGINT       NOT NULL,  -- a refund row's statement of the trade's total, 0 if none
    line        INTEGER      NOT NULL
);
CREATE INDEX IF NOT EXISTS bill_row_trade ON bill_row (channel, trade);
CREATE INDEX IF NOT EXISTS bill_row_day ON bill_row (channel, bill_date);

CREATE TABLE IF NOT EXISTS bill_run (
    channel         VARCHAR(32) NOT NULL,
    bill_date       DATE        NOT NULL,
    state           VARCHAR(16) NOT NULL,  -- ok | missing | error
    message         TEXT,
    fetched_at      TIMESTAMPTZ,
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    bill_payments   INTEGER NOT NULL DEFAULT 0,
    bill_paid       BIGINT  NOT NULL DEFAULT 0,
    bill_refunds    INTEGER NOT NULL DEFAULT 0,
    bill_refunded   BIGINT  NOT NULL DEFAULT 0,
    bill_fees       BIGINT  NOT NULL DEFAULT 0,
    ledger_payments INTEGER NOT NULL DEFAULT 0,
    ledger_paid     BIGINT  NOT NULL DEFAULT 0,
    ledger_refunds  INTEGER NOT NULL DEFAULT 0,
    ledger_refunded BIGINT  NOT NULL DEFAULT 0,
    matched         INTEGER NOT NULL DEFAULT 0,
    channel_only    INTEGER NOT NULL DEFAULT 0,
    ledger_only     INTEGER NOT NULL DEFAULT 0,
    amount_mismatch INTEGER NOT NULL DEFAULT 0,
    pending         INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (channel, bill_date)
);
CREATE INDEX IF NOT EXISTS bill_run_updated ON bill_run (updated_at);

CREATE TABLE IF NOT EXISTS bill_item (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel       VARCHAR(32)  NOT NULL,
    bill_date     DATE         NOT NULL,
    category      VARCHAR(16)  NOT NULL,  -- channel_only | ledger_only | amount_mismatch
    kind          VARCHAR(8)   NOT NULL,  -- payment | refund
    trade         VARCHAR(100) NOT NULL,  -- {channel}:{transaction id}, as paid_by
    refund_id     VARCHAR(64)  NOT NULL DEFAULT '',
    order_no      VARCHAR(64)  NOT NULL DEFAULT '',
    bill_amount   BIGINT,                 -- NULL: not in the bill
    ledger_amount BIGINT,                 -- NULL: not in the ledger
    trade_total   BIGINT,                 -- the trade's total, for a refund's repair
    refunded_through BIGINT,              -- the trade's refunds in the statements up to this one (Alipay's refund_fee)
    refunded      BOOLEAN      NOT NULL DEFAULT false, -- a payment the channel also refunded
    recorded_on   DATE,                   -- a ledger entry's day
    action        VARCHAR(32)  NOT NULL DEFAULT '',   -- '' until acted on
    detail        TEXT         NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS bill_item_run ON bill_item (channel, bill_date, id);
CREATE INDEX IF NOT EXISTS bill_item_trade ON bill_item (trade, refund_id) WHERE category = 'channel_only';

---- create above / drop below ----

DROP TABLE IF EXISTS bill_item;
DROP TABLE IF EXISTS bill_run;
DROP TABLE IF EXISTS bill_row;
DROP INDEX IF EXISTS trade_refund_created_at;
DROP INDEX IF EXISTS biz_order_paid_at;
ALTER TABLE biz_order DROP COLUMN IF EXISTS paid_at;
