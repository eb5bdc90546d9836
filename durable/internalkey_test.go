package durable_test

import (
	"strings"
	"testing"

	"github.com/notifyedge/notifyedge/durable"
)

// Internal keys are unambiguous: two different (order, request id) pairs
// never share a key, whatever characters they hold, and the longest pair
// fits the claim key's column.
func TestInternalKeyUnambiguous(t *testing.T) {
	parts := []string{"K", "K-1", "K-1:wms", "wms", "wms:7781", "7781", ":", "::", "1:", "3:K-1", "@orders:", "a:b:c", "9", "10:x"}
	seen := map[string][2]string{}
	for _, o := range parts {
		for _, r := range parts {
			k := durable.InternalKey(o, r)
			if prev, ok := seen[k]; ok {
				t.Errorf("%q/%q and %q/%q share the key %q", prev[0], prev[1], o, r, k)
			}
			seen[k] = [2]string{o, r}
		}
	}
	if k := durable.InternalKey(strings.Repeat("~", 64), strings.Repeat("~", 64)); len(k) > 160 {
		t.Errorf("the longest internal key has %d bytes, the column holds 160", len(k))
	}
}
