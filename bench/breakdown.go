package bench

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// A breakdown says where a row's Redis and Postgres time went, per answered
// request: Redis's own per-command accounting (INFO commandstats, reset
// before the attack) and pg_stat_statements (reset likewise; nested
// statements of the functions counted as well). Both are the servers' own
// wall-clock time inside each command or statement, not CPU: the rest of
// the process's CPU (protocol, event loop, commit and WAL for Postgres, the
// AOF for Redis) is the difference to the row's CPU column.

// breakdownSettings turn on pg_stat_statements and function timing; they
// cost the server a few per cent, so only a breakdown run sets them.
var breakdownSettings = []string{
	"shared_preload_libraries=pg_stat_statements",
	"pg_stat_statements.track=all",
	"pg_stat_statements.max=1000",
	"track_functions=pl",
}

// Breakdown is one row's Redis commands and Postgres statements.
type Breakdown struct {
	Redis    []Usage `json:"redis"`
	Postgres []Usage `json:"postgres"`
}

// Usage is one command or statement: how often it ran and the time it took,
// both per answered request.
type Usage struct {
	Name          string  `json:"name"`
	CallsPerReq   float64 `json:"calls_per_request"`
	MicrosPerReq  float64 `json:"us_per_request"`
	MicrosPerCall float64 `json:"us_per_call"`
	TopLevel      bool    `json:"top_level,omitempty"`
}

// breakdownTop is how many statements a row lists.
const breakdownTop = 12

// resetBreakdown zeroes both servers' counters.
func resetBreakdown(ctx context.Context, db *pgxpool.Pool, rdb redis.UniversalClient) error {
	if _, err := db.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
		return fmt.Errorf("bench: reset pg_stat_statements: %w", err)
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		return fmt.Errorf("bench: reset redis stats: %w", err)
	}
	return nil
}

// readBreakdown reads both servers' counters for n answered requests.
func readBreakdown(ctx context.Context, db *pgxpool.Pool, rdb redis.UniversalClient, n int) (*Breakdown, error) {
	if n == 0 {
		return nil, nil
	}
	per := float64(n)
	b := &Breakdown{}
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("bench: redis commandstats: %w", err)
	}
	b.Redis = parseCommandStats(info, per)
	rows, err := db.Query(ctx, `
SELECT toplevel, calls, total_exec_time, regexp_replace(query, '\s+', ' ', 'g')
  FROM pg_stat_statements
 WHERE query NOT LIKE '%pg_stat_statements%'
 ORDER BY total_exec_time DESC LIMIT $1`, breakdownTop)
	if err != nil {
		return nil, fmt.Errorf("bench: pg_stat_statements: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var top bool
		var calls int64
		var ms float64
		var q string
		if err := rows.Scan(&top, &calls, &ms, &q); err != nil {
			return nil, fmt.Errorf("bench: pg_stat_statements: %w", err)
		}
		if len(q) > 90 {
			q = q[:90] + "…"
		}
		b.Postgres = append(b.Postgres, Usage{Name: q, CallsPerReq: float64(calls) / per,
			MicrosPerReq: ms * 1000 / per, MicrosPerCall: ms * 1000 / float64(max(calls, 1)), TopLevel: top})
	}
	return b, rows.Err()
}

// parseCommandStats reads INFO commandstats lines such as
// "cmdstat_set:calls=10,usec=25,usec_per_call=2.50,...".
func parseCommandStats(info string, per float64) []Usage {
	var out []Usage
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		u := Usage{Name: strings.TrimPrefix(name, "cmdstat_")}
		var calls, usec float64
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				calls = x
			case "usec":
				usec = x
			}
		}
		if calls == 0 || u.Name == "config" || u.Name == "info" {
			continue
		}
		u.CallsPerReq, u.MicrosPerReq, u.MicrosPerCall = calls/per, usec/per, usec/calls
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].MicrosPerReq > out[j].MicrosPerReq })
	return out
}

// writeBreakdowns adds each row's breakdown to a table's text.
func writeBreakdowns(b *strings.Builder, rows []Row) {
	for _, row := range rows {
		if row.Breakdown == nil {
			continue
		}
		fmt.Fprintf(b, "\nWhere %q spent its time, per answered request (server-side time inside each command or statement):\n", row.Name)
		fmt.Fprintf(b, "  %-8s %-92s %9s %9s %9s\n", "server", "command or statement", "calls/req", "µs/req", "µs/call")
		for _, u := range row.Breakdown.Redis {
			fmt.Fprintf(b, "  %-8s %-92s %9.2f %9.2f %9.2f\n", "redis", u.Name, u.CallsPerReq, u.MicrosPerReq, u.MicrosPerCall)
		}
		for _, u := range row.Breakdown.Postgres {
			where := "pg"
			if !u.TopLevel {
				where = "pg (in)" // a statement inside a function: its time is in its caller's too
			}
			fmt.Fprintf(b, "  %-8s %-92s %9.2f %9.2f %9.2f\n", where, u.Name, u.CallsPerReq, u.MicrosPerReq, u.MicrosPerCall)
		}
	}
}
