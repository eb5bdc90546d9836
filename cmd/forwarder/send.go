package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/tracing"
)

// sender POSTs events as Standard Webhooks messages.
type sender struct {
	client *http.Client
	url    string
	secret string
}

// webhookID is the event's webhook-id: its event_id, unique across
// databases and environments and the same at every re-send; for an entry
// of a row written before event ids, the outbox id, as it was then.
func webhookID(m redisstream.Message) string {
	if m.EventID != "" {
		return m.EventID
	}
	return strconv.FormatInt(m.OutboxID, 10)
}

// post sends one event and returns nil on a 2xx. The timestamp is taken
// afresh for every attempt, so a retry after minutes is not refused as
// stale by a receiver that checks it.
func (s *sender) post(ctx context.Context, id, traceparent string, body []byte) error {
	ts := time.Now().Unix()
	sig, err := channel.SignWebhook(s.secret, id, ts, body)
	if err != nil {
		return fmt.Errorf("sign: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "notifyedge-forwarder")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", sig)
	if traceparent != "" {
		// The callback's trace: the receiver's spans can join it.
		req.Header.Set("traceparent", traceparent)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err // net/http strips a password from the URL it quotes
	}
	defer resp.Body.Close()
	// Read a little for the error message and the rest (bounded) so the
	// connection can be reused.
	head, _ := io.ReadAll(io.LimitReader(resp.Body, 128))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	// %q keeps a binary or multi-line answer on one log line.
	return fmt.Errorf("receiver answered %d: %q", resp.StatusCode, head)
}

// buildBody renders the Standard Webhooks payload shape
// {"type":<topic>,"timestamp":<occurred_at>,"data":{"event_id":..,
// "outbox_id":..,<the payload's fields>}}, the payload's fields with their
// bytes exactly as the outbox row holds them (its order_no among them).
// An entry of a row written before event ids and payload facts has
// "event_id":null and, for a timestamp, the time Redis took the entry.
func buildBody(m redisstream.Message) ([]byte, error) {
	payload := bytes.TrimSpace([]byte(m.Payload))
	var facts struct {
		OccurredAt string `json:"occurred_at"`
	}
	if len(payload) == 0 || payload[0] != '{' || json.Unmarshal(payload, &facts) != nil {
		return nil, fmt.Errorf("outbox id %d: payload is not a JSON object", m.OutboxID)
	}
	ts := facts.OccurredAt
	if ts == "" {
		ts = entryTime(m.StreamID).UTC().Format(time.RFC3339Nano)
	}
	topic, _ := json.Marshal(m.Topic)
	stamp, _ := json.Marshal(ts)
	event := []byte("null")
	if m.EventID != "" {
		event, _ = json.Marshal(m.EventID)
	}
	b := make([]byte, 0, 96+len(topic)+len(stamp)+len(event)+len(payload))
	b = append(b, `{"type":`...)
	b = append(b, topic...)
	b = append(b, `,"timestamp":`...)
	b = append(b, stamp...)
	b = append(b, `,"data":{"event_id":`...)
	b = append(b, event...)
	b = append(b, `,"outbox_id":`...)
	b = strconv.AppendInt(b, m.OutboxID, 10)
	if rest := bytes.TrimSpace(payload[1:]); len(rest) > 0 && rest[0] != '}' {
		b = append(b, ',')
		b = append(b, rest...)
	} else {
		b = append(b, '}')
	}
	b = append(b, '}')
	return b, nil
}

// decode reads the fields the relay writes (redisstream.Publisher).
func decode(xm redis.XMessage) (redisstream.Message, error) {
	str := func(k string) string { s, _ := xm.Values[k].(string); return s }
	id, err := strconv.ParseInt(str(redisstream.FieldOutboxID), 10, 64)
	if err != nil {
		return redisstream.Message{}, fmt.Errorf("entry %s: bad %s %q", xm.ID, redisstream.FieldOutboxID, str(redisstream.FieldOutboxID))
	}
	m := redisstream.Message{StreamID: xm.ID, OutboxID: id, EventID: str(redisstream.FieldEventID), Topic: str(redisstream.FieldTopic),
		OrderNo: str(redisstream.FieldOrderNo), Payload: str(redisstream.FieldPayload)}
	// Written again from what the W3C propagator parsed: anything that is
	// not a sampled traceparent is dropped, never sent on as a header.
	m.Traceparent = tracing.Traceparent(tracing.Parse(str(redisstream.FieldTraceparent)))
	if m.OrderNo == "" {
		return m, fmt.Errorf("entry %s: no %s", xm.ID, redisstream.FieldOrderNo)
	}
	return m, nil
}

// entryTime is the time in a stream id "ms-seq": Redis's clock at XADD.
func entryTime(id string) time.Time {
	ms, _, _ := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(n)
}
