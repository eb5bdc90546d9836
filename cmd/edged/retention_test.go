package main

import (
	"context"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/wait"
	"github.com/notifyedge/notifyedge/edge/edgetest"
)

// edged runs retention from the start, with its flags: a claim older than
// -claim-retention is gone at once, and /metrics counts it and reports
// every table's oldest row.
func TestMainRunsRetention(t *testing.T) {
	ctx := context.Background()
	dbURL := durabletest.NewDatabase(t)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, created_at) VALUES
		('acme:old:PAY_SUCCESS', 'O-old', repeat('0', 64), 'DONE', now() - interval '30 hours'),
		('acme:new:PAY_SUCCESS', 'O-new', repeat('0', 64), 'DONE', now() - interval '20 hours')`); err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseConfig([]string{"-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-claim-retention", "25h"},
		[]string{"DATABASE_URL=" + dbURL, "EDGE_SECRET_ACME=" + secret})
	if err != nil {
		t.Fatal(err)
	}
	cfg.DrainDelay = 0
	m := NewMain(cfg)
	m.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := m.Run(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	var page string
	deleted := regexp.MustCompile(`(?m)^notifyedge_retention_deleted_total\{table="notify_claim"\} 1$`)
	wait.For(t, "a deleted claim counted", func() (bool, string) {
		page = scrape(t, "http://"+m.AdminAddr()+"/metrics")
		return deleted.MatchString(page), grepLines(page, "retention", "oldest")
	})
	rows, err := conn.Query(ctx, `SELECT biz_key FROM notify_claim`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(keys) != 1 || keys[0] != "acme:new:PAY_SUCCESS" {
		t.Errorf("claims left %v (%v), want the 20-hour-old one only", keys, err)
	}
	for _, table := range durable.RetentionTables {
		if !strings.Contains(page, `notifyedge_retention_deleted_total{table="`+table+`"}`) {
			t.Errorf("no notifyedge_retention_deleted_total for %s", table)
		}
		if !regexp.MustCompile(`(?m)^notifyedge_oldest_row_age_seconds\{table="` + table + `"\} `).MatchString(page) {
			t.Errorf("no notifyedge_oldest_row_age_seconds for %s", table)
		}
	}
	claimAge := regexp.MustCompile(`(?m)^notifyedge_oldest_row_age_seconds\{table="notify_claim"\} (7[0-9]{4}|72000)`)
	if !claimAge.MatchString(page) {
		t.Errorf("oldest claim age is not about 20h (72000s):\n%s", grepLines(page, "oldest"))
	}
}

// A claim retention under the channels' retry window keeps edged from
// starting, with the flag named.
func TestClaimRetentionFloor(t *testing.T) {
	_, err := ParseConfig([]string{"-claim-retention", "24h"}, []string{"DATABASE_URL=postgres://db/x", "EDGE_SECRET_ACME=" + secret})
	if err == nil || !strings.Contains(err.Error(), "-claim-retention") || !strings.Contains(err.Error(), "25h") {
		t.Errorf("24h: %v, want a refusal naming -claim-retention and 25h", err)
	}
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	return edgetest.Scrape(t, testClient, url)
}

func grepLines(page string, words ...string) string {
	var out []string
	for _, line := range strings.Split(page, "\n") {
		for _, w := range words {
			if strings.Contains(line, w) && !strings.HasPrefix(line, "#") {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
