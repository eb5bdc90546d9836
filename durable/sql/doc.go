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
//   - A versioned migration (durable/migrations) from 0010 on changes the
//     schema only. It never creates a function that durable calls (the
//     ones earlier migrations created are replaced by these files), and
//     never calls one (a backfill is written in plain SQL). A migration
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
