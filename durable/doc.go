// Package durable is the authority of notifyedge: the only production package
// that speaks SQL. It owns the schema and its migrations, the one transaction
// that decides a callback delivery (idempotency claim, state machine, outbox
// row and stored result), the internal transitions, and the review queue.
//
// Guarantees:
//   - Process decides a delivery in ONE transaction and one round trip (a
//     server-side function): the claim insert, the conditional UPDATE of the
//     order judged by rows affected, the outbox row and the stored result
//     commit together or not at all. A rollback leaves nothing; a retry then
//     succeeds.
//   - A result is returned only after its transaction committed; a
//     returned error means nothing of this call may be assumed committed
//     or not: the caller answers 503 and the channel's retry gets the right
//     answer.
//   - The unique index on notify_claim.biz_key, not any cache, decides
//     concurrent duplicates.
//
// durable never caches biz_order rows (other systems change them), never
// logs (it returns errors), and never imports the edge, the cache or cmd.
//
// Migrations are plain SQL files embedded in the binary and applied with
// github.com/jackc/tern/v2: it runs on a *pgx.Conn (no database/sql layer
// beside pgx), and holds a blocking session advisory lock for the whole run,
// so nodes that start at once wait for one another instead of polling
// (goose's Postgres session locker retries every few seconds).
package durable
