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

-- notifyedge_ship ships an order for consumer p_consumer in one transaction:
-- the inbox row for p_outbox_id (none when NULL: an internal path), the
-- conditional PAID -> SHIPPED transition with its outbox row, and the
-- shipment record. o_result is 'duplicate' (this outbox id was processed),
-- 'shipped', or 'not_shipped' (the order was not PAID: stale or already
-- shipped), with o_status the order's state ('' for an unknown order).
CREATE FUNCTION notifyedge_ship(
    p_consumer text, p_outbox_id bigint, p_order_no text,
    p_state_list text, p_to_list text, p_topic_list text,
    OUT o_result text, OUT o_status text)
LANGUAGE plpgsql AS $$
DECLARE
    v_found   boolean;
    v_applied boolean;
    v_from    text;
BEGIN
    o_status := '';
    IF p_outbox_id IS NOT NULL THEN
        INSERT INTO consumer_inbox (consumer, outbox_id) VALUES (p_consumer, p_outbox_id)
        ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            o_result := 'duplicate';
            RETURN;
        END IF;
    END IF;
    SELECT t.o_found, t.o_applied, t.o_from, t.o_status INTO v_found, v_applied, v_from, o_status
      FROM notifyedge_transition(p_order_no, 'SHIP', p_state_list, p_to_list, p_topic_list) t;
    o_status := coalesce(o_status, '');
    IF v_applied THEN
        INSERT INTO shipment (order_no, outbox_id, source) VALUES (p_order_no, p_outbox_id, p_consumer);
        o_result := 'shipped';
    ELSE
        o_result := 'not_shipped';
    END IF;
END $$;

---- create above / drop below ----

DROP FUNCTION notifyedge_ship;
DROP TABLE shipment;
DROP TABLE consumer_inbox;
