-- The contract's tables. Names and columns are fixed by the contract; the
-- indexes are the ones the queries of this package need.

CREATE TABLE notify_claim (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    biz_key      VARCHAR(160) NOT NULL UNIQUE,
    order_no     VARCHAR(64)  NOT NULL,
    payload_hash CHAR(64)     NOT NULL,
    claim_state  VARCHAR(16)  NOT NULL CHECK (claim_state IN ('PENDING', 'DONE')),
    result_json  TEXT,
    created_at   TIMESTAMPTZ  NOT NULL DEFAULT now()
);
-- Retention deletes old claims by age.
CREATE INDEX notify_claim_created_at_idx ON notify_claim (created_at);

CREATE TABLE biz_order (
    order_no   VARCHAR(64) PRIMARY KEY,
    status     VARCHAR(16) NOT NULL
               CHECK (status IN ('PENDING_PAY', 'PAID', 'SHIPPED', 'CLOSED', 'REFUNDED')),
    amount     BIGINT      NOT NULL CHECK (amount > 0),
    currency   CHAR(3)     NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE outbox (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic        VARCHAR(32) NOT NULL,
    order_no     VARCHAR(64) NOT NULL,
    payload      JSONB       NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at TIMESTAMPTZ
);
-- The relay reads unpublished rows in id order; published rows are the bulk.
CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;
CREATE INDEX outbox_order_no_idx ON outbox (order_no);

CREATE TABLE notify_review (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    biz_key      VARCHAR(160) NOT NULL,
    order_no     VARCHAR(64)  NOT NULL,
    reason       VARCHAR(32)  NOT NULL,
    payload_hash CHAR(64)     NOT NULL,
    raw_body     TEXT         NOT NULL,
    created_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    resolved_at  TIMESTAMPTZ,
    resolution   TEXT,
    resolved_by  TEXT
);
-- One OPEN row per (biz_key, payload_hash, reason): a problem that recurs
-- after resolution opens a new row.
CREATE UNIQUE INDEX notify_review_open_uniq
    ON notify_review (biz_key, payload_hash, reason) WHERE resolved_at IS NULL;
-- The review queue lists open rows newest first.
CREATE INDEX notify_review_open_id_idx ON notify_review (id) WHERE resolved_at IS NULL;

---- create above / drop below ----

DROP TABLE notify_review;
DROP TABLE outbox;
DROP TABLE biz_order;
DROP TABLE notify_claim;
