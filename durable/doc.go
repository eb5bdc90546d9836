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
// a time's): batching is natural, never timed. A delivery that finds a batch
// slot free starts a batch at once with whatever waits; while both slots
// are busy, deliveries queue, and the batch that ends next takes them all
// (up to GroupSize).
//
// Two batches may be in flight (Config.GroupBatches): one executes while
// the other waits for its commit to reach the disk. At four or eight, the
// same callers split into smaller batches and each delivery's share of a
// batch's fixed cost grew (Postgres 113 µs at four, 140 µs at eight, on the
// same bench); at one, the CPU would idle through every commit's flush.
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
//     answer, not for the batch (whose statement runs until the last
//     member's deadline). A delivery answered at its deadline may still
//     commit, which is correct (the channel's retry replays it).
//   - The relay's NOTIFY stays out of band: one poke per batch that applied
//     something, coalesced by the notifier.
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
