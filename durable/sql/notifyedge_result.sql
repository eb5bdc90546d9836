-- notifyedge_result is the canonical result_json of a DONE claim, the one
-- place it is written: every claim stores it, and a replay answers with the
-- stored bytes, so they must not change while a claim can be replayed
-- (nodes of two builds answer the same key during a rolling deploy).
-- durable/result.go's ParseCanonical reads exactly this form back.
--
-- Inlined by the planner (one expression, IMMUTABLE), like a format() call
-- written in place. A NULL part is written as '', as format() writes it.
CREATE OR REPLACE FUNCTION notifyedge_result(p_outcome text, p_status text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '{"http":200,"code":"SUCCESS","outcome":"' || coalesce(p_outcome, '')
        || '","status":"' || coalesce(p_status, '') || '"}'
$$;
