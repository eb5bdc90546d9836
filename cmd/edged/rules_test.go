package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge"
)

// The operator files shipped in ops/: Prometheus rules, their promtool unit
// tests, and a Grafana dashboard.
const (
	opsDir        = "ops"
	rulesFile     = "notifyedge-rules.yml"
	rulesTestFile = "notifyedge-rules_test.yml"
	dashboardFile = "notifyedge-dashboard.json"
)

// contractMetrics are the documented metric names (README, "Admin
// listener") that the rules and the dashboard may use. Renaming a metric
// means changing it here, in the rules and in the dashboard: the tests fail
// until all agree. later marks a metric that edge does not export yet (the
// rules and panels are ready for it); forwarder marks one the forwarder
// exports (its own tests check those against its registry and these
// files); the others must be exported by edge.NewMetrics and
// RegisterBacklog.
var contractMetrics = []struct {
	name      string
	histogram bool
	later     bool
	forwarder bool
}{
	{name: "notifyedge_requests_total"},
	{name: "notifyedge_request_duration_seconds", histogram: true},
	{name: "notifyedge_cache_errors_total"},
	{name: "notifyedge_cache_breaker_open"},
	{name: "notifyedge_connections_refused_total"},
	{name: "notifyedge_log_lines_dropped_total"},
	{name: "notifyedge_review_open"},
	{name: "notifyedge_outbox_pending"},
	{name: "notifyedge_outbox_pending_exact"},
	{name: "notifyedge_outbox_oldest_pending_seconds"},
	{name: "notifyedge_backlog_scrape_ok"},
	{name: "notifyedge_retention_deleted_total", later: true},
	{name: "notifyedge_oldest_row_age_seconds", later: true},
	{name: "notifyedge_relay_replica_shortfall_total", later: true},
	{name: "notifyedge_stream_entries", later: true},
	{name: "notifyedge_stream_group_behind", later: true},
	{name: "notifyedge_channel_cert_not_after_seconds"},
	{name: "notifyedge_config_reloads_total"},
	{name: "notifyedge_starting"},
	{name: "notifyedge_reconcile_total"},
	{name: "notifyedge_reconcile_due"},
	{name: "notifyedge_reconcile_oldest_due_seconds"},
	{name: "notifyedge_cache_epoch_changes_total"},
	{name: "notifyedge_bill_runs_total"},
	{name: "notifyedge_bill_items"},
	{name: "notifyedge_bill_last_ok_seconds"},
	{name: "notifyedge_forward_total", forwarder: true},
	{name: "notifyedge_forward_active", forwarder: true},
	{name: "notifyedge_forward_lag_seconds", forwarder: true},
	{name: "notifyedge_forward_held_orders", forwarder: true},
}

// opsMetricName matches the notifyedge series a PromQL expression (or a
// rules file) names: raw metrics (notifyedge_...) and recorded series
// (notifyedge:...).
var opsMetricName = regexp.MustCompile(`\bnotifyedge[_:][a-z0-9_:]+`)

// opsYAMLComment matches a whole-line YAML comment.
var opsYAMLComment = regexp.MustCompile(`(?m)^\s*#.*$`)

// opsRecordName matches a recording rule's name in the rules file.
var opsRecordName = regexp.MustCompile(`(?m)^\s*-?\s*record:\s*(\S+)\s*$`)

// promtoolPath returns promtool's path, failing the test when it is missing:
// CI runs `make test`, whose deps target installs it.
func promtoolPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool missing: run make deps (Debian package prometheus)")
	}
	return p
}

// runPromtool runs promtool in dir and reports its output on failure.
func runPromtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(promtoolPath(t), args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// opsKnownNames returns every name the rules and the dashboard may use: the
// documented ones (with a histogram's series) and the rules' recorded series.
func opsKnownNames(t *testing.T) map[string]bool {
	t.Helper()
	rules, err := os.ReadFile(filepath.Join(opsDir, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	known := make(map[string]bool)
	for _, m := range contractMetrics {
		known[m.name] = true
		if m.histogram {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				known[m.name+s] = true
			}
		}
	}
	recs := opsRecordName.FindAllSubmatch(rules, -1)
	if len(recs) == 0 {
		t.Fatalf("%s records nothing", rulesFile)
	}
	for _, r := range recs {
		known[string(r[1])] = true
	}
	return known
}

// opsUnknownNames returns the notifyedge names in s that known lacks.
func opsUnknownNames(known map[string]bool, s string) []string {
	var bad []string
	for _, n := range opsMetricName.FindAllString(s, -1) {
		if !known[n] && !slices.Contains(bad, n) {
			bad = append(bad, n)
		}
	}
	return bad
}

// TestAlertRules checks the rules with promtool and runs their unit tests,
// which feed series that must fire every alert and series that must not
// (a bad-signature flood that would dilute the duplicate ratio, two nodes
// reporting the same shared gauge, ...). The rules may name only documented
// metrics and their own records.
func TestAlertRules(t *testing.T) {
	rules, err := os.ReadFile(filepath.Join(opsDir, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	if bad := opsUnknownNames(opsKnownNames(t), opsYAMLComment.ReplaceAllString(string(rules), "")); len(bad) > 0 {
		t.Errorf("%s names metrics outside the metric list: %v", rulesFile, bad)
	}
	runPromtool(t, opsDir, "check", "rules", rulesFile)
	runPromtool(t, opsDir, "test", "rules", rulesTestFile)
}

// TestAlertRulesMetricsExported checks the metric list against what
// edge registers, so a metric renamed in code fails here (and the rules and
// dashboard are updated with the list) instead of leaving alerts silent.
func TestAlertRulesMetricsExported(t *testing.T) {
	m := edge.NewMetrics([]string{"acme"})
	m.RegisterBacklog(opsBacklog{})
	m.ConnsRefused.WithLabelValues("per_ip") // a vector shows once it has a child
	creds, err := newCredentials(&Main{Logger: slog.Default()}, m.Registry)
	if err != nil {
		t.Fatal(err)
	}
	creds.notAfter.WithLabelValues("wx", "5157F09EFDC096DE")
	rm, err := newReconcileMetrics(m.Registry, opsBacklog{}, durable.ReconcileWindow{After: time.Minute, Horizon: time.Hour},
		func() bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	rm.channels([]string{"wx"})
	bm, err := newBillMetrics(m.Registry, opsBills{}, func() bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	bm.channels([]string{"wx"})
	if _, err := newEpochWatch(m.Registry, slog.Default()); err != nil {
		t.Fatal(err)
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := make(map[string]bool)
	for _, f := range families {
		exported[f.GetName()] = true
	}
	for _, c := range contractMetrics {
		switch {
		case c.forwarder:
			// Exported by cmd/forwarder, not edge: checked there.
		case !c.later && !exported[c.name]:
			t.Errorf("%s is in the metric list but edge does not export it (renamed? update the list, %s and %s; a vector shows only once it has a child: make one here)", c.name, rulesFile, dashboardFile)
		case c.later && exported[c.name]:
			t.Logf("%s is exported now: drop its later mark", c.name)
		}
	}
}

// opsBills reports one channel's bills.
type opsBills struct{}

func (opsBills) BillGauges(context.Context) (map[string]durable.BillGauge, error) {
	return map[string]durable.BillGauge{"wx": {LastOK: time.Now(), Categories: map[string]int{durable.BillMatched: 1}}}, nil
}

// opsBacklog is an edge.Backlog with one open review row and an empty
// outbox.
type opsBacklog struct{}

func (opsBacklog) OpenReviews(context.Context) (map[durable.ReviewReason]int64, error) {
	return map[durable.ReviewReason]int64{durable.ReviewUnknownOrder: 1}, nil
}

func (opsBacklog) OutboxBacklog(context.Context) (durable.Backlog, error) {
	return durable.Backlog{Exact: true}, nil
}

func (opsBacklog) ReconcileBacklog(context.Context, durable.ReconcileWindow) (int64, time.Duration, error) {
	return 2, time.Minute, nil
}

// grafanaDashboard is the part of a Grafana dashboard the test reads.
type grafanaDashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"list"`
	} `json:"templating"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaPanel struct {
	ID         int                `json:"id"`
	Type       string             `json:"type"`
	Title      string             `json:"title"`
	Datasource *grafanaDatasource `json:"datasource"`
	Targets    []grafanaTarget    `json:"targets"`
	Panels     []grafanaPanel     `json:"panels"` // a row's panels
}

type grafanaTarget struct {
	Expr       string             `json:"expr"`
	Datasource *grafanaDatasource `json:"datasource"`
}

type grafanaDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// grafanaVars replace the dashboard's variables so that promtool can
// parse the expressions.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$job", ".*", "$channel", ".*")

// TestDashboard parses the Grafana dashboard: valid JSON, the datasource
// and channel variables, every panel on ${DS_PROMETHEUS} with a query, and
// every query naming only documented metrics and recorded series (a renamed
// metric fails here) and parsing as PromQL.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(opsDir, dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" {
		t.Errorf("dashboard title %q, uid %q: want both", d.Title, d.UID)
	}
	vars := make(map[string]string)
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["DS_PROMETHEUS"] != "datasource" {
		t.Errorf("templating: want a datasource variable DS_PROMETHEUS, got %v", vars)
	}
	if vars["channel"] != "query" {
		t.Errorf("templating: want a query variable channel, got %v", vars)
	}

	known := opsKnownNames(t)
	var panels []grafanaPanel
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			panels = append(panels, p)
		}
	}
	walk(d.Panels)
	if len(panels) == 0 {
		t.Fatal("dashboard has no panels")
	}
	ids := make(map[int]string)
	var rules strings.Builder
	rules.WriteString("groups:\n- name: dashboard\n  rules:\n")
	for _, p := range panels {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Datasource == nil || p.Datasource.UID != "${DS_PROMETHEUS}" {
			t.Errorf("panel %q: datasource %+v, want uid ${DS_PROMETHEUS}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for i, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q, query %d: empty expr", p.Title, i)
				continue
			}
			if tg.Datasource != nil && tg.Datasource.UID != "${DS_PROMETHEUS}" {
				t.Errorf("panel %q, query %d: datasource %+v, want uid ${DS_PROMETHEUS}", p.Title, i, tg.Datasource)
			}
			names := opsMetricName.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q, query %d names no notifyedge metric: %s", p.Title, i, tg.Expr)
			}
			if bad := opsUnknownNames(known, tg.Expr); len(bad) > 0 {
				t.Errorf("panel %q, query %d names metrics outside the metric list and the rules' records: %v", p.Title, i, bad)
			}
			expr, _ := json.Marshal(grafanaVars.Replace(tg.Expr)) // a JSON string is a YAML string
			fmt.Fprintf(&rules, "  - record: dashboard:panel%d_query%d:check\n    expr: %s\n", p.ID, i, expr)
		}
	}
	if t.Failed() {
		return
	}
	// promtool parses every query as a recording rule's expression.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard-rules.yml"), []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, dir, "check", "rules", "dashboard-rules.yml")
}
