-- notifyedge_process_batch decides a batch of deliveries in one
-- transaction and one round trip: member i is (p_keys[i], p_orders[i], ...),
-- the fields of notifyedge_process. The rules of every channel event come
-- as one set of parallel arrays: event r_events[j]'s cells are elements
-- r_lo[j] .. r_hi[j] of r_from .. r_review, its partial topic
-- r_partial_topic[j], its adopt flag r_adopt[j]. The keys must be
-- distinct, and so should the orders (the caller's rule: a second member
-- of one order is handed back busy).
--
-- It returns one row per member: o_idx is the member's position, the rest
-- notifyedge_process's answer, or o_outcome 'busy' for a member whose key or
-- order another transaction holds: nothing of it was written, and the
-- caller decides it alone.
--
-- Locks. A batch never waits for a lock another transaction holds: it
-- tries them, and a delivery whose lock it cannot take is answered 'busy'
-- and decided again alone, where waiting is right. The lock order is
-- global: claim keys (as transaction advisory locks on the key's 64-bit
-- hash) in the order of the batch (sorted by key by the caller), then the
-- orders' rows in one statement, sorted by order_no. Nothing in a batch
-- waits, so batches cannot deadlock with one another, with one-at-a-time
-- deliveries, internal transitions, refunds or the shipper. Two waits are
-- left that try-locks cannot cover: a claim key another transaction is
-- deleting (retention, at most a few rows a day meet a late duplicate) and
-- a review row locked by a resolution; the batch's lock_timeout turns those
-- into an error, and the caller then decides the batch's deliveries one by
-- one.
--
-- Most deliveries are a plain cell: a move (PAY_SUCCESS on PENDING_PAY, a
-- close of an unpaid order) or a skip that writes nothing but its claim.
-- Those are decided here from the locked rows and written by three
-- statements for the whole batch (the claims, the orders' conditional
-- UPDATE judged by rows affected, the outbox rows), which is where a batch
-- saves: one statement's set-up for many rows. Every other delivery (money,
-- reviews, a conflict, an unknown order, a key with an open review to
-- resolve, a move whose new payer paid another order) goes through
-- notifyedge_process, under the locks already held.
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
        -- The cell, as notifyedge_process finds it. (An adopting cell is
        -- never plain: its trade is checked there.)
        v_e := array_position(r_events, p_events[v_i]);
        v_j := notifyedge_cell(r_from, r_party, v_row.status, r_lo[v_e],
                               coalesce(v_row.paid_by = p_trades[v_i], r_adopt[v_e]));
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
               notifyedge_result(v_outcome[m.i], v_status[m.i])
          FROM unnest(v_plain) AS m(i);
    END IF;
    IF cardinality(v_moves) > 0 THEN
        -- An outbox row for each order moved, with the facts as the move
        -- left them; the count of rows inserted is the count moved.
        WITH moved AS (
            UPDATE biz_order o
               SET status = v_to[m.i], paid_by = v_newpay[m.i], updated_at = now(),
                   paid_at = CASE WHEN v_from[m.i] = 'PENDING_PAY' AND v_to[m.i] = 'PAID' THEN now() ELSE o.paid_at END
              FROM unnest(v_moves) AS m(i)
             WHERE o.order_no = p_orders[m.i] AND o.status = v_from[m.i]
               AND o.paid_by IS NOT DISTINCT FROM v_payer[m.i]
            RETURNING m.i, notifyedge_event_facts(o.amount, o.currency, o.channel, o.paid_by, p_keys[m.i]) AS facts)
        INSERT INTO outbox (topic, order_no, payload)
        SELECT v_topic[m.i], p_orders[m.i], jsonb_build_object(
                   'order_no', p_orders[m.i], 'event_type', p_events[m.i],
                   'from', v_from[m.i], 'to', v_to[m.i], 'biz_key', p_keys[m.i]) || m.facts
          FROM moved m ORDER BY m.i;
        GET DIAGNOSTICS v_count = ROW_COUNT;
        IF v_count <> cardinality(v_moves) THEN
            RAISE EXCEPTION 'batch: % of % locked orders moved', v_count, cardinality(v_moves)
                USING ERRCODE = 'serialization_failure';
        END IF;
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
            o_result := notifyedge_result(o_outcome, o_status);
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
