-- One trade pays one order.
--
-- What changed since 0008:
--   - biz_order.paid_by is unique among orders (a partial unique index):
--     the schema, not only the functions, refuses a trade recorded as the
--     payer of two orders. Before building it, the upgrade looks for orders
--     that share a payer and, if it finds any, stops and lists them with
--     what to do.
--   - notifyedge_process: a payment (an event with a cell that records its
--     trade as the payer) whose trade paid another order is a conflict,
--     review PAYLOAD_CONFLICT, no claim stored: the answer its key's claim
--     gave while retention still kept it, decided where a claim with
--     another digest is, before anything about the order. An order without
--     a payer adopts the trade a refund or close names only if that trade
--     paid no other order; otherwise it is another trade's refund or close.
--     A conflict locks its key's claim before opening its review, so that
--     retention, which keeps every claim an open review names, is not
--     deleting it meanwhile.
--   - notifyedge_process_batch: a plain move whose new payer paid another
--     order is not decided by the set statements but by notifyedge_process
--     (the conflict above): the set UPDATE never meets the unique index.
-- Everything else is 0008's, unchanged.

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

-- notifyedge_process: 0008's, with the changes above.
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
            -- paying or the other trade's (the paying cell comes first). An
            -- order without a payer adopts the trade only if that trade paid
            -- no other order: one trade pays one order.
            v_i := array_position(r_from, v_status);
            -- (PL/pgSQL reads an IF's condition up to the first THEN outside
            -- parentheses: hence those around each CASE.)
            IF r_party[v_i] <> '' AND r_party[v_i] <>
               (CASE WHEN coalesce(v_paid_by = p_trade,
                                   r_adopt AND NOT EXISTS (SELECT 1 FROM biz_order o WHERE o.paid_by = p_trade))
                     THEN 'paying' ELSE 'other' END) THEN
                v_i := array_position(r_from, v_status, v_i + 1);
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
            -- The canonical result (durable/result.go reads exactly this).
            o_result := format('{"http":200,"code":"SUCCESS","outcome":"%s","status":"%s"}', o_outcome, o_status);
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

-- notifyedge_process_batch: 0008's, with the change above.
--
-- notifyedge_process_batch decides a batch of deliveries: member i is
-- (p_keys[i], p_orders[i], ...), the fields of notifyedge_process. The
-- rules of every channel event come as one set of parallel arrays: event
-- r_events[j]'s cells are elements r_lo[j] .. r_hi[j] of r_from .. r_review,
-- its partial topic r_partial_topic[j], its adopt flag r_adopt[j]. The keys
-- must be distinct, and so should the orders (the caller's rule: a second
-- member of one order is handed back busy).
--
-- It returns one row per member: o_idx is the member's position, the rest
-- notifyedge_process's answer, or o_outcome 'busy' for a member whose key or
-- order another transaction holds: nothing of it was written, and the
-- caller decides it alone.
--
-- Most deliveries are a plain cell: a move (PAY_SUCCESS on PENDING_PAY, a
-- close of an unpaid order) or a skip that writes nothing but its claim.
-- Those are decided here from the locked rows and written by three
-- statements for the whole batch (the claims, the orders' conditional
-- UPDATE judged by rows affected, the outbox rows), which is where a batch
-- saves: one statement's set-up for many rows. Every other delivery (money,
-- reviews, a conflict, an unknown order, a key with an open review to
-- resolve) goes through notifyedge_process, under the locks already held.
CREATE OR REPLACE FUNCTION notifyedge_process_batch(
    p_keys text[], p_orders text[], p_hashes text[], p_bodies text[], p_events text[],
    p_amounts bigint[], p_currencies text[], p_trades text[], p_refund_ids text[],
    p_refund_amounts bigint[], p_cumulative boolean[], p_lock_timeout text,
    r_events text[], r_lo int[], r_hi int[],
    r_from text[], r_party text[], r_act text[], r_to text[], r_topic text[], r_review text[],
    r_partial_topic text[], r_adopt boolean[])
RETURNS TABLE (o_idx int, o_outcome text, o_status text, o_result text, o_review text)
LANGUAGE plpgsql
-- A session plans these statements once, generically, on its first batch,
-- and keeps the plan: planned while the tables were small, "= ANY (keys)"
-- and the joins on unnest() would scan the whole table on every batch ever
-- after. Every statement here reads a handful of rows by a unique key, so
-- an index is always right: the planner may choose nothing else.
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_n       int := cardinality(p_keys);
    v_hash    text[] := array_fill(NULL::text, ARRAY[v_n]);
    -- A member's way: 0 not yet known, 1 key held, 2 busy, 3 through
    -- notifyedge_process, 4 plain (the set statements), 5 answered.
    v_way     int[] := array_fill(0, ARRAY[v_n]);
    v_keyed   text[] := '{}'; -- orders of the members whose key we hold
    v_plain   int[] := '{}';
    v_moves   int[] := '{}';
    v_from    text[] := array_fill(NULL::text, ARRAY[v_n]);
    v_to      text[] := array_fill(NULL::text, ARRAY[v_n]);
    v_topic   text[] := array_fill(NULL::text, ARRAY[v_n]);
    v_payer   text[] := array_fill(NULL::text, ARRAY[v_n]); -- paid_by as read
    v_newpay  text[] := array_fill(NULL::text, ARRAY[v_n]); -- paid_by after
    v_outcome text[] := array_fill(NULL::text, ARRAY[v_n]);
    v_status  text[] := array_fill(NULL::text, ARRAY[v_n]);
    v_missing text[] := '{}';
    v_exists  text[];
    v_row     record;
    v_i       int;
    v_j       int;
    v_e       int;
    v_act     text;
    v_count   int;
BEGIN
    -- Local to this statement's transaction: a wait try-locks cannot
    -- avoid ends as an error, not as a batch held hostage.
    PERFORM set_config('lock_timeout', p_lock_timeout, true);

    -- Layer 4 first: the keys' committed claims. A replay takes no lock.
    FOR v_row IN SELECT c.biz_key, c.payload_hash, c.result_json
                   FROM notify_claim c WHERE c.biz_key = ANY (p_keys) LOOP
        v_i := array_position(p_keys, v_row.biz_key);
        v_hash[v_i] := v_row.payload_hash;
        IF v_row.payload_hash = p_hashes[v_i] THEN
            v_way[v_i] := 5;
            o_idx := v_i;
            o_outcome := 'replayed';
            o_status := NULL;
            o_result := v_row.result_json;
            o_review := NULL;
            RETURN NEXT;
        ELSE
            v_way[v_i] := 3; -- a conflict: no lock but its claim's and the review row's
        END IF;
    END LOOP;

    -- The keys, in the batch's order.
    FOR v_i IN 1 .. v_n LOOP
        CONTINUE WHEN v_way[v_i] <> 0;
        IF pg_try_advisory_xact_lock(hashtextextended(p_keys[v_i], 0)) THEN
            v_way[v_i] := 1;
            v_keyed := v_keyed || p_orders[v_i];
        ELSE
            v_way[v_i] := 2;
        END IF;
    END LOOP;

    -- Then the orders, locked and read in one statement, sorted, skipping
    -- those another transaction holds. The lock is the one the order's
    -- UPDATE takes (FOR NO KEY UPDATE), so an applied delivery pays nothing
    -- more for it.
    FOR v_row IN SELECT o.order_no, o.status, o.amount, o.currency, o.paid_by
                   FROM biz_order o WHERE o.order_no = ANY (v_keyed)
                  ORDER BY o.order_no FOR NO KEY UPDATE SKIP LOCKED LOOP
        v_i := array_position(p_orders, v_row.order_no);
        WHILE v_way[v_i] <> 1 LOOP
            v_i := array_position(p_orders, v_row.order_no, v_i + 1);
        END LOOP;
        v_way[v_i] := 3;
        CONTINUE WHEN v_row.amount <> p_amounts[v_i] OR v_row.currency <> p_currencies[v_i];
        -- The cell, as notifyedge_process finds it.
        v_e := array_position(r_events, p_events[v_i]);
        v_j := array_position(r_from, v_row.status, r_lo[v_e]);
        IF r_party[v_j] <> '' AND r_party[v_j] <>
           (CASE WHEN coalesce(v_row.paid_by = p_trades[v_i], r_adopt[v_e]) THEN 'paying' ELSE 'other' END) THEN
            v_j := array_position(r_from, v_row.status, v_j + 1);
        END IF;
        v_act := r_act[v_j];
        IF v_act IN ('move', 'pay') THEN
            v_way[v_i] := 4;
            v_moves := v_moves || v_i;
            v_from[v_i] := v_row.status;
            v_to[v_i] := r_to[v_j];
            v_topic[v_i] := r_topic[v_j];
            v_payer[v_i] := v_row.paid_by;
            v_newpay[v_i] := CASE WHEN v_act = 'pay' THEN p_trades[v_i] ELSE v_row.paid_by END;
            v_outcome[v_i] := 'applied';
            v_status[v_i] := r_to[v_j];
        ELSIF v_act = 'skip' AND r_review[v_j] = '' AND NOT (r_party[v_j] = 'paying' AND v_row.paid_by IS NULL) THEN
            v_way[v_i] := 4;
            v_outcome[v_i] := 'skipped';
            v_status[v_i] := v_row.status;
        END IF;
        IF v_way[v_i] = 4 THEN
            v_plain := v_plain || v_i;
        END IF;
    END LOOP;

    -- A key held whose order was not locked: an unknown order (decided by
    -- notifyedge_process: nothing to lock) or one another transaction holds.
    FOR v_i IN 1 .. v_n LOOP
        IF v_way[v_i] = 1 THEN
            v_missing := v_missing || p_orders[v_i];
        END IF;
    END LOOP;
    IF cardinality(v_missing) > 0 THEN
        SELECT coalesce(array_agg(o.order_no), '{}') INTO v_exists
          FROM biz_order o WHERE o.order_no = ANY (v_missing);
        FOR v_i IN 1 .. v_n LOOP
            IF v_way[v_i] = 1 THEN
                v_way[v_i] := CASE WHEN p_orders[v_i] = ANY (v_exists) THEN 2 ELSE 3 END;
            END IF;
        END LOOP;
    END IF;

    -- One trade pays one order: a move whose new payer paid another order
    -- is notifyedge_process's to answer (a conflict), never the set
    -- UPDATE's, which the unique index on paid_by would fail.
    IF cardinality(v_moves) > 0 THEN
        FOR v_row IN SELECT m.i FROM unnest(v_moves) AS m(i)
                      WHERE EXISTS (SELECT 1 FROM biz_order o
                                     WHERE o.paid_by = v_newpay[m.i] AND o.order_no <> p_orders[m.i]) LOOP
            v_way[v_row.i] := 3;
            v_plain := array_remove(v_plain, v_row.i);
            v_moves := array_remove(v_moves, v_row.i);
        END LOOP;
    END IF;

    -- An open UNKNOWN_ORDER or AMOUNT_MISMATCH row of the key, which an
    -- applied delivery resolves: notifyedge_process's way.
    IF cardinality(v_plain) > 0 THEN
        FOR v_row IN SELECT DISTINCT r.biz_key FROM notify_review r
                      WHERE r.biz_key = ANY (p_keys) AND r.resolved_at IS NULL
                        AND r.reason IN ('UNKNOWN_ORDER', 'AMOUNT_MISMATCH') LOOP
            v_i := array_position(p_keys, v_row.biz_key);
            IF v_way[v_i] = 4 THEN
                v_way[v_i] := 3;
                v_plain := array_remove(v_plain, v_i);
                v_moves := array_remove(v_moves, v_i);
            END IF;
        END LOOP;
    END IF;

    -- The plain cells: the claims, the moves judged by rows affected (every
    -- row is locked, so each must match; one that does not fails the
    -- batch, whose members are then decided alone), their outbox rows.
    IF cardinality(v_plain) > 0 THEN
        INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json)
        SELECT p_keys[m.i], p_orders[m.i], p_hashes[m.i], 'DONE',
               format('{"http":200,"code":"SUCCESS","outcome":"%s","status":"%s"}', v_outcome[m.i], v_status[m.i])
          FROM unnest(v_plain) AS m(i);
    END IF;
    IF cardinality(v_moves) > 0 THEN
        UPDATE biz_order o
           SET status = v_to[m.i], paid_by = v_newpay[m.i], updated_at = now()
          FROM unnest(v_moves) AS m(i)
         WHERE o.order_no = p_orders[m.i] AND o.status = v_from[m.i]
           AND o.paid_by IS NOT DISTINCT FROM v_payer[m.i];
        GET DIAGNOSTICS v_count = ROW_COUNT;
        IF v_count <> cardinality(v_moves) THEN
            RAISE EXCEPTION 'batch: % of % locked orders moved', v_count, cardinality(v_moves)
                USING ERRCODE = 'serialization_failure';
        END IF;
        INSERT INTO outbox (topic, order_no, payload)
        SELECT v_topic[m.i], p_orders[m.i], jsonb_build_object(
                   'order_no', p_orders[m.i], 'event_type', p_events[m.i],
                   'from', v_from[m.i], 'to', v_to[m.i], 'biz_key', p_keys[m.i])
          FROM unnest(v_moves) AS m(i);
    END IF;

    FOR v_i IN 1 .. v_n LOOP
        o_idx := v_i;
        o_review := NULL;
        CASE v_way[v_i]
        WHEN 2 THEN
            o_outcome := 'busy';
            o_status := NULL;
            o_result := NULL;
        WHEN 4 THEN
            o_outcome := v_outcome[v_i];
            o_status := v_status[v_i];
            o_result := format('{"http":200,"code":"SUCCESS","outcome":"%s","status":"%s"}', o_outcome, o_status);
        WHEN 3 THEN
            v_e := array_position(r_events, p_events[v_i]);
            SELECT p.o_outcome, p.o_status, p.o_result, p.o_review
              INTO o_outcome, o_status, o_result, o_review
              FROM notifyedge_process(p_keys[v_i], p_orders[v_i], p_hashes[v_i], p_bodies[v_i], v_hash[v_i],
                                      p_events[v_i], p_amounts[v_i], p_currencies[v_i],
                                      p_trades[v_i], p_refund_ids[v_i], p_refund_amounts[v_i], p_cumulative[v_i],
                                      r_from[r_lo[v_e]:r_hi[v_e]], r_party[r_lo[v_e]:r_hi[v_e]],
                                      r_act[r_lo[v_e]:r_hi[v_e]], r_to[r_lo[v_e]:r_hi[v_e]],
                                      r_topic[r_lo[v_e]:r_hi[v_e]], r_review[r_lo[v_e]:r_hi[v_e]],
                                      r_partial_topic[v_e], r_adopt[v_e]) p;
        ELSE
            CONTINUE; -- 5: answered above
        END CASE;
        RETURN NEXT;
    END LOOP;
END $$;

---- create above / drop below ----

-- The functions stay as this migration wrote them: the index only backs
-- them up.
DROP INDEX IF EXISTS biz_order_paid_by_uniq;
