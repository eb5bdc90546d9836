-- The callback decision as server-side functions, so that a first delivery
-- is ONE round trip: on two busy cores, round trips are what a 200 ms budget
-- dies of. Every statement runs in the caller's single transaction (the
-- implicit transaction of the one SELECT that calls the function), so a
-- rollback leaves nothing at all.
--
-- The events/states table is NOT here: Go passes the row of the event as
-- comma-separated parallel lists (element i describes state i of p_states;
-- an empty element means none), so the table lives in one place
-- (durable/state.go). Text lists cost the client less than text[] params.

-- notifyedge_apply is the one conditional transition: every writer of
-- biz_order.status goes through it. It is judged by rows affected: 0 rows
-- means the order is no longer in a from-state (or its amount/currency
-- differ), and nothing is written. On success it writes the outbox row in
-- the same transaction. Callers pass as p_from the one state they read, so
-- the payload's "from" is exact: if the order moved meanwhile to another
-- state, the UPDATE (which waits for the mover's commit and then re-checks
-- its WHERE on the new row version) affects 0 rows and the caller decides
-- again on what the order is now.
CREATE FUNCTION notifyedge_apply(
    p_order_no text, p_from text, p_to text, p_topic text,
    p_event text, p_biz_key text, p_amount bigint, p_currency text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_rows int;
BEGIN
    UPDATE biz_order
       SET status = p_to, updated_at = now()
     WHERE order_no = p_order_no
       AND status = ANY (ARRAY[p_from])
       AND (p_amount IS NULL OR (amount = p_amount AND currency = p_currency));
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    IF v_rows = 0 THEN
        RETURN false;
    END IF;
    INSERT INTO outbox (topic, order_no, payload)
    VALUES (p_topic, p_order_no, jsonb_build_object(
        'order_no', p_order_no, 'event_type', p_event,
        'from', p_from, 'to', p_to, 'biz_key', p_biz_key));
    RETURN true;
END $$;

-- notifyedge_review opens a review row unless the same problem is already
-- open (the partial unique index makes "one open row" a constraint).
CREATE FUNCTION notifyedge_review(
    p_biz_key text, p_order_no text, p_reason text, p_hash text, p_raw_body text)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO notify_review (biz_key, order_no, reason, payload_hash, raw_body)
    VALUES (p_biz_key, p_order_no, p_reason, p_hash, p_raw_body)
    ON CONFLICT (biz_key, payload_hash, reason) WHERE resolved_at IS NULL DO NOTHING;
$$;

-- notifyedge_process decides one callback delivery. Decisions follow the
-- contract's order: an existing claim (replay or conflict), then the order
-- (unknown_order, amount_mismatch), then the event against the current state
-- (premature, skipped, applied).
--
-- The claim is inserted before any effect, already DONE with the result the
-- order's state predicts; the conditional UPDATE then confirms it by rows
-- affected. A concurrent delivery of the same key blocks on the unique index
-- until the winner ends, then replays its result (or, had the winner rolled
-- back, inserts and proceeds). If another writer moved the order between our
-- read and our UPDATE, the UPDATE affects 0 rows and we decide again on the
-- state it left, rewriting the claim's result in the same transaction.
--
-- Locks are taken in one order, claim key before order row, and Transition
-- takes the order row only: no deadlock.
--
-- p_claim_hash is the payload_hash of the key's claim as the caller's
-- statement just read it (NULL: no claim), so the function does not probe
-- again. Were it wrong, the unique index would still catch the duplicate.
--
-- o_outcome is one of applied, skipped, replayed, conflict, premature,
-- amount_mismatch, unknown_order. o_result is the canonical result_json of a
-- DONE claim (applied, skipped, replayed).
CREATE FUNCTION notifyedge_process(
    p_biz_key text, p_order_no text, p_hash text, p_raw_body text, p_claim_hash text,
    p_event text, p_amount bigint, p_currency text,
    p_state_list text, p_to_list text, p_topic_list text, p_review_list text, p_premature_list text,
    OUT o_outcome text, OUT o_status text, OUT o_result text, OUT o_review text)
LANGUAGE plpgsql AS $$
DECLARE
    p_states    text[] := string_to_array(p_state_list, ',');
    p_to        text[] := string_to_array(p_to_list, ',');
    p_topics    text[] := string_to_array(p_topic_list, ',');
    p_reviews   text[] := string_to_array(p_review_list, ',');
    p_premature text[] := string_to_array(p_premature_list, ',');
    v_hash     text;
    v_status   text;
    v_amount   bigint;
    v_currency text;
    v_claim    bigint;
    v_i        int;
    v_to       text;
    v_tries    int := 0;
BEGIN
    v_hash := p_claim_hash;
    IF v_hash IS NULL THEN
        LOOP
            SELECT o.status, o.amount, o.currency INTO v_status, v_amount, v_currency
              FROM biz_order o WHERE o.order_no = p_order_no;
            IF v_claim IS NOT NULL AND (NOT FOUND OR v_amount <> p_amount
               OR v_currency <> p_currency OR v_status = ANY (p_premature) OR v_tries > 8) THEN
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
            o_status := v_status;
            IF v_amount <> p_amount OR v_currency <> p_currency THEN
                PERFORM notifyedge_review(p_biz_key, p_order_no, 'AMOUNT_MISMATCH', p_hash, p_raw_body);
                o_outcome := 'amount_mismatch';
                o_review := 'AMOUNT_MISMATCH';
                RETURN;
            END IF;
            IF v_status = ANY (p_premature) THEN
                o_outcome := 'premature';
                RETURN;
            END IF;

            -- Layer 3 decides, layer 2 backstops: predict, claim, confirm.
            v_i := array_position(p_states, v_status);
            v_to := coalesce(p_to[v_i], '');
            o_outcome := CASE WHEN v_to <> '' THEN 'applied' ELSE 'skipped' END;
            o_status := CASE WHEN v_to <> '' THEN v_to ELSE v_status END;
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

            IF v_to = '' THEN
                o_review := nullif(coalesce(p_reviews[v_i], ''), '');
                IF o_review IS NOT NULL THEN
                    PERFORM notifyedge_review(p_biz_key, p_order_no, o_review, p_hash, p_raw_body);
                END IF;
                RETURN;
            END IF;
            IF notifyedge_apply(p_order_no, v_status, v_to, p_topics[v_i],
                                p_event, p_biz_key, p_amount, p_currency) THEN
                RETURN;
            END IF;
            -- The order moved under us: decide again on what it is now.
            v_tries := v_tries + 1;
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

-- notifyedge_transition moves an order for an internal path (SHIP, a
-- compensation job): the same conditional transition and outbox row, no
-- claim. o_found is false for an unknown order; o_applied false when the
-- order was not in a from-state, with o_status its current state.
CREATE FUNCTION notifyedge_transition(
    p_order_no text, p_event text, p_state_list text, p_to_list text, p_topic_list text,
    OUT o_found boolean, OUT o_applied boolean, OUT o_from text, OUT o_status text)
LANGUAGE plpgsql AS $$
DECLARE
    p_states text[] := string_to_array(p_state_list, ',');
    p_to     text[] := string_to_array(p_to_list, ',');
    p_topics text[] := string_to_array(p_topic_list, ',');
    v_i  int;
    v_to text;
BEGIN
    o_applied := false;
    FOR v_try IN 1..9 LOOP
        SELECT o.status INTO o_from FROM biz_order o WHERE o.order_no = p_order_no;
        o_found := FOUND;
        o_status := o_from;
        IF NOT o_found THEN
            RETURN;
        END IF;
        v_i := array_position(p_states, o_from);
        v_to := coalesce(p_to[v_i], '');
        IF v_to = '' THEN
            RETURN;
        END IF;
        IF notifyedge_apply(p_order_no, o_from, v_to, p_topics[v_i], p_event, NULL, NULL, NULL) THEN
            o_applied := true;
            o_status := v_to;
            RETURN;
        END IF;
        -- Moved under us: decide again on its new state.
    END LOOP;
    RAISE EXCEPTION 'order % keeps changing', p_order_no USING ERRCODE = 'serialization_failure';
END $$;

---- create above / drop below ----

DROP FUNCTION notifyedge_transition;
DROP FUNCTION notifyedge_process;
DROP FUNCTION notifyedge_review;
DROP FUNCTION notifyedge_apply;
