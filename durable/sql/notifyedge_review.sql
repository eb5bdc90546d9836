-- notifyedge_review opens a review row unless the same problem is already
-- open (the partial unique index makes "one open row" a constraint).
CREATE OR REPLACE FUNCTION notifyedge_review(
    p_biz_key text, p_order_no text, p_reason text, p_hash text, p_raw_body text)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO notify_review (biz_key, order_no, reason, payload_hash, raw_body)
    VALUES (p_biz_key, p_order_no, p_reason, p_hash, p_raw_body)
    ON CONFLICT (biz_key, payload_hash, reason) WHERE resolved_at IS NULL DO NOTHING;
$$;
