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
-- part way (IF NOT EXISTS, CREATE OR REPLACE, backfills that pick only the
-- rows they have not done): inside one transaction, the ACCESS EXCLUSIVE
-- lock of the ALTER TABLE would be held on biz_order until the backfills
-- had scanned the claims and the orders, stopping every callback for as
-- long; here it lasts the instant the catalog change takes, and the
-- backfills lock only the rows they write.
--
-- The functions of 0002 and 0003 stay: nodes of the previous build call
-- them (by their own signatures) until a rolling deploy has replaced them.
-- Orders they pay get no paid_by, which the "Upgrading" rule covers (a
-- paid order without paid_by takes the first trade a refund or close
-- names). A later migration drops them.
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
-- that adopts it). p_new_refunded > p_refunded makes the move a refund of
-- the payer: its trade_refund row is inserted (a plain INSERT: a duplicate
-- would abort the transaction rather than refund twice), and the outbox
-- payload carries the refund.
CREATE OR REPLACE FUNCTION notifyedge_move(
    p_order_no text, p_event text, p_biz_key text, p_amount bigint, p_currency text,
    p_from text, p_to text, p_topic text, p_paid_by text, p_trade text,
    p_refunded bigint, p_new_refunded bigint, p_refund_id text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_trade text := coalesce(p_trade, p_paid_by);
BEGIN
    UPDATE biz_order
       SET status = p_to, paid_by = v_trade, refunded_amount = p_new_refunded, updated_at = now()
     WHERE order_no = p_order_no
       AND status = p_from
       AND paid_by IS NOT DISTINCT FROM p_paid_by
       AND refunded_amount = p_refunded
       AND (p_amount IS NULL OR (amount = p_amount AND currency = p_currency));
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_new_refunded = p_refunded THEN
        INSERT INTO outbox (topic, order_no, payload)
        VALUES (p_topic, p_order_no, jsonb_build_object(
            'order_no', p_order_no, 'event_type', p_event,
            'from', p_from, 'to', p_to, 'biz_key', p_biz_key));
        RETURN true;
    END IF;
    INSERT INTO trade_refund (trade, refund_id, order_no, amount)
    VALUES (v_trade, p_refund_id, p_order_no, p_new_refunded - p_refunded);
    INSERT INTO outbox (topic, order_no, payload)
    VALUES (p_topic, p_order_no, jsonb_build_object(
        'order_no', p_order_no, 'event_type', p_event,
        'from', p_from, 'to', p_to, 'biz_key', p_biz_key,
        'trade', v_trade, 'refund_id', nullif(p_refund_id, ''),
        'refund_amount', p_new_refunded - p_refunded, 'refunded_amount', p_new_refunded));
    RETURN true;
END $$;

-- notifyedge_process decides one callback delivery, in the contract's
-- order: an existing claim (replay or conflict), the order (unknown_order,
-- amount_mismatch), premature, the trade (another trade's refund or close is
-- skipped; the paying trade's refund is refund_exceeds or applied), then
-- the event against the state (skipped, applied).
--
-- The rules are the event's row of durable's state machine (state.go), as
-- parallel arrays: cell i says what the event does to an order in state
-- r_from[i] for the trade party r_party[i] ('' any trade, 'paying' the
-- order's payer, 'other' another trade; a state whose cells depend on the
-- trade has its 'paying' cell first). r_act[i] is the action (move, pay,
-- settle, refund, itemise, record, skip, premature), r_to[i] and r_topic[i]
-- the move's target and topic, r_review[i] the review of a skip.
-- r_partial_topic is the topic of a partial refund; r_adopt says whether a
-- paid order without paid_by takes the trade this event names.
--
-- The claim is inserted before any effect, already DONE with the result the
-- order predicts; the conditional UPDATE then confirms it by rows affected.
-- A concurrent delivery of the same key blocks on the unique index until
-- the winner ends, then replays its result (or, had the winner rolled back,
-- inserts and proceeds). If another writer changed the order between our
-- read and our UPDATE, we decide again (at most 8 times more) on what it
-- left, rewriting the claim's result in the same transaction.
--
-- Locks are taken in one order, claim key before order row (Transition
-- takes the order row only, and trade_refund rows are written after the
-- order row is locked or, for a skip, under the claim key alone): no
-- deadlock.
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
            -- paying or the other trade's (the paying cell comes first).
            v_i := array_position(r_from, v_status);
            -- (PL/pgSQL reads an IF's condition up to the first THEN outside
            -- parentheses: hence those around each CASE.)
            IF r_party[v_i] <> '' AND r_party[v_i] <>
               (CASE WHEN coalesce(v_paid_by = p_trade, r_adopt) THEN 'paying' ELSE 'other' END) THEN
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
    PERFORM notifyedge_review(p_biz_key, p_order_no, 'PAYLOAD_CONFLICT', p_hash, p_raw_body);
    o_outcome := 'conflict';
    o_review := 'PAYLOAD_CONFLICT';
    o_result := NULL;
END $$;

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

-- notifyedge_ship is 0003's shipping effect over the new transition: the
-- inbox row for p_outbox_id (none when NULL: an internal path), the
-- conditional PAID -> SHIPPED with its outbox row, and the shipment record.
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

DROP FUNCTION notifyedge_ship(text, bigint, text, text[], text[], text[], text[]);
DROP FUNCTION notifyedge_transition(text, text, text[], text[], text[], text[]);
DROP FUNCTION notifyedge_process(text, text, text, text, text, text, bigint, text,
    text, text, bigint, boolean, text[], text[], text[], text[], text[], text[], text, boolean);
DROP FUNCTION notifyedge_move(text, text, text, bigint, text, text, text, text, text, text, bigint, bigint, text);
DROP TABLE trade_refund;
DROP INDEX notify_review_open_key_idx;
ALTER TABLE biz_order DROP CONSTRAINT biz_order_refunded_amount_check,
    DROP COLUMN refunded_amount, DROP COLUMN paid_by;
