-- The reference downstream consumer's tables (cmd/shipper). A team copying
-- it keeps the pattern: an inbox keyed by the outbox id makes a redelivered
-- message a no-op, and the conditional SHIP transition makes a stale one a
-- no-op, in one transaction with the effect.

-- consumer_inbox: one row per (consumer, outbox id) processed.
CREATE TABLE consumer_inbox (
    consumer     VARCHAR(64) NOT NULL,
    outbox_id    BIGINT      NOT NULL,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, outbox_id)
);

-- shipment: every shipping effect, deliberately without a unique constraint
-- on order_no, so that "shipped twice" is counted, not prevented by
-- construction.
CREATE TABLE shipment (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_no   VARCHAR(64) NOT NULL,
    outbox_id  BIGINT,
    source     VARCHAR(64) NOT NULL,
    shipped_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX shipment_order_no_idx ON shipment (order_no);

-- The shipping effect over these tables is notifyedge_ship (durable/sql).

---- create above / drop below ----

DROP FUNCTION IF EXISTS notifyedge_ship(text, bigint, text, text, text, text);
DROP TABLE shipment;
DROP TABLE consumer_inbox;
