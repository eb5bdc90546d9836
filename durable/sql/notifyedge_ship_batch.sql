-- notifyedge_ship_batch is notifyedge_ship for the messages a consumer
-- read together, decided as sets: a handful of statements for the whole
-- batch instead of four statements and three function calls per message.
-- Item i is (p_outbox_ids[i], p_order_nos[i]); a NULL outbox id is an
-- internal path (no inbox row). One row comes back per item, in item
-- order, with notifyedge_ship's o_result and o_status.
--
-- What each item gets is what notifyedge_ship gives it when the items are
-- shipped one by one in (order_no, outbox id) order, an internal path's
-- items last among its order's:
--   * an outbox id this consumer handled before (in an earlier
--     transaction, or in an item before it in that order) is 'duplicate';
--   * of the remaining items naming one order, the first may move it: the
--     order moves when its state's first cell of the rules moves it
--     (PAID -> SHIPPED), with its outbox row and shipment;
--   * every other item is 'not_shipped', with the order's state ('' when
--     unknown).
--
-- Locks are taken in the global order of every writer that holds several:
-- the inbox rows by outbox id, then the orders by order_no, all locked
-- before any is changed. A transaction that holds an order therefore holds
-- every inbox row it needs, and two batches cannot wait on each other.
CREATE OR REPLACE FUNCTION notifyedge_ship_batch(
    p_consumer text, p_outbox_ids bigint[], p_order_nos text[],
    r_from text[], r_act text[], r_to text[], r_topic text[])
RETURNS TABLE (o_result text, o_status text)
LANGUAGE plpgsql
-- Index plans only, for notifyedge_process_batch's reason: the plans a
-- session keeps were made while biz_order was small.
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_fresh    bigint[]; -- outbox ids whose inbox row this call inserted
    v_fresh_i  int[];    -- the items that inserted them
    v_first    int[];    -- the item that may move each order...
    v_first_no text[];   -- ...its order...
    v_first_id bigint[]; -- ...and its outbox id
    v_nos      text[];   -- the orders of v_first that exist, locked...
    v_states   text[];   -- ...their states once locked...
    v_ids      bigint[]; -- ...and their items' outbox ids
    v_moved    text[];   -- the orders that moved...
    v_moved_to text[];   -- ...and their new states
BEGIN
    WITH ins AS (
        INSERT INTO consumer_inbox (consumer, outbox_id)
        SELECT p_consumer, x FROM unnest(p_outbox_ids) x WHERE x IS NOT NULL ORDER BY x
        ON CONFLICT DO NOTHING
        RETURNING outbox_id)
    SELECT coalesce(array_agg(outbox_id), '{}') INTO v_fresh FROM ins;

    -- An outbox id repeated in the batch inserted its row once: the item
    -- that would have inserted it one by one is fresh, the rest are
    -- duplicates. Of the fresh items of one order, the first in outbox id
    -- order (an internal path's NULL last) may move it.
    SELECT coalesce(array_agg(f.i), '{}') INTO v_fresh_i
      FROM (SELECT DISTINCT ON (u.outbox_id) u.i
              FROM unnest(p_outbox_ids, p_order_nos) WITH ORDINALITY AS u(outbox_id, order_no, i)
             WHERE u.outbox_id = ANY (v_fresh)
             ORDER BY u.outbox_id, u.order_no, u.i) f;
    SELECT coalesce(array_agg(f.i), '{}'), coalesce(array_agg(f.order_no), '{}'), coalesce(array_agg(f.outbox_id), '{}')
      INTO v_first, v_first_no, v_first_id
      FROM (SELECT DISTINCT ON (u.order_no) u.i, u.order_no, u.outbox_id
              FROM unnest(p_outbox_ids, p_order_nos) WITH ORDINALITY AS u(outbox_id, order_no, i)
             WHERE u.outbox_id IS NULL OR u.i = ANY (v_fresh_i)
             ORDER BY u.order_no, u.outbox_id NULLS LAST, u.i) f;

    -- Every order is locked, in order_no order, before any is changed, and
    -- the move is decided on the state it was locked in. Its item's outbox
    -- id rides along to the shipment: a join back to the items by order
    -- would compare every pair.
    SELECT coalesce(array_agg(l.order_no), '{}'), coalesce(array_agg(l.status), '{}'), coalesce(array_agg(l.outbox_id), '{}')
      INTO v_nos, v_states, v_ids
      FROM (SELECT o.order_no, o.status, f.outbox_id
              FROM unnest(v_first_no, v_first_id) AS f(order_no, outbox_id)
              JOIN biz_order o ON o.order_no = f.order_no
             ORDER BY o.order_no
               FOR UPDATE OF o) l;

    WITH moved AS (
        UPDATE biz_order o
           SET status = r_to[array_position(r_from, l.status)], updated_at = now()
          FROM unnest(v_nos, v_states, v_ids) AS l(order_no, status, outbox_id)
         WHERE o.order_no = l.order_no
           AND r_act[array_position(r_from, l.status)] IN ('move', 'pay')
        RETURNING o.order_no, l.status AS from_status, o.status AS to_status,
                  r_topic[array_position(r_from, l.status)] AS topic, l.outbox_id,
                  notifyedge_event_facts(o.amount, o.currency, o.channel, o.paid_by, NULL) AS facts),
    outbox_rows AS (
        INSERT INTO outbox (topic, order_no, payload)
        SELECT m.topic, m.order_no, jsonb_build_object(
                   'order_no', m.order_no, 'event_type', 'SHIP',
                   'from', m.from_status, 'to', m.to_status, 'biz_key', NULL) || m.facts
          FROM moved m ORDER BY m.order_no),
    shipments AS (
        INSERT INTO shipment (order_no, outbox_id, source)
        SELECT m.order_no, m.outbox_id, p_consumer FROM moved m ORDER BY m.order_no)
    SELECT coalesce(array_agg(m.order_no), '{}'), coalesce(array_agg(m.to_status), '{}') INTO v_moved, v_moved_to
      FROM moved m;

    RETURN QUERY
    SELECT CASE
             WHEN NOT d.fresh THEN 'duplicate'
             WHEN d.i = ANY (v_first) AND d.order_no = ANY (v_moved) THEN 'shipped'
             ELSE 'not_shipped'
           END,
           CASE
             WHEN NOT d.fresh THEN ''
             ELSE coalesce(v_moved_to[array_position(v_moved, d.order_no)],
                           v_states[array_position(v_nos, d.order_no)], '')
           END
      FROM (SELECT u.i, u.order_no,
                   u.outbox_id IS NULL OR u.i = ANY (v_fresh_i) AS fresh
              FROM unnest(p_outbox_ids, p_order_nos) WITH ORDINALITY AS u(outbox_id, order_no, i)) d
     ORDER BY d.i;
END $$;
