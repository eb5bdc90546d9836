package edge_test

import (
	"slices"
	"testing"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge/channel"
)

// The adapters name events on their own (edge/channel does not import
// durable): exactly the events durable takes from a channel.
func TestChannelEventsAreDurables(t *testing.T) {
	var fromDurable []string
	for _, e := range durable.Events {
		if _, ok := durable.ParseChannelEvent([]byte(e)); ok {
			fromDurable = append(fromDurable, string(e))
		}
	}
	got := slices.Sorted(slices.Values(channel.Events))
	slices.Sort(fromDurable)
	if !slices.Equal(got, fromDurable) {
		t.Errorf("edge/channel delivers %v, durable takes %v from a channel", got, fromDurable)
	}
}
