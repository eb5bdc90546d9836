package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// opsDir holds the operator files shipped beside edged: Prometheus rules
// and a Grafana dashboard, the forwarder's included.
var opsDir = filepath.Join("..", "edged", "ops")

// forwardMetricName matches a forwarder metric named in a rule or a query.
var forwardMetricName = regexp.MustCompile(`\bnotifyedge_forward_[a-z0-9_]+`)

// yamlComment matches a whole-line YAML comment.
var yamlComment = regexp.MustCompile(`(?m)^\s*#.*$`)

// rulesWithoutComments is a rules file less its comments: what a metric
// named only in a comment is not used by.
func rulesWithoutComments(raw []byte) (string, error) {
	return yamlComment.ReplaceAllString(string(raw), ""), nil
}

// dashboardQueries is every query of a Grafana dashboard, one a line.
func dashboardQueries(raw []byte) (string, error) {
	type panel struct {
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"` // a row's panels
	}
	var d struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return "", fmt.Errorf("dashboard: %w", err)
	}
	var b strings.Builder
	var walk func([]json.RawMessage) error
	walk = func(ps []json.RawMessage) error {
		for _, r := range ps {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				return fmt.Errorf("panel: %w", err)
			}
			for _, tg := range p.Targets {
				b.WriteString(tg.Expr + "\n")
			}
			if err := walk(p.Panels); err != nil {
				return err
			}
		}
		return nil
	}
	err := walk(d.Panels)
	return b.String(), err
}

// Every metric the forwarder exports has an alert rule and a dashboard
// panel, and the rules and the dashboard name no forwarder metric it does
// not export: a metric renamed here fails until the operator files follow.
func TestOpsFilesNameForwarderMetrics(t *testing.T) {
	families, err := NewMetrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var exported []string
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "notifyedge_forward_") {
			exported = append(exported, f.GetName())
		}
	}
	if len(exported) < 4 {
		t.Fatalf("forwarder exports %v: fewer than the 4 documented", exported)
	}
	for file, used := range map[string]func([]byte) (string, error){
		"notifyedge-rules.yml":      rulesWithoutComments,
		"notifyedge-dashboard.json": dashboardQueries,
	} {
		raw, err := os.ReadFile(filepath.Join(opsDir, file))
		if err != nil {
			t.Fatal(err)
		}
		text, err := used(raw)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		named := forwardMetricName.FindAllString(text, -1)
		for _, n := range exported {
			if !slices.Contains(named, n) {
				t.Errorf("%s does not use %s", file, n)
			}
		}
		for _, n := range named {
			if !slices.Contains(exported, n) {
				t.Errorf("%s names %s, which the forwarder does not export", file, n)
			}
		}
	}
}
