// Package durable is the authority of notifyedge: the only production package
// that speaks SQL. It owns the schema and its migrations, the one transaction
// that decides a callback delivery (idempotency claim, state machine, the
// trade's refunds, outbox row and stored result), the internal transitions,
// and the review queue.
//
// Guarantees:
//   - Process decides a delivery in ONE transaction and one round trip (a
//     server-side function): the claim insert, the conditional UPDATE of the
//     order judged by rows affected, the refund's trade_refund row, the
//     outbox row and the stored result commit together or not at all. A
//     rollback leaves nothing; a retry then succeeds.
//   - A result is returned only after its transaction committed; a
//     returned error means nothing of this call may be assumed committed
//     or not: the caller answers 503 and the channel's retry gets the right
//     answer.
//   - The unique index on notify_claim.biz_key, not any cache, decides
//     concurrent duplicates.
//   - Money moves only against the trade it belongs to: the order records
//     the trade that paid it (paid_by) and how much of it was refunded
//     (refunded_amount); a refund is applied only by inserting its
//     trade_refund row, which retention never deletes, so a refund
//     delivered again after its claim is gone is skipped, never applied
//     twice, and refunded_amount is always the sum of the payer's rows,
//     at most the amount. The refund's UPDATE guards refunded_amount as
//     read, so refunds racing on several nodes are decided one after the
//     other and exactly one of them completes the order.
//   - One trade pays one order: biz_order.paid_by is unique (a partial
//     unique index). A payment whose trade paid another order is a
//     Conflict (review PAYLOAD_CONFLICT, no claim), decided where a claim
//     of the key would decide it, so the answer does not change once
//     retention deleted that claim; an order without a payer adopts only a
//     trade that paid no other order.
//
// # The state machine
//
// Rows are an event and whose trade it names (any: whatever trade; paying:
// the order's paid_by; other: another trade; "adopts": a paid order whose
// paid_by is NULL takes this trade as its payer, so the paying column
// applies); columns are the order's state. "->X" moves the order to X with
// the topic under it; "=" skips, the state unchanged (with the review row
// named, if any). The table in state.go is the source; the SQL functions
// take it as arrays.
//
//	                         PENDING_PAY   PAID            SHIPPED         CLOSED          REFUNDED
//	PAY_SUCCESS    any       ->PAID                                        = PAID_AFTER_
//	                         ORDER_PAID                                      CLOSE
//	               paying                  =               =                               =
//	               other/NULL              = DUPLICATE_    = DUPLICATE_                    = DUPLICATE_
//	                                         PAYMENT         PAYMENT                         PAYMENT
//	PAY_CLOSED     any       ->CLOSED      =               =               =               =
//	                         ORDER_CLOSED
//	REFUND_SUCCESS any       premature                                     record
//	(adopts)       paying                  refund          refund                          itemise
//	               other                   record          record                          record
//	REFUND_FAILED  any       = REFUND_     = REFUND_       = REFUND_       = REFUND_       = REFUND_
//	                           FAILED        FAILED          FAILED          FAILED          FAILED
//	TRADE_CLOSED   any       ->CLOSED                                      =
//	(adopts)                 ORDER_CLOSED
//	               paying                  settle          settle                          =
//	               other                   =               =                               =
//	SHIP (internal)          =             ->SHIPPED       =               =               =
//	                                       ORDER_SHIPPED
//	CLOSE (internal)         ->CLOSED      =               =               =               =
//	                         ORDER_CLOSED
//
// The refund cells, in the decision order after the trade (a refund
// already in trade_refund, same trade and refund id, is "=" in every cell,
// with no review):
//
//	refund   the refunded total (refunded_amount + RefundAmount, or, when
//	         Cumulative, RefundAmount itself) above the amount:
//	         refund_exceeds, review REFUND_EXCEEDS, no claim; a cumulative
//	         total that raises nothing: =; otherwise recorded and applied:
//	         below the amount the state stays, ORDER_PARTIALLY_REFUNDED;
//	         at the amount ->REFUNDED, ORDER_REFUNDED.
//	settle   the channel closed the paying trade, refunded in full:
//	         ->REFUNDED, refunded_amount = amount (never refund_exceeds),
//	         the rest recorded as one refund without an id; ORDER_REFUNDED.
//	itemise  the order is refunded in full already (e.g. TRADE_CLOSED before
//	         the refund's own notification): =, no review; the refund is
//	         recorded by moving its amount out of the part refunded without
//	         an id, where it fits (a refund above the amount: refund_exceeds).
//	record   another trade's refund (of a duplicate payment, or of one after
//	         close; on CLOSED every trade is another): =, order untouched;
//	         the refund recorded (a cumulative total by what it adds); that
//	         trade's open DUPLICATE_PAYMENT or PAID_AFTER_CLOSE row is
//	         resolved by notifyedge once its recorded refunds reach the
//	         amount; a trade with no such open row opens REFUND_OTHER_TRADE.
//
// Before any of this: an existing claim (replay, or conflict with review
// PAYLOAD_CONFLICT), then the order (unknown_order, amount_mismatch, each
// with its review row and no claim). An applied delivery resolves the open
// UNKNOWN_ORDER and AMOUNT_MISMATCH rows of its key.
//
// # Why batches
//
// With Config.GroupCommit, concurrent deliveries are decided together: one
// statement, one transaction, one commit for a batch. A delivery costs
// Postgres far more in what surrounds its four writes than in the writes:
// the round trip, BEGIN and COMMIT, a snapshot, a PL/pgSQL call and its
// statements' set-up each time. On two cores, with fsync on and 64 callers
// through the edge, one transaction per delivery cost Postgres 262 µs per
// first delivery at 4,316 a second; batches cost 97 µs at 8,138 a second
// (0.37 of the CPU, 1.89 times the deliveries), and the edge's, Postgres's
// and Redis's CPU together fell to 0.46 of one at a time. A lone delivery
// waits for nothing (its median latency at one caller was 1.02 times one at
// a time's). A delivery that finds no batch in flight starts one at once
// with whatever waits; while a batch is in flight, deliveries queue, and
// it takes them all (up to GroupSize) when it ends.
//
// One wait is timed. A batch of two or more that ends with nobody queued
// keeps its slot for up to Config.GroupLinger (3 ms) or until as many
// deliveries as it decided have queued: the callers it answered, coming
// back. Without it, at 64 callers through the edge about 40 % of the
// transactions were lone deliveries (75 a second beside 110 batches), each
// costing Postgres what a batch of five does; with 3 ms, 35 a second beside
// 170 batches, and in that run the edge's sessions cost Postgres 90 µs per
// first delivery against 109-114 µs without it. A batch of one never
// lingers, so one caller at a time waits for nothing.
//
// Batches go one at a time. Config.GroupBatches (default 2) bounds the
// transactions in flight: one batch, and beside it lone deliveries, which
// may wait for a lock as long as their budget, so behind them the free
// slot is taken at once. Two batches at once split the same callers
// into batches half the size, and a batch's set-up and commit are most of
// what it costs: with one at a time, the same bench (64 callers, fsync on,
// the shipper keeping pace) cost the edge's sessions 68-72 µs of Postgres
// per first delivery against 103-145 µs with two, in runs taken in turn.
// BenchmarkBatchSize measures one session alone, fsync on: a payment cost
// Postgres 633 µs of CPU decided alone, 192 in batches of 4, 75 of 16, 51
// of 32 and 42 of 64 (the same way with fsync off, 282 alone and 40 at 32:
// a commit's flush is 150-300 µs of kernel time on this machine).
// BenchmarkPaymentFloor puts the rows a first delivery writes, as bare
// statements that read, lock and check nothing, beside the functions that
// write them (one session, batches of 32, fsync on; medians of three runs,
// Postgres CPU per payment): deciding's rows (claim, order, outbox row) 32
// µs against 53 for notifyedge_process_batch, shipping's (inbox row,
// shipment, order, outbox row) 33 against 49 for notifyedge_ship_batch,
// and 9 for each of the relay's two marks. So about 83 µs a delivery is
// the rows themselves, before any lookup, lock or rule, on an idle
// session; what the bench reads under load is above it.
//
// In a batch, the plain cells (a payment of a pending order, a close of an
// unpaid one, a late duplicate whose claim is gone) are decided from the
// locked rows and written by three statements for the whole batch: the
// claims, the orders' conditional UPDATE judged by rows affected, the
// outbox rows. Every other delivery (refunds, reviews, conflicts, unknown
// orders) runs notifyedge_process inside the batch, under the same locks.
// The answers are the one-at-a-time answers: the decision table runs in one
// batch and one at a time in the tests.
//
// Safety:
//   - Locks are taken in one global order, claim keys sorted (advisory
//     locks on the key's hash), then order rows sorted, and a batch only
//     tries them (pg_try_advisory_xact_lock, FOR NO KEY UPDATE SKIP
//     LOCKED): it never waits, so it cannot deadlock with another batch,
//     a one-at-a-time delivery, a transition, a refund or the shipper. A
//     delivery whose key or order another transaction holds is handed back
//     ("busy") and decided alone, where it waits as it always did; the rest
//     of its batch is answered at once. One-at-a-time deliveries take the
//     key's advisory lock too, so a batch sees them.
//   - A batch never holds two deliveries of one key or one order: they
//     queue for the next.
//   - What try-locks cannot foresee (a claim retention is deleting) ends at
//     the batch's lock_timeout (GroupLockTimeout); a batch that fails for
//     any reason rolls back whole, and its deliveries are decided again one
//     by one, each with its own deadline: no answer is given from a batch
//     before its commit, and an error in one delivery never fails another.
//   - Process returns by its context's deadline: the caller waits for its
//     answer, not for the batch (whose statement is never cancelled for a
//     caller: see Config.CommitWait). A delivery answered at its deadline
//     may still commit, which is correct (the channel's retry replays it).
//   - The relay's NOTIFY stays out of band: one poke per batch that applied
//     something, coalesced by the notifier.
//
// # Entry points: their SQL, what they write, where they commit
//
// The functions are in durable/sql, one file each. A function call is one
// statement in an implicit transaction: it commits when the statement
// ends, before the caller reads its answer, and rolls back whole on any
// error. "callback pool" and "operator pool" are Store's two pools.
//
//	Process, one at a time (group commit off, a lone delivery, a member
//	handed back busy by a batch or one of a failed batch: processOn),
//	callback pool.
//	    SQL: processSQL[event]: a probe of notify_claim by biz_key answers a
//	      replay in plain SQL; otherwise notifyedge_process, which calls
//	      notifyedge_cell, notifyedge_result, notifyedge_move and
//	      notifyedge_review.
//	    Writes: notify_claim, biz_order, trade_refund, outbox, notify_review.
//	    Commits: when the statement ends.
//	Process, in a batch (Config.GroupCommit: group.decide, processBatch),
//	callback pool.
//	    SQL: sqlProcessBatch: notifyedge_process_batch, which writes its
//	      plain members with three set statements (notifyedge_cell,
//	      notifyedge_result) and runs notifyedge_process for the others,
//	      all in the batch's one transaction.
//	    Writes: as Process, for every member at once.
//	    Commits: when the statement ends, which processBatch learns only
//	      from rows.Close and rows.Err: no member is answered before; on
//	      any error every member is decided again alone (a committed one
//	      then replays).
//	Transition (SHIP, CLOSE, a compensation job), callback pool.
//	    SQL: sqlTransition: notifyedge_transition, notifyedge_move.
//	    Writes: biz_order, outbox. Commits: when the statement ends.
//	OrderEvent (the orders API's SHIP and CLOSE), operator pool.
//	    SQL: BEGIN; INSERT of the claim (InternalKey); sqlTransition; UPDATE
//	      of the claim's result_json to notifyedge_result(...); COMMIT.
//	    Writes: notify_claim, biz_order, outbox.
//	    Commits: at pgx.BeginTxFunc's COMMIT; a refused event or an unknown
//	      order rolls the claim back.
//	Ship (the shipping consumer), callback pool.
//	    SQL: sqlShip: notifyedge_ship, notifyedge_transition,
//	      notifyedge_move.
//	    Writes: consumer_inbox, biz_order, outbox, shipment.
//	    Commits: when the statement ends.
//	ShipMany (the shipping consumer, one read's messages), callback pool.
//	    SQL: sqlShipBatch: notifyedge_ship_batch (set-based: the inbox
//	      rows, then the orders locked in order_no order, then one UPDATE
//	      with its outbox rows and shipments).
//	    Writes: consumer_inbox, biz_order, outbox, shipment.
//	    Commits: when the statement ends.
//	PutOrder, PatchOrder (the orders API), operator pool.
//	    SQL: INSERT ... ON CONFLICT DO NOTHING, or UPDATE ... WHERE status
//	      = 'PENDING_PAY', of biz_order; then, when it changed nothing, a
//	      SELECT of the row that refused it.
//	    Writes: biz_order. Commits: each statement on its own, so the
//	      SELECT sees what a concurrent writer committed.
//	RecordReview (a delivery the edge refused), callback pool.
//	    SQL: SELECT notifyedge_review(...).
//	    Writes: notify_review. Commits: when the statement ends.
//	ResolveReview, ResolveRedriven, operator pool: one UPDATE of
//	notify_review each. BumpCacheEpoch, operator pool: one UPDATE of
//	cache_epoch. Each commits when its statement ends.
//	RunRetention, on the node holding retention's session advisory lock,
//	on a connection of its own.
//	    SQL: retentionBatchSQL, sqlOutboxRetentionBatch: DELETE batches.
//	    Writes: notify_claim, outbox, consumer_inbox, notify_review.
//	    Commits: each DELETE on its own (synchronous_commit off).
//	RunRelay, on the node holding the relay's session advisory lock, on a
//	connection of its own.
//	    SQL: sqlUnpublished, then the publish, then sqlMarkPublished.
//	    Writes: outbox.published_at. Commits: when the UPDATE ends, after
//	      the broker acknowledged (a crash between re-sends).
//	The notifier: SELECT pg_notify(...), out of band, after a commit.
//	Migrate: tern's migrations, each in a transaction of its own (0004
//	statement by statement), then installCode: durable/sql and the
//	notifyedge_code row in one transaction; all under the migration lock.
//	Reads (Reviews, Review, OpenReviews, OrderHistory, OutboxBacklog,
//	OldestRowAges, CacheEpoch) write nothing.
//
// # Why the decision stays in SQL
//
// On two cores, fsync on, 32 clients (bench_test.go; medians of three runs
// back to back): Process, the whole decision in one PL/pgSQL call and one
// round trip, cost 375 µs a first delivery; the bare four writes pipelined
// in one round trip (RawPipelined: no replay probe, no lock, no decision)
// 249 µs; the same writes as a visible BEGIN ... COMMIT, statement by
// statement (RawStatementByStatement), 610 µs; Process in batches 93 µs.
// A pipeline cannot branch: a decision in Go needs a statement's answer
// (the state read, rows affected, a conflict) before it sends the next,
// so it is statement by statement at best, dearer than the function, and
// it could not decide a batch from the rows it locked in one statement.
// The shared pieces cost nothing measurable: inlined, in a loop of 3,000
// payments inside Postgres a notifyedge_process call took 82 µs against
// 90 µs with the lookup written in place (it is now one simple
// expression), and a batch 66 µs a member either way.
//
// durable never caches biz_order rows (other systems change them), never
// logs (it returns errors), and never imports the edge, the cache or cmd.
//
// Migrations are plain SQL files embedded in the binary and applied with
// github.com/jackc/tern/v2: it runs on a *pgx.Conn (no database/sql layer
// beside pgx), and holds a blocking session advisory lock for the whole run,
// so nodes that start at once wait for one another instead of polling
// (goose's Postgres session locker retries every few seconds). They change
// the schema; the server-side functions are code, one file each in
// durable/sql, installed by Migrate after the migrations under the same
// lock, when they are not installed already (package durable/sql says
// how).
package durable
