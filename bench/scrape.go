package bench

import (
	"fmt"
	"io"
	"net/http"
	"strings"
)

// What the edge's /metrics says about a run: its outcome and group-commit
// counts, before and after.

// edgeCounts is what the bench reads of the edge's counters: answers by
// outcome, and group commit's batches and deliveries by how they were
// decided.
type edgeCounts struct{ outcomes, group map[string]int }

// scrapeCounts reads the notifyedge_requests_total and
// notifyedge_group_* lines of the /metrics page at admin (our own edge's
// admin listener, or the deployment's).
func scrapeCounts(admin string) edgeCounts {
	out := edgeCounts{outcomes: map[string]int{}, group: map[string]int{}}
	if admin == "" {
		return out
	}
	resp, err := http.Get(strings.TrimSuffix(admin, "/") + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		// name{labels} value: a label's value may hold a space, the value
		// does not.
		i := strings.LastIndexByte(line, ' ')
		if i < 0 || strings.HasPrefix(line, "#") {
			continue
		}
		name := line[:i]
		var n float64
		fmt.Sscan(line[i+1:], &n)
		switch family, labels, _ := strings.Cut(name, "{"); family {
		case "notifyedge_requests_total":
			out.outcomes[labelValue(labels, "outcome")] += int(n)
		case "notifyedge_group_batches_total":
			out.group["batches"] += int(n)
		case "notifyedge_group_deliveries_total":
			out.group[labelValue(labels, "how")] += int(n)
		}
	}
	return out
}

// labelValue returns label's value in a sample's label list (`a="x",b="y"}`).
func labelValue(labels, label string) string {
	_, after, _ := strings.Cut(labels, label+`="`)
	v, _, _ := strings.Cut(after, `"`)
	return v
}

func diff(after, before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}
