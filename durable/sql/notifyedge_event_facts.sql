-- notifyedge_event_facts is what every outbox payload carries besides its
-- move, so that a receiver needs no call back: the order's amount and
-- currency; the channel (the paying trade's once paid, else the one the
-- order was registered with, else null); the paying trade; when (the
-- transaction's time, the row's created_at, RFC 3339 in UTC); and by
-- which path: the setting notifyedge.via when the caller set one for the
-- transaction (query, bill, redrive), else orders_api for the order
-- system's own transitions (no biz_key) and callback for a channel's
-- delivery. Every writer of outbox rows adds it, so the rule is here once.
CREATE OR REPLACE FUNCTION notifyedge_event_facts(
    p_amount bigint, p_currency text, p_channel text, p_paid_by text, p_biz_key text)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'amount', p_amount, 'currency', p_currency,
        'channel', CASE WHEN strpos(p_paid_by, ':') > 1 THEN split_part(p_paid_by, ':', 1) ELSE p_channel END,
        'paid_by', p_paid_by,
        'occurred_at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'via', coalesce(nullif(current_setting('notifyedge.via', true), ''),
                        CASE WHEN p_biz_key IS NULL THEN 'orders_api' ELSE 'callback' END))
$$;
