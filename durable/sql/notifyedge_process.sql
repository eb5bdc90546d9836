-- notifyedge_process decides one callback delivery, in this order: an
-- existing claim (replay or conflict) or, for a payment, its trade having
-- paid another order (conflict), the order (unknown_order,
-- amount_mismatch), premature, the trade (another trade's refund or close
-- is skipped; the paying trade's refund is refund_exceeds or applied), then
-- the event against the state (skipped, applied).
--
-- The rules are the event's row of durable's state machine (state.go), as
-- parallel arrays: cell i says what the event does to an order in state
-- r_from[i] for the trade party r_party[i] ('' any trade, 'paying' the
-- order's payer, 'other' another trade; a state whose cells depend on the
-- trade has its 'paying' cell first; notifyedge_cell finds the cell).
-- r_act[i] is the action (move, pay, settle, refund, itemise, record, skip,
-- premature), r_to[i] and r_topic[i] the move's target and topic,
-- r_review[i] the review of a skip. r_partial_topic is the topic of a
-- partial refund; r_adopt says whether a paid order without paid_by takes
-- the trade this event names (only a trade that paid no other order: one
-- trade pays one order).
--
-- The claim is inserted before any effect, already DONE with the result the
-- order predicts (notifyedge_result writes it); the conditional UPDATE then
-- confirms it by rows affected. A concurrent delivery of the same key waits
-- for the key's advisory lock until the winner ends, then replays its
-- result (or, had the winner rolled back, inserts and proceeds). If another
-- writer changed the order between our read and our UPDATE, we decide
-- again (at most 8 times more) on what it left, rewriting the claim's
-- result in the same transaction.
--
-- Locks are taken in one order, claim key (its advisory lock) before order
-- row (Transition takes the order row only, and trade_refund rows are
-- written after the order row is locked or, for a skip, under the claim
-- key alone): no deadlock. A batch (notifyedge_process_batch) calls this
-- function for its members that are not plain, holding their locks.
--
-- p_claim_hash is the payload_hash of the key's claim as the caller's
-- statement just read it (NULL: no claim), so the function does not probe
-- again. Were it wrong, the unique index would still catch the duplicate.
--
-- o_outcome is one of applied, skipped, replayed, conflict, premature,
-- amount_mismatch, unknown_order, refund_exceeds. o_result is the
-- canonical result_json of a DONE claim (applied, skipped, replayed).
CREATE OR REPLACE FUNCTION notifyedge_process(
    p_biz_key text, p_order_no text, p_hash text, p_raw_body text, p_claim_hash text,
    p_event text, p_amount bigint, p_currency text,
    p_trade text, p_refund_id text, p_refund_amount bigint, p_cumulative boolean,
    r_from text[], r_party text[], r_act text[], r_to text[], r_topic text[], r_review text[],
    r_partial_topic text, r_adopt boolean,
    OUT o_outcome text, OUT o_status text, OUT o_result text, OUT o_review text)
LANGUAGE plpgsql AS $$
DECLARE
    v_hash     text := p_claim_hash;
    v_status   text;
    v_amount   bigint;
    v_currency text;
    v_paid_by  text;
    v_refunded bigint;
    v_review   boolean; -- the key has an open row an applied delivery resolves
    v_claim    bigint;
    v_i        int;
    v_act      text;
    v_to       text;
    v_topic    text;
    v_new      bigint; -- refunded_amount once this delivery is applied
    v_sum      bigint;
    v_tries    int := 0;
BEGIN
    IF v_hash IS NULL THEN
        -- The key's lock, before anything is read: a batch tries it and
        -- never waits (see notifyedge_process_batch); here we wait, as the
        -- unique index would make us wait anyway. In a batch the lock is
        -- held already, and taking it again costs a local lookup.
        PERFORM pg_advisory_xact_lock(hashtextextended(p_biz_key, 0));
        -- One trade pays one order: a payment whose trade paid another
        -- order is answered as its key's claim answered it while retention
        -- kept it, a conflict, and stores nothing. (The paid order's own
        -- late duplicate is not this: the state machine skips it.)
        IF 'pay' = ANY (r_act) AND EXISTS (SELECT 1 FROM biz_order o
                                            WHERE o.paid_by = p_trade AND o.order_no <> p_order_no) THEN
            PERFORM notifyedge_review(p_biz_key, p_order_no, 'PAYLOAD_CONFLICT', p_hash, p_raw_body);
            o_outcome := 'conflict';
            o_review := 'PAYLOAD_CONFLICT';
            RETURN;
        END IF;
        LOOP
            -- The order, and whether the key has an open UNKNOWN_ORDER or
            -- AMOUNT_MISMATCH row: probed here, in a statement the delivery
            -- runs anyway, rather than in the caller's, where even a replay
            -- would pay for setting the probe up.
            SELECT o.status, o.amount, o.currency, o.paid_by, o.refunded_amount,
                   EXISTS (SELECT 1 FROM notify_review r
                            WHERE r.biz_key = p_biz_key AND r.resolved_at IS NULL
                              AND r.reason IN ('UNKNOWN_ORDER', 'AMOUNT_MISMATCH'))
              INTO v_status, v_amount, v_currency, v_paid_by, v_refunded, v_review
              FROM biz_order o WHERE o.order_no = p_order_no;
            IF NOT FOUND OR v_amount <> p_amount OR v_currency <> p_currency THEN
                IF v_claim IS NOT NULL THEN
                    -- Rewritten or deleted under us after we claimed: store
                    -- nothing; the channel's retry is decided afresh.
                    RAISE EXCEPTION 'order % changed during delivery %', p_order_no, p_biz_key
                        USING ERRCODE = 'serialization_failure';
                END IF;
                IF NOT FOUND THEN
                    PERFORM notifyedge_review(p_biz_key, p_order_no, 'UNKNOWN_ORDER', p_hash, p_raw_body);
                    o_outcome := 'unknown_order';
                    o_review := 'UNKNOWN_ORDER';
                    RETURN;
                END IF;
                PERFORM notifyedge_review(p_biz_key, p_order_no, 'AMOUNT_MISMATCH', p_hash, p_raw_body);
                o_status := v_status;
                o_outcome := 'amount_mismatch';
                o_review := 'AMOUNT_MISMATCH';
                RETURN;
            END IF;
            IF v_tries > 8 THEN
                RAISE EXCEPTION 'order % keeps changing during delivery %', p_order_no, p_biz_key
                    USING ERRCODE = 'serialization_failure';
            END IF;
            o_status := v_status;

            -- The cell: the state's, then, where the trade decides, the
            -- paying or the other trade's; an order without a payer adopts
            -- the trade when the event adopts. But only a trade that paid
            -- no other order: one trade pays one order. (The probe, a
            -- statement of its own, runs only where adopting is at stake:
            -- the lookup itself is a simple expression, planned once.)
            v_i := notifyedge_cell(r_from, r_party, v_status, 1, coalesce(v_paid_by = p_trade, r_adopt));
            IF r_party[v_i] = 'paying' AND v_paid_by IS NULL THEN
                IF EXISTS (SELECT 1 FROM biz_order o WHERE o.paid_by = p_trade) THEN
                    v_i := notifyedge_cell(r_from, r_party, v_status, 1, false);
                END IF;
            END IF;
            v_act := r_act[v_i];
            IF v_act = 'premature' THEN
                IF v_claim IS NOT NULL THEN
                    RAISE EXCEPTION 'order % changed during delivery %', p_order_no, p_biz_key
                        USING ERRCODE = 'serialization_failure';
                END IF;
                o_outcome := 'premature';
                RETURN;
            END IF;

            -- The trade's money, decided before any claim. (The refund
            -- branches nest their lookups, so a payment's hot path evaluates
            -- only simple expressions here.)
            v_to := NULL;
            v_topic := NULL;
            v_new := v_refunded;
            IF v_act IN ('move', 'pay') THEN
                v_to := r_to[v_i];
                v_topic := r_topic[v_i];
            ELSIF v_act = 'settle' THEN
                v_new := v_amount;
                v_to := r_to[v_i];
                v_topic := r_topic[v_i];
            ELSIF v_act IN ('refund', 'itemise', 'record') THEN
                IF EXISTS (SELECT 1 FROM trade_refund t WHERE t.trade = p_trade AND t.refund_id = p_refund_id) THEN
                    v_act := 'skip'; -- recorded already: never twice, and no alarm
                ELSIF v_act <> 'record' AND
                      (CASE WHEN p_cumulative OR v_act = 'itemise' THEN p_refund_amount
                            ELSE v_refunded + p_refund_amount END) > v_amount THEN
                    IF v_claim IS NOT NULL THEN
                        -- Decided again after another refund landed first:
                        -- this one no longer fits, and refund_exceeds stores
                        -- no claim.
                        DELETE FROM notify_claim WHERE id = v_claim;
                    END IF;
                    PERFORM notifyedge_review(p_biz_key, p_order_no, 'REFUND_EXCEEDS', p_hash, p_raw_body);
                    o_outcome := 'refund_exceeds';
                    o_review := 'REFUND_EXCEEDS';
                    o_result := NULL;
                    RETURN;
                ELSIF v_act = 'refund' THEN
                    -- A cumulative notification carries the trade's total.
                    v_new := CASE WHEN p_cumulative THEN greatest(v_refunded, p_refund_amount)
                                  ELSE v_refunded + p_refund_amount END;
                    IF v_new = v_refunded THEN
                        v_act := 'skip'; -- a total that raises nothing
                    ELSIF v_new = v_amount THEN
                        v_to := r_to[v_i];
                        v_topic := r_topic[v_i];
                    ELSE
                        v_to := v_status; -- partial: the state stays
                        v_topic := r_partial_topic;
                    END IF;
                END IF;
            END IF;

            -- Layer 3 decides, layer 2 backstops: predict, claim, confirm.
            o_outcome := CASE WHEN v_to IS NULL THEN 'skipped' ELSE 'applied' END;
            o_status := coalesce(v_to, v_status);
            o_review := NULL;
            o_result := notifyedge_result(o_outcome, o_status);
            IF v_claim IS NULL THEN
                INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json)
                VALUES (p_biz_key, p_order_no, p_hash, 'DONE', o_result)
                ON CONFLICT (biz_key) DO NOTHING
                RETURNING id INTO v_claim;
                EXIT WHEN v_claim IS NULL; -- a concurrent delivery won: replay it below
            ELSE
                UPDATE notify_claim SET result_json = o_result WHERE id = v_claim;
            END IF;

            IF v_to IS NOT NULL THEN
                IF notifyedge_move(p_order_no, p_event, p_biz_key, p_amount, p_currency,
                                   v_status, v_to, v_topic, v_paid_by,
                                   CASE WHEN v_act = 'move' THEN NULL ELSE p_trade END,
                                   v_refunded, v_new, p_refund_id) THEN
                    -- Review rows close themselves when their cause clears:
                    -- this key could not be applied before, and now is. The
                    -- probe above spares the UPDATE on almost every delivery.
                    IF v_review THEN
                        UPDATE notify_review r
                           SET resolved_at = now(), resolved_by = 'notifyedge',
                               resolution = CASE r.reason
                                   WHEN 'UNKNOWN_ORDER' THEN 'the order exists now: the delivery was applied'
                                   ELSE 'the amount and currency match the order now: the delivery was applied' END
                         WHERE r.biz_key = p_biz_key AND r.resolved_at IS NULL
                           AND r.reason IN ('UNKNOWN_ORDER', 'AMOUNT_MISMATCH');
                    END IF;
                    RETURN;
                END IF;
                -- The order changed under us: decide again on what it is now.
                v_tries := v_tries + 1;
                CONTINUE;
            END IF;

            -- Skipped: the order's state stays; what a skip still does.
            IF r_party[v_i] = 'paying' AND v_paid_by IS NULL THEN
                -- An order whose payer was unknown takes the first trade a
                -- refund or close names; what was refunded before we knew
                -- the payer was refunded by it, as one refund without an id.
                UPDATE biz_order SET paid_by = p_trade, updated_at = now()
                 WHERE order_no = p_order_no AND status = v_status
                   AND paid_by IS NULL AND refunded_amount = v_refunded;
                IF NOT FOUND THEN
                    v_tries := v_tries + 1;
                    CONTINUE;
                END IF;
                IF v_refunded > 0 THEN
                    INSERT INTO trade_refund (trade, refund_id, order_no, amount)
                    VALUES (p_trade, '', p_order_no, v_refunded)
                    ON CONFLICT (trade, refund_id) DO NOTHING;
                END IF;
            END IF;
            IF v_act = 'itemise' THEN
                -- A refund of an order refunded in full already (TRADE_CLOSED
                -- first, the refund's own notification after): recorded by
                -- moving its amount out of the part refunded without an id,
                -- where it fits, so the payer's rows still sum to
                -- refunded_amount. A cumulative total has no amount of its own.
                IF p_refund_id <> '' AND NOT p_cumulative THEN
                    UPDATE trade_refund t SET amount = t.amount - p_refund_amount
                     WHERE t.trade = p_trade AND t.refund_id = '' AND t.amount >= p_refund_amount;
                    IF FOUND THEN
                        INSERT INTO trade_refund (trade, refund_id, order_no, amount)
                        VALUES (p_trade, p_refund_id, p_order_no, p_refund_amount);
                    END IF;
                END IF;
            ELSIF v_act = 'record' THEN
                -- Another trade's refund: the order is untouched; the refund
                -- is recorded (a cumulative total by what it adds), so that
                -- trade's refunds are known and never counted twice.
                v_new := p_refund_amount;
                IF p_cumulative THEN
                    v_new := p_refund_amount - (SELECT coalesce(sum(t.amount), 0) FROM trade_refund t WHERE t.trade = p_trade);
                END IF;
                IF v_new > 0 THEN
                    INSERT INTO trade_refund (trade, refund_id, order_no, amount)
                    VALUES (p_trade, p_refund_id, p_order_no, v_new);
                    -- The trade's open DUPLICATE_PAYMENT / PAID_AFTER_CLOSE
                    -- row: review rows carry no trade, but those are rows of
                    -- a PAY_SUCCESS, whose biz_key is "{trade}:PAY_SUCCESS".
                    -- Locked before the refunds are summed: refunds of one
                    -- trade landing together are summed one after the other
                    -- (the sum, a statement of its own, sees the ones that
                    -- committed while we waited), so the one that completes
                    -- the trade knows it.
                    PERFORM 1 FROM notify_review r
                      WHERE r.biz_key = p_trade || ':PAY_SUCCESS' AND r.order_no = p_order_no
                        AND r.resolved_at IS NULL AND r.reason IN ('DUPLICATE_PAYMENT', 'PAID_AFTER_CLOSE')
                        FOR UPDATE;
                    IF FOUND THEN
                        SELECT sum(t.amount) INTO v_sum FROM trade_refund t WHERE t.trade = p_trade;
                        UPDATE notify_review r
                           SET resolved_at = now(), resolved_by = 'notifyedge',
                               resolution = format('trade %s refunded: its recorded refunds (%s) reach the order amount (%s)',
                                                   p_trade, v_sum, v_amount)
                         WHERE r.biz_key = p_trade || ':PAY_SUCCESS' AND r.order_no = p_order_no
                           AND r.resolved_at IS NULL AND r.reason IN ('DUPLICATE_PAYMENT', 'PAID_AFTER_CLOSE')
                           AND v_sum >= v_amount;
                    ELSE
                        o_review := 'REFUND_OTHER_TRADE';
                        PERFORM notifyedge_review(p_biz_key, p_order_no, o_review, p_hash, p_raw_body);
                    END IF;
                END IF;
            ELSE
                o_review := nullif(r_review[v_i], '');
                IF o_review IS NOT NULL THEN
                    PERFORM notifyedge_review(p_biz_key, p_order_no, o_review, p_hash, p_raw_body);
                END IF;
            END IF;
            RETURN;
        END LOOP;

        -- A concurrent delivery of this key committed while we waited.
        o_status := NULL;
        SELECT c.payload_hash, c.result_json INTO STRICT v_hash, o_result
          FROM notify_claim c WHERE c.biz_key = p_biz_key;
    END IF;

    -- Layer 4: a committed claim answers with the first result.
    IF v_hash = p_hash THEN
        o_outcome := 'replayed';
        IF o_result IS NULL THEN
            SELECT c.result_json INTO STRICT o_result FROM notify_claim c WHERE c.biz_key = p_biz_key;
        END IF;
        RETURN;
    END IF;
    -- Same key, different business content: never through, always seen.
    -- Retention keeps a claim an open review names; the claim is locked
    -- while the review opens, so retention skips it rather than delete it
    -- unseen. Deleted already: the key has no claim now, and the retry is
    -- decided afresh.
    PERFORM 1 FROM notify_claim c WHERE c.biz_key = p_biz_key FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'claim % deleted during delivery', p_biz_key
            USING ERRCODE = 'serialization_failure';
    END IF;
    PERFORM notifyedge_review(p_biz_key, p_order_no, 'PAYLOAD_CONFLICT', p_hash, p_raw_body);
    o_outcome := 'conflict';
    o_review := 'PAYLOAD_CONFLICT';
    o_result := NULL;
END $$;
