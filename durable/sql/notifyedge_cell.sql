-- notifyedge_cell finds the cell of the state machine that decides a
-- delivery: in r_from, the first cell of state p_state at or after
-- p_start (an event's row starts there); where that state's cells depend
-- on the trade (r_party 'paying', then 'other' right after it), the cell
-- of the party p_paying names (NULL counts as another trade). It returns
-- the cell's index in r_from .. r_review.
--
-- Written once for notifyedge_process and notifyedge_process_batch, which
-- must find the same cell for the same order. A plain SELECT of one
-- expression, IMMUTABLE: the planner inlines it into the caller's
-- expression, so a call costs what the expression costs. Callers pass
-- plain values: an argument holding a subquery would make the caller's
-- assignment a full statement, which PL/pgSQL plans afresh on many calls,
-- and inlining this function each time costs several times the lookup.
CREATE OR REPLACE FUNCTION notifyedge_cell(
    r_from text[], r_party text[], p_state text, p_start int, p_paying boolean)
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN r_party[array_position(r_from, p_state, p_start)] <> ''
                 AND r_party[array_position(r_from, p_state, p_start)]
                     <> CASE WHEN p_paying THEN 'paying' ELSE 'other' END
                THEN array_position(r_from, p_state, array_position(r_from, p_state, p_start) + 1)
                ELSE array_position(r_from, p_state, p_start) END
$$;
