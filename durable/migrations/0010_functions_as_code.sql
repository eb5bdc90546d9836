-- The decision's functions are code from now on (durable/sql): installed
-- with CREATE OR REPLACE after the migrations, on every Migrate whose code
-- or installed functions changed. Migrations change the schema only.
--
-- The overloads 0002 and 0003 created, superseded by 0004's signatures:
-- no build since 0004 calls them. A fresh database never had them.
DROP FUNCTION IF EXISTS notifyedge_process(text, text, text, text, text, text, bigint, text,
    text, text, text, text, text);
DROP FUNCTION IF EXISTS notifyedge_transition(text, text, text, text, text);
DROP FUNCTION IF EXISTS notifyedge_ship(text, bigint, text, text, text, text);
DROP FUNCTION IF EXISTS notifyedge_apply(text, text, text, text, text, text, bigint, text);

-- What Migrate installed last: the SHA-256 of the files, and an MD5 of the
-- notifyedge_* functions as the catalog held them right after. One row.
CREATE TABLE notifyedge_code (
    id            boolean     PRIMARY KEY DEFAULT true CHECK (id),
    source_sha256 text        NOT NULL,
    installed_md5 text        NOT NULL,
    installed_at  timestamptz NOT NULL DEFAULT now()
);

---- create above / drop below ----

-- The dropped overloads stay dropped: no build that runs on this schema
-- calls them.
DROP TABLE notifyedge_code;
