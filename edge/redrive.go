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
	return s.DecideStored(ctx, redriveAuthority{s.auth()}, channelName, body, false)
}

// ReviewStored opens a review row of reason for a stored delivery (a
// channel's verified answer to a query), keyed and digested through the
// channel's adapter exactly as the trade's callback would be, and decides
// nothing: one open row per key, digest and reason, however often it is
// asked. A delivery the adapter refuses opens nothing and is an error.
func (s *Server) ReviewStored(ctx context.Context, a Authority, channelName string, body []byte, reason durable.ReviewReason) error {
	x, rej, err := s.mapStored(channelName, body)
	if err != nil {
		return fmt.Errorf("review stored delivery: %w", err)
	}
	defer putExchange(x)
	if rej != nil {
		return fmt.Errorf("review stored delivery: the channel's adapter refused it: %s", rej.Message)
	}
	if err := a.RecordReview(ctx, s.notification(x), reason); err != nil {
		return fmt.Errorf("review %s: %w", x.d.Key, err)
	}
	return nil
}

// mapStored maps a stored delivery through channelName's adapter
// (Channel.Redrive: mapping, key, digest, merchant checks, no
// authentication) into an exchange the caller returns with putExchange;
// rej is the adapter's refusal. An unknown channel is an error (and no
// exchange).
func (s *Server) mapStored(channelName string, body []byte) (x *exchange, rej *channel.Reject, err error) {
	ch, ok := (*s.channels.Load())[channelName]
	if !ok {
		return nil, nil, fmt.Errorf("%w: %s", ErrNoChannel, channelName)
	}
	x = getExchange()
	x.channel = ch
	x.req.Body = body
	return x, ch.Redrive(body, &x.d), nil
}

// redriveAuthority decides through its Authority, naming the path a
// re-drive in the outbox payload ("via").
type redriveAuthority struct{ Authority }

func (r redriveAuthority) Process(ctx context.Context, n durable.Notification) (durable.Result, error) {
	n.Via = durable.ViaRedrive
	return r.Authority.Process(ctx, n)
}

// DecideStored decides a delivery that did not come as a request (a review
// row's body, or one built from a channel's verified answer to a query)
// through the channel's adapter (Channel.Redrive: mapping, key, digest,
// merchant checks, no authentication) and the authority a. A merchant
// mismatch opens a review row when review is true, as a callback's does;
// a review row's own body is not recorded twice. The cache is left alone:
// the result reaches it with the next duplicate, through Postgres.
func (s *Server) DecideStored(ctx context.Context, a Authority, channelName string, body []byte, review bool) (channel.Verdict, Outcome, error) {
	x, rej, err := s.mapStored(channelName, body)
	if err != nil {
		return channel.Verdict{}, OutcomeUnknownChannel, fmt.Errorf("decide stored delivery: %w", err)
	}
	defer putExchange(x)
	if rej != nil {
		o := rejectOutcome(rej.Kind)
		if o == OutcomeMerchantMismatch && review {
			if err := a.RecordReview(ctx, s.notification(x), durable.ReviewMerchantMismatch); err != nil {
				return channel.Verdict{}, OutcomeUnavailable, fmt.Errorf("review %s: %w", x.d.Key, err)
			}
		}
		return failVerdict(o, "", rej.Message), o, nil
	}
	res, err := a.Process(ctx, s.notification(x))
	if err != nil {
		return channel.Verdict{}, OutcomeUnavailable, fmt.Errorf("decide %s: %w", x.d.Key, err)
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
