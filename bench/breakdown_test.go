package bench

import (
	"strings"
	"testing"
)

func TestParseCommandStats(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_set:calls=200,usec=900,usec_per_call=4.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_evalsha:calls=100,usec=1600,usec_per_call=16.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=3,usec=300,usec_per_call=100.00,rejected_calls=0,failed_calls=0\r\n"
	got := parseCommandStats(info, 100)
	if len(got) != 2 {
		t.Fatalf("got %d commands, want 2 (info left out): %+v", len(got), got)
	}
	// Most time first.
	if got[0].Name != "evalsha" || got[0].CallsPerReq != 1 || got[0].MicrosPerReq != 16 || got[0].MicrosPerCall != 16 {
		t.Errorf("first: %+v, want evalsha 1 call 16 µs per request", got[0])
	}
	if got[1].Name != "set" || got[1].CallsPerReq != 2 || got[1].MicrosPerReq != 9 || got[1].MicrosPerCall != 4.5 {
		t.Errorf("second: %+v, want set 2 calls 9 µs per request", got[1])
	}
	var b strings.Builder
	writeBreakdowns(&b, []Row{{Name: "first", Breakdown: &Breakdown{Redis: got}}})
	if !strings.Contains(b.String(), "evalsha") || !strings.Contains(b.String(), `Where "first"`) {
		t.Errorf("table:\n%s", b.String())
	}
}
