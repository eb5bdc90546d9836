// Package wait holds the one sleep the background loops use: a wait that
// ends early when its context does. It imports nothing of the project, so
// every package (the forwarder's, which links no Postgres client,
// included) may use it.
package wait

import (
	"context"
	"time"
)

// Sleep waits d, or less when ctx ends first; it reports whether the whole
// d passed. A d of 0 or less returns at once.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
