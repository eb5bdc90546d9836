package edge

import (
	"context"
	"errors"
	"fmt"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge/channel"
)

// ErrNoChannel: a stored delivery names a channel this node does not have.
var ErrNoChannel = errors.New("edge: channel not configured")

// Redrive decides a delivery held in a review row again, through the
// channel's adapter and the authority, as the callback that brought it was
// decided: the same mapping, key, digest and decision. Its authenticity was
// checked when it arrived, and its timestamp is not checked again: a
// re-drive happens after the channel stopped retrying, hours or days later,
// by an operator who fixed the cause. The cache is left alone: a re-driven
// result reaches it with the next duplicate, through Postgres.
func (s *Server) Redrive(ctx context.Context, channelName string, body []byte) (channel.Verdict, Outcome, error) {
	ch, ok := (*s.channels.Load())[channelName]
	if !ok {
		return channel.Verdict{}, OutcomeUnknownChannel, fmt.Errorf("redrive: %w: %s", ErrNoChannel, channelName)
	}
	x := getExchange()
	defer putExchange(x)
	x.channel = ch
	x.req.Body = body
	if rej := ch.Redrive(body, &x.d); rej != nil {
		o := rejectOutcome(rej.Kind)
		return failVerdict(o, "", rej.Message), o, nil
	}
	res, err := s.auth().Process(ctx, s.notification(x))
	if err != nil {
		return channel.Verdict{}, OutcomeUnavailable, fmt.Errorf("redrive %s: %w", x.d.Key, err)
	}
	if res.Outcome.Done() {
		o := OutcomeApplied
		switch {
		case res.Replayed:
			o = OutcomeReplayedDB
		case res.Outcome == durable.Skipped:
			o = OutcomeSkipped
		}
		return doneVerdict(res.Outcome, res.Status), o, nil
	}
	o := durableOutcome(res.Outcome)
	return failVerdict(o, res.Status, ""), o, nil
}
