//go:build !race

package channel_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/valyala/fasthttp"
)

// The adapter's verify+parse+key+digest must not allocate: it runs for
// every request, duplicates included.
func TestGenericParseDoesNotAllocate(t *testing.T) {
	now := time.Now()
	g, err := channel.NewGeneric(channel.GenericConfig{Name: "acme", Secrets: []string{fuzzSecret}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"channel_txn_id":"4200001234202612020000001","event_type":"PAY_SUCCESS","order_no":"O202612020001","amount":1999,"currency":"CNY","extra":{"k":[1,"two"]}}`)
	sig, _ := channel.SignWebhook(fuzzSecret, "msg_1", now.Unix(), body)
	// The production header type: its PeekAll reuses one buffer.
	var h fasthttp.RequestHeader
	h.Set("webhook-id", "msg_1")
	h.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	h.Set("webhook-signature", "v1,AAAA "+sig)
	req := channel.Request{Channel: []byte("acme"), ContentType: []byte("application/json; charset=utf-8"), Body: body, Header: &h}
	var d channel.Delivery
	if rej := g.Parse(&req, &d); rej != nil {
		t.Fatal(rej)
	}
	allocs := testing.AllocsPerRun(200, func() {
		d.Reset()
		if rej := g.Parse(&req, &d); rej != nil {
			t.Fatal(rej)
		}
	})
	if allocs != 0 {
		t.Errorf("Parse allocates %v times per request, want 0", allocs)
	}
}
