package bench

import (
	"math"
	"runtime"
	"testing"
)

// The row at 80 % of the peak says how busy the machine was: its CPU per
// request times the requests a second, over all the machine's cores.
func TestGroupRatiosSayHowBusyTheMachineWas(t *testing.T) {
	us := func(v float64) *float64 { return &v }
	r := &Report{Rows: []Row{
		{Name: "first", ReqPerSec: 4000, CPU: CPUCost{Machine: us(400)}},
		{Name: nameFirstAlone, ReqPerSec: 2000, CPU: CPUCost{Machine: us(1000)}},
		{Name: "first at 80% of peak", ReqPerSec: 3200, CPU: CPUCost{Machine: us(500)}},
	}}
	want := 500 * 3200 / (float64(runtime.NumCPU()) * 1e6)
	for _, x := range r.groupRatios() {
		if x.Name == "first at 80% of the group peak: machine busy (share of its cores)" {
			if math.Abs(x.Value-want) > 1e-9 {
				t.Fatalf("machine busy %v, want %v", x.Value, want)
			}
			return
		}
	}
	t.Fatalf("no machine-busy ratio in %+v", r.groupRatios())
}
