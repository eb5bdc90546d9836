-- notifyedge_ship ships an order for consumer p_consumer in one
-- transaction: the inbox row for p_outbox_id (none when NULL: an internal
-- path), the conditional PAID -> SHIPPED (notifyedge_transition) with its
-- outbox row, and the shipment record only if the order moved. A
-- redelivered message finds its inbox row and ships nothing.
-- o_result is 'duplicate', 'shipped' or 'not_shipped', with o_status the
-- order's state ('' for an unknown order).
CREATE OR REPLACE FUNCTION notifyedge_ship(
    p_consumer text, p_outbox_id bigint, p_order_no text,
    r_from text[], r_act text[], r_to text[], r_topic text[],
    OUT o_result text, OUT o_status text)
LANGUAGE plpgsql AS $$
DECLARE
    v_applied boolean;
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
    SELECT t.o_applied, t.o_status INTO v_applied, o_status
      FROM notifyedge_transition(p_order_no, 'SHIP', r_from, r_act, r_to, r_topic) t;
    o_status := coalesce(o_status, '');
    IF v_applied THEN
        INSERT INTO shipment (order_no, outbox_id, source) VALUES (p_order_no, p_outbox_id, p_consumer);
        o_result := 'shipped';
    ELSE
        o_result := 'not_shipped';
    END IF;
END $$;
