package bench

import (
	"os"
	"testing"
)

// The stack's edge and relay run as this test binary re-executed
// (ChildMain): it must serve them before any test runs.
func TestMain(m *testing.M) {
	ChildMain()
	os.Exit(m.Run())
}
