-- Event ids: every outbox row carries an id no other row of any database
-- ever has, fixed when the row is written, so a receiver that drops
-- duplicates by it never drops a real event. The serial id cannot be it:
-- a new database, a restore or a second environment starts again at 1.
--
-- The default is a UUID version 7 (RFC 9562): 48 bits of Unix
-- milliseconds, then the random bits of gen_random_uuid() with the version
-- set to 7 (bits 52 and 53 of its bytes turn version 4 into 7): unique
-- without coordination, and in time order. An expression, not a function:
-- migrations create no functions (durable/sql holds them).
--
-- This migration runs outside a transaction (the tern directive below),
-- one statement at a time, each safe to run again after a crash part way:
-- inside one transaction the ALTER TABLE's ACCESS EXCLUSIVE lock on outbox
-- would be held until the backfill had written every unpublished row,
-- stopping every callback's outbox insert for as long. Here the ALTERs
-- (metadata only: a column without a default rewrites nothing, and
-- SET DEFAULT touches no row) hold it for an instant, and the backfill
-- locks only the rows it writes. Rows published before the upgrade keep
-- NULL: they are not sent again, and GET /orders shows their event_id as
-- null.
---- tern: disable-tx ----

ALTER TABLE outbox ADD COLUMN IF NOT EXISTS event_id uuid;
ALTER TABLE outbox ALTER COLUMN event_id SET DEFAULT encode(
    set_bit(set_bit(
        overlay(uuid_send(gen_random_uuid())
                PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                FROM 1 FOR 6),
        52, 1), 53, 1), 'hex')::uuid;
UPDATE outbox SET event_id = DEFAULT WHERE published_at IS NULL AND event_id IS NULL;

---- create above / drop below ----

ALTER TABLE outbox DROP COLUMN IF EXISTS event_id;
