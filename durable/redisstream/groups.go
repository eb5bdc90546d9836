package redisstream

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// behindCap bounds the count of a group's unread entries when Redis cannot
// say it (XINFO GROUPS's lag is unknown once entries were deleted from
// past the group's position, which the relay and the forwarder never do):
// the count reads at most this many entries, so the figure is then "at
// least".
const behindCap = 1000

// Backlog is what the stream holds for its consumer groups: its length, and
// for each group the entries it has not read or has read and not
// acknowledged. Since no such entry is ever trimmed, a group that stops
// reading holds the stream's memory.
type Backlog struct {
	Entries int64
	Behind  map[string]int64
}

// Backlog reads the stream's length and each group's entries behind: its
// pending ones plus its lag (counted up to behindCap when Redis does not
// know the lag). A stream that does not exist yet has none.
func (p *Publisher) Backlog(ctx context.Context) (Backlog, error) {
	b := Backlog{Behind: map[string]int64{}}
	n, err := p.client.XLen(ctx, p.stream).Result()
	if err != nil {
		return b, fmt.Errorf("xlen %s: %w", p.stream, err)
	}
	b.Entries = n
	groups, err := p.client.XInfoGroups(ctx, p.stream).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return b, nil
		}
		return b, fmt.Errorf("xinfo groups %s: %w", p.stream, err)
	}
	for _, g := range groups {
		lag := g.Lag
		if lag < 0 {
			unread, err := p.client.XRangeN(ctx, p.stream, "("+g.LastDeliveredID, "+", behindCap).Result()
			if err != nil && err != redis.Nil {
				return b, fmt.Errorf("xrange %s after %s: %w", p.stream, g.LastDeliveredID, err)
			}
			lag = int64(len(unread))
		}
		b.Behind[g.Name] = g.Pending + lag
	}
	return b, nil
}
