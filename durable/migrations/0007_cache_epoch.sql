-- The cache epoch's operator part (durable/epoch.go). Redis and each node's
-- table of done entries mirror this database; an epoch made of the system
-- identifier, the current timeline and this counter is part of every cache
-- key, so that a database that is not the one the entries were written
-- against (restored, promoted, repaired by hand) is never answered for by
-- them. The system identifier and the timeline change by themselves; a
-- repair or a restore that keeps both needs an operator to move this
-- counter (POST /cache/epoch on the admin listener).
--
-- One row, and only one: the boolean key can only be true.
CREATE TABLE cache_epoch (
    id      boolean PRIMARY KEY DEFAULT true CHECK (id),
    counter bigint  NOT NULL DEFAULT 0
);
INSERT INTO cache_epoch DEFAULT VALUES;

---- create above / drop below ----

DROP TABLE cache_epoch;
