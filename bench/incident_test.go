package bench

import (
	"context"
	"testing"
)

// Point 4: the demo in a small configuration. The counts come from the
// tables, not from printed text.
func TestIncidentNaiveDoubleShipsNotifyedgeDoesNot(t *testing.T) {
	rep, err := RunIncident(context.Background(), IncidentConfig{Orders: 60, Workers: 12})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.Table())
	if rep.Naive.ShippedTwice == 0 {
		t.Error("the naive baseline did not reproduce the incident's double shipments")
	}
	if rep.NotifyEdge.ShippedTwice != 0 || rep.NotifyEdge.Shipments != 60 || rep.NotifyEdge.OrdersShipped != 60 {
		t.Errorf("notifyedge: %+v, want 60 orders shipped once each", rep.NotifyEdge)
	}
	if rep.NotifyEdge.Answers["applied"] != 60 || rep.NotifyEdge.Answers["replayed"] != 120 {
		t.Errorf("notifyedge answers %v, want 60 applied and 120 replayed", rep.NotifyEdge.Answers)
	}
}
