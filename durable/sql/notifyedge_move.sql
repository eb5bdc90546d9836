-- notifyedge_move is the one conditional transition: every writer of
-- biz_order.status goes through it. It is judged by rows affected: 0 rows
-- means the order is no longer as the caller read it (state, payer,
-- refunded amount, or amount/currency), and nothing is written; the caller
-- decides again on what it is now (the UPDATE waits for a concurrent
-- writer's commit and re-checks its WHERE on the new row version). Guarding
-- refunded_amount is what makes two partial refunds that complete an order
-- on two nodes at once end with one ORDER_REFUNDED: the second is decided
-- again on the first's total.
--
-- p_trade, when not NULL, becomes paid_by (a payment, or a refund or close
-- that adopts it); a payment also records when (paid_at: the ledger's day
-- for the daily bill). p_new_refunded > p_refunded makes the move a refund of
-- the payer: its trade_refund row is inserted (a plain INSERT: a duplicate
-- would abort the transaction rather than refund twice), and the outbox
-- payload carries the refund. Every payload carries the order's facts as
-- the move left them (notifyedge_event_facts).
CREATE OR REPLACE FUNCTION notifyedge_move(
    p_order_no text, p_event text, p_biz_key text, p_amount bigint, p_currency text,
    p_from text, p_to text, p_topic text, p_paid_by text, p_trade text,
    p_refunded bigint, p_new_refunded bigint, p_refund_id text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_trade    text := coalesce(p_trade, p_paid_by);
    v_facts    jsonb;
BEGIN
    UPDATE biz_order
       SET status = p_to, paid_by = v_trade, refunded_amount = p_new_refunded, updated_at = now(),
           paid_at = CASE WHEN p_from = 'PENDING_PAY' AND p_to = 'PAID' THEN now() ELSE paid_at END
     WHERE order_no = p_order_no
       AND status = p_from
       AND paid_by IS NOT DISTINCT FROM p_paid_by
       AND refunded_amount = p_refunded
       AND (p_amount IS NULL OR (amount = p_amount AND currency = p_currency))
    RETURNING notifyedge_event_facts(amount, currency, channel, paid_by, p_biz_key) INTO v_facts;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_new_refunded = p_refunded THEN
        INSERT INTO outbox (topic, order_no, payload)
        VALUES (p_topic, p_order_no, jsonb_build_object(
            'order_no', p_order_no, 'event_type', p_event,
            'from', p_from, 'to', p_to, 'biz_key', p_biz_key) || v_facts);
        RETURN true;
    END IF;
    INSERT INTO trade_refund (trade, refund_id, order_no, amount)
    VALUES (v_trade, p_refund_id, p_order_no, p_new_refunded - p_refunded);
    INSERT INTO outbox (topic, order_no, payload)
    VALUES (p_topic, p_order_no, jsonb_build_object(
        'order_no', p_order_no, 'event_type', p_event,
        'from', p_from, 'to', p_to, 'biz_key', p_biz_key,
        'trade', v_trade, 'refund_id', nullif(p_refund_id, ''),
        'refund_amount', p_new_refunded - p_refunded, 'refunded_amount', p_new_refunded) || v_facts);
    RETURN true;
END $$;
