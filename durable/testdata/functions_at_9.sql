-- The notifyedge_* functions a build at schema version 8 or 9 left
-- installed, as that build's migrations created them: names, argument
-- names and types, results and settings as pg_get_functiondef printed
-- them (the one LANGUAGE sql function is PL/pgSQL here). Only the bodies
-- are not kept: an upgrade must replace or drop every one of these
-- functions, and a body left behind raises.
--
-- Frozen: this is what existing databases hold, not what durable installs.

CREATE OR REPLACE FUNCTION notifyedge_apply(p_order_no text, p_from text, p_to text, p_topic text, p_event text, p_biz_key text, p_amount bigint, p_currency text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'the previous build''s % is still installed', 'notifyedge_apply';
END
$function$;

CREATE OR REPLACE FUNCTION notifyedge_review(p_biz_key text, p_order_no text, p_reason text, p_hash text, p_raw_body text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'the previous build''s % is still installed', 'notifyedge_review';
END
$function$;

CREATE OR REPLACE FUNCTION notifyedge_process(p_biz_key text, p_order_no text, p_hash text, p_raw_body text, p_claim_hash text, p_event text, p_amount bigint, p_currency text, p_state_list text, p_to_list text, p_topic_list text, p_review_list text, p_premature_list text, OUT o_outcome text, OUT o_status text, OUT o_result text, OUT o_review text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'the previous build''s % is still installed', 'notifyedge_process';
END
$function$;

CREATE OR REPLACE FUNCTION notifyedge_transition(p_order_no text, p_event text, p_state_list text, p_to_list text, p_topic_list text, OUT o_found boolean, OUT o_applied boolean, OUT o_from text, OUT o_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'the previous build''s % is still installed', 'notifyedge_transition';
END
$function$;

CREATE OR REPLACE FUNCTION notifyedge_ship(p_consumer text, p_outbox_id bigint, p_order_no text, p_state_list text, p_to_list text, p_topic_list text, OUT o_result text, OUT o_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'the previous build''s % is still installed', 'notifyedge_ship';
END
$function$;

CREATE OR REPLACE FUNCTION notifyedge_move(p_order_no text, p_event text, p_biz_key text, p_amount bigint, p_currency text, p_from text, p_to text, p_topic text, p_paid_by text, p_trade text, p_refunded bigint, p_new_refunded bigint, p_refund_id text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'the previous build''s % is still installed', 'notifyedge_move';
END
$function$;

CREATE OR REPLACE FUNCTION notifyedge_process(p_biz_key text, p_order_no text, p_hash text, p_raw_body text, p_claim_hash text, p_event text, p_amount bigint, p_currency text, p_trade text, p_refund_id text, p_refund_amount bigint, p_cumulative boolean, r_from text[], r_party text[], r_act text[], r_to text[], r_topic text[], r_review text[], r_partial_topic text, r_adopt boolean, OUT o_outcome text, OUT o_status text, OUT o_result text, OUT o_review text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'the previous build''s % is still installed', 'notifyedge_process';
END
$function$;

CREATE OR REPLACE FUNCTION notifyedge_transition(p_order_no text, p_event text, r_from text[], r_act text[], r_to text[], r_topic text[], OUT o_found boolean, OUT o_applied boolean, OUT o_from text, OUT o_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'the previous build''s % is still installed', 'notifyedge_transition';
END
$function$;

CREATE OR REPLACE FUNCTION notifyedge_ship(p_consumer text, p_outbox_id bigint, p_order_no text, r_from text[], r_act text[], r_to text[], r_topic text[], OUT o_result text, OUT o_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'the previous build''s % is still installed', 'notifyedge_ship';
END
$function$;

CREATE OR REPLACE FUNCTION notifyedge_process_batch(p_keys text[], p_orders text[], p_hashes text[], p_bodies text[], p_events text[], p_amounts bigint[], p_currencies text[], p_trades text[], p_refund_ids text[], p_refund_amounts bigint[], p_cumulative boolean[], p_lock_timeout text, r_events text[], r_lo integer[], r_hi integer[], r_from text[], r_party text[], r_act text[], r_to text[], r_topic text[], r_review text[], r_partial_topic text[], r_adopt boolean[])
 RETURNS TABLE(o_idx integer, o_outcome text, o_status text, o_result text, o_review text)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
AS $function$
BEGIN
    RAISE EXCEPTION 'the previous build''s % is still installed', 'notifyedge_process_batch';
END
$function$;
