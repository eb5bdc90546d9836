-- notifyedge_transition moves an order for an internal path (SHIP, CLOSE, a
-- compensation job): the same conditional transition and outbox row, no
-- claim, no trade (durable refuses internal events whose cells move money,
-- so each state's first cell decides). o_found is false for an unknown
-- order; o_applied false when the event does not move the order from its
-- state, with o_status its current state.
CREATE OR REPLACE FUNCTION notifyedge_transition(
    p_order_no text, p_event text, r_from text[], r_act text[], r_to text[], r_topic text[],
    OUT o_found boolean, OUT o_applied boolean, OUT o_from text, OUT o_status text)
LANGUAGE plpgsql AS $$
DECLARE
    v_paid_by  text;
    v_refunded bigint;
    v_i        int;
BEGIN
    o_applied := false;
    FOR v_try IN 1..9 LOOP
        SELECT o.status, o.paid_by, o.refunded_amount INTO o_from, v_paid_by, v_refunded
          FROM biz_order o WHERE o.order_no = p_order_no;
        o_found := FOUND;
        o_status := o_from;
        IF NOT o_found THEN
            RETURN;
        END IF;
        v_i := array_position(r_from, o_from);
        IF r_act[v_i] NOT IN ('move', 'pay') THEN
            RETURN;
        END IF;
        IF notifyedge_move(p_order_no, p_event, NULL, NULL, NULL, o_from, r_to[v_i], r_topic[v_i],
                           v_paid_by, NULL, v_refunded, v_refunded, '') THEN
            o_applied := true;
            o_status := r_to[v_i];
            RETURN;
        END IF;
        -- Moved under us: decide again on its new state.
    END LOOP;
    RAISE EXCEPTION 'order % keeps changing', p_order_no USING ERRCODE = 'serialization_failure';
END $$;
