// Package sql holds the server-side functions of durable's decision as
// code: one file per function, each a CREATE OR REPLACE. durable embeds
// them (Files) and installs them on every Migrate, after the versioned
// migrations and under the same advisory lock, so several nodes starting
// at once install them one after the other, each against the schema the
// migrations just left. What is installed is what these files say: the
// installed functions are never a sum of migrations to be read in order.
//
// # The rules
//
//   - A versioned migration (durable/migrations) changes the schema only.
//     It never creates a function that durable calls, and never calls one
//     (a backfill is written in plain SQL): on a fresh database the
//     functions do not exist until every migration has run. A migration
//     that needed a function for a backfill would define it itself, for
//     its own use, and drop it before it ends.
//   - A migration must leave the previous code working until this code is
//     installed a moment later, and a function keeps its signature
//     (argument types and names, OUT columns): CREATE OR REPLACE cannot
//     change them, and nodes of the previous build keep calling the
//     installed functions by signature during a rolling deploy. A new
//     signature is a new function with a name and a file of its own; the
//     old one's file goes, and a migration drops it, once no running
//     build calls it.
//   - Each notifyedge_* function exists once, with no overloads: a test
//     asserts it on a migrated database, and that a database upgraded from
//     version 8 or 9 ends with exactly the functions of a fresh one.
//   - Files are installed in name order, in one transaction. A LANGUAGE sql
//     function's body is checked when it is created, so it may only call
//     functions of files that sort before its own; PL/pgSQL bodies are
//     checked when first called.
//
// # What the old migrations keep
//
// 0002, 0003, 0004, 0008 and 0009 once created the functions, each a copy
// of the last with a change. Their function bodies are gone from those
// files: the schema statements and backfills stay exactly as they were.
// That is safe because
//   - tern records a version number, not the text it ran: a database that
//     ran the old text is unchanged by the edit, and its functions (same
//     signatures) are replaced by these files on its next Migrate;
//   - no migration's data step calls a notifyedge_* function (0004's
//     backfills and 0009's check are plain SQL), so on a fresh database
//     every migration runs as before, without them;
//   - migration 0010 drops the overloads 0002 and 0003 created, which no
//     build since 0004 calls (IF EXISTS: a fresh database never had them),
//     so a fresh database and an upgraded one end with the same functions.
//
// Migrations whose only content were functions keep a no-op statement:
// tern refuses an empty migration, and renumbering would change what
// existing databases' versions mean.
//
// # Installing only what changed
//
// The table notifyedge_code records the SHA-256 of these files as last
// installed and an MD5 of the installed notifyedge_* functions as
// pg_get_functiondef printed them right after. Migrate installs again
// unless both still match: a changed file, a function changed or dropped
// by hand, or an overload added all install the files again. Installing
// unchanged code would be correct too, but every session that runs a
// replaced function compiles it again, on every node, at every start.
package sql

import "embed"

// Files are the function files, installed in name order.
//
//go:embed *.sql
var Files embed.FS
