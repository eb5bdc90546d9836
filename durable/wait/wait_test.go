package wait_test

import (
	"context"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable/wait"
)

func TestSleep(t *testing.T) {
	if !wait.Sleep(context.Background(), time.Millisecond) {
		t.Error("a wait whose context lives did not pass")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if wait.Sleep(ctx, time.Hour) {
		t.Error("a wait whose context ended passed")
	}
	if time.Since(start) > time.Minute {
		t.Error("a wait whose context ended did not return at once")
	}
	if wait.Sleep(ctx, 0) {
		t.Error("a zero wait on an ended context passed")
	}
}
