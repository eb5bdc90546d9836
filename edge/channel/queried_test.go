package channel_test

import (
	"encoding/json"
	"testing"

	"github.com/notifyedge/notifyedge/edge/channel"
)

// A delivery built from WeChat's order query decides as the trade's
// TRANSACTION.SUCCESS callback does: same key, same digest. REFUND (paid,
// then refunded) counts as paid only in a query's answer; a callback never
// carries it, and an unpaid state is never a payment.
func TestWeChatQueriedMapsAsTheCallback(t *testing.T) {
	wx, ch, _, _, now := channels(t)
	txn := map[string]any{"mchid": "1900000109", "appid": "wx1", "out_trade_no": "O-Q-1", "transaction_id": "4200009999",
		"trade_state": "SUCCESS", "amount": map[string]any{"total": 1999, "currency": "CNY"}}
	h, body, err := wx.Notify("TRANSACTION.SUCCESS", txn, now)
	if err != nil {
		t.Fatal(err)
	}
	var cb channel.Delivery
	if rej := ch.Parse(&channel.Request{Channel: []byte("wx"), ContentType: []byte("application/json"), Body: body, Header: headerMap(h)}, &cb); rej != nil {
		t.Fatal(rej)
	}
	queried := func(state string) []byte {
		txn["trade_state"] = state
		b, _ := json.Marshal(map[string]any{"event_type": channel.WeChatQueriedEvent, "resource": txn})
		return b
	}
	for _, state := range []string{"SUCCESS", "REFUND"} {
		var q channel.Delivery
		if rej := ch.Redrive(queried(state), &q); rej != nil {
			t.Fatalf("%s: %v", state, rej)
		}
		if string(q.Key) != string(cb.Key) || q.Digest != cb.Digest {
			t.Fatalf("%s: queried %s %s, callback %s %s", state, q.Key, q.Digest[:8], cb.Key, cb.Digest[:8])
		}
	}
	for _, state := range []string{"NOTPAY", "CLOSED", "USERPAYING", "PAYERROR", "REVOKED"} {
		var q channel.Delivery
		if rej := ch.Redrive(queried(state), &q); rej == nil || rej.Kind != channel.BadRequest {
			t.Fatalf("%s mapped as a payment: %v", state, rej)
		}
	}
	// A callback that says REFUND under TRANSACTION.SUCCESS is not a shape
	// WeChat sends: refused as before.
	txn["trade_state"] = "REFUND"
	h, body, _ = wx.Notify("TRANSACTION.SUCCESS", txn, now)
	var d channel.Delivery
	if rej := ch.Parse(&channel.Request{Channel: []byte("wx"), ContentType: []byte("application/json"), Body: body, Header: headerMap(h)}, &d); rej == nil {
		t.Fatal("a TRANSACTION.SUCCESS callback with trade_state REFUND was accepted")
	}
}
