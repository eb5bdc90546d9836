package edge_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/edge/channel"
)

// money is an order's money columns as stored.
type money struct {
	status   string
	paidBy   string
	refunded int64
}

func (b *bundle) money(t *testing.T, orderNo string) money {
	t.Helper()
	var m money
	var paidBy *string
	if err := b.db.QueryRow(t.Context(), `SELECT status, paid_by, refunded_amount FROM biz_order WHERE order_no = $1`, orderNo).
		Scan(&m.status, &paidBy, &m.refunded); err != nil {
		t.Fatal(err)
	}
	if paidBy != nil {
		m.paidBy = *paidBy
	}
	return m
}

func (b *bundle) checkInvariants(t *testing.T) {
	t.Helper()
	if err := durabletest.Invariants(t.Context(), b.db, "", nil); err != nil {
		t.Error(err)
	}
}

func wxRefund(txn, orderNo, refundID string, total, refund int64, status string) wxTxn {
	return wxTxn{"mchid": "1900000109", "out_trade_no": orderNo, "transaction_id": txn, "out_refund_no": "M" + refundID,
		"refund_id": refundID, "refund_status": status, "success_time": "2026-12-03T10:34:56+08:00",
		"user_received_account": "招商银行信用卡0403",
		"amount":                map[string]any{"total": total, "refund": refund, "payer_total": total, "payer_refund": refund}}
}

// WeChat Pay: a partial refund, then the final one; an abnormal refund.
func TestWeChatPayRefunds(t *testing.T) {
	signer, _ := wechatSigner(t)
	b := setup(t, options{channels: []channel.Channel{wechatChannel(t, signer)}})
	now := time.Now()
	send := func(event string, res wxTxn) reply {
		t.Helper()
		h, body, err := signer.Notify(event, res, now)
		if err != nil {
			t.Fatal(err)
		}
		return b.sendWx(t, h, body)
	}
	b.order(t, "WXR-1", durable.PendingPay, 1999)
	if r := send("TRANSACTION.SUCCESS", wxTransaction("4200009001", "WXR-1", 1999)); r.status != 200 || r.body != "" {
		t.Fatalf("payment: %+v", r)
	}
	// Partial: 500 of 1999. The order stays PAID.
	partial := wxRefund("4200009001", "WXR-1", "50000000382019052709700001", 1999, 500, "SUCCESS")
	if r := send("REFUND.SUCCESS", partial); r.status != 200 || r.body != "" {
		t.Fatalf("partial refund: %+v", r)
	}
	if m := b.money(t, "WXR-1"); m != (money{"PAID", "wx:4200009001", 500}) {
		t.Errorf("after the partial refund: %+v", m)
	}
	// The same refund again (a new envelope and signature): a replay.
	if r := send("REFUND.SUCCESS", partial); r.status != 200 || !r.replayed {
		t.Errorf("partial refund again: %+v", r)
	}
	// The rest: REFUNDED.
	if r := send("REFUND.SUCCESS", wxRefund("4200009001", "WXR-1", "50000000382019052709700002", 1999, 1499, "SUCCESS")); r.status != 200 {
		t.Fatalf("final refund: %+v", r)
	}
	if m := b.money(t, "WXR-1"); m != (money{"REFUNDED", "wx:4200009001", 1999}) {
		t.Errorf("after the final refund: %+v", m)
	}
	for topic, want := range map[string]int{"ORDER_PAID": 1, "ORDER_PARTIALLY_REFUNDED": 1, "ORDER_REFUNDED": 1} {
		if n := b.count(t, `SELECT count(*) FROM outbox WHERE order_no = 'WXR-1' AND topic = $1`, topic); n != want {
			t.Errorf("%s rows %d, want %d", topic, n, want)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM trade_refund WHERE trade = 'wx:4200009001'`); n != 2 {
		t.Errorf("trade_refund rows %d, want 2", n)
	}

	// A refund that failed at the bank: acknowledged (WeChat stops
	// retrying), nothing moves, and a human is told, with the decrypted
	// refund in the review row.
	b.order(t, "WXR-2", durable.PendingPay, 800)
	send("TRANSACTION.SUCCESS", wxTransaction("4200009002", "WXR-2", 800))
	r := send("REFUND.ABNORMAL", wxRefund("4200009002", "WXR-2", "50000000382019052709700003", 800, 800, "ABNORMAL"))
	if r.status != 200 || r.body != "" {
		t.Fatalf("abnormal refund: %+v", r)
	}
	if m := b.money(t, "WXR-2"); m != (money{"PAID", "wx:4200009002", 0}) {
		t.Errorf("after an abnormal refund: %+v", m)
	}
	var raw string
	if err := b.db.QueryRow(t.Context(), `SELECT raw_body FROM notify_review WHERE reason = 'REFUND_FAILED' AND order_no = 'WXR-2'`).Scan(&raw); err != nil {
		t.Fatalf("REFUND_FAILED review row: %v", err)
	}
	var env struct {
		Resource map[string]any `json:"resource"`
	}
	if err := json.Unmarshal([]byte(raw), &env); err != nil || env.Resource["refund_id"] != "50000000382019052709700003" || strings.Contains(raw, "ciphertext") {
		t.Errorf("review raw_body must hold the decrypted refund, not the ciphertext: %s", raw)
	}
	b.checkInvariants(t)
}

func aliRefund(tradeNo, orderNo, total, bizNo, refundFee, status string) map[string]string {
	p := aliParams(tradeNo, orderNo, total, status)
	p["out_biz_no"], p["refund_fee"], p["gmt_refund"] = bizNo, refundFee, "2026-12-03 10:34:56.789"
	return p
}

// Alipay: partial refunds (refund_fee is the trade's refunded total so
// far) out of order and twice, the full refund by TRADE_CLOSED, and the
// close of a trade that never paid the order.
func TestAlipayRefundsAndCloses(t *testing.T) {
	signer, _ := alipaySigner()
	wx, _ := wechatSigner(t)
	b := setup(t, options{channels: []channel.Channel{alipayChannel(t, signer), wechatChannel(t, wx)}})
	ok := func(r reply) bool { return r.status == 200 && r.body == "success" }

	// A partial refund: trade_status stays TRADE_SUCCESS.
	b.order(t, "ALR-1", durable.PendingPay, 1999)
	if r := b.sendAli(t, signer, aliParams("2026120322001", "ALR-1", "19.99", "TRADE_SUCCESS")); !ok(r) {
		t.Fatalf("payment: %+v", r)
	}
	if r := b.sendAli(t, signer, aliRefund("2026120322001", "ALR-1", "19.99", "RF-1", "5.00", "TRADE_SUCCESS")); !ok(r) || r.replayed {
		t.Fatalf("partial refund answered as %+v (a replay of the payment?)", r)
	}
	if m := b.money(t, "ALR-1"); m != (money{"PAID", "ali:2026120322001", 500}) {
		t.Errorf("after the partial refund: %+v", m)
	}

	// Two partial refunds out of order, each twice: RF-B (total 12.00)
	// lands before RF-A (total 5.00).
	b.order(t, "ALR-2", durable.PendingPay, 1999)
	b.sendAli(t, signer, aliParams("2026120322002", "ALR-2", "19.99", "TRADE_SUCCESS"))
	for range 2 {
		if r := b.sendAli(t, signer, aliRefund("2026120322002", "ALR-2", "19.99", "RF-B", "12.00", "TRADE_SUCCESS")); !ok(r) {
			t.Fatalf("RF-B: %+v", r)
		}
		if r := b.sendAli(t, signer, aliRefund("2026120322002", "ALR-2", "19.99", "RF-A", "5.00", "TRADE_SUCCESS")); !ok(r) {
			t.Fatalf("RF-A: %+v", r)
		}
	}
	if m := b.money(t, "ALR-2"); m != (money{"PAID", "ali:2026120322002", 1200}) {
		t.Errorf("after two partial refunds out of order: %+v, want 1200 refunded", m)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE order_no = 'ALR-2' AND topic = 'ORDER_PARTIALLY_REFUNDED'`); n != 1 {
		t.Errorf("ORDER_PARTIALLY_REFUNDED rows %d, want 1 (one increase)", n)
	}

	// The full refund by TRADE_CLOSED of the paying trade.
	if r := b.sendAli(t, signer, aliParams("2026120322002", "ALR-2", "19.99", "TRADE_CLOSED")); !ok(r) {
		t.Fatalf("TRADE_CLOSED after the partial refunds: %+v", r)
	}
	if m := b.money(t, "ALR-2"); m != (money{"REFUNDED", "ali:2026120322002", 1999}) {
		t.Errorf("after TRADE_CLOSED of the paying trade: %+v", m)
	}

	// The close of an abandoned attempt: the buyer opened Alipay's cashier,
	// then paid with WeChat. The order stays PAID and nothing is refunded.
	b.order(t, "ALR-3", durable.PendingPay, 1999)
	h, body, err := wx.Notify("TRANSACTION.SUCCESS", wxTransaction("4200009003", "ALR-3", 1999), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if r := b.sendWx(t, h, body); r.status != 200 {
		t.Fatalf("WeChat payment: %+v", r)
	}
	if r := b.sendAli(t, signer, aliParams("2026120322003", "ALR-3", "19.99", "TRADE_CLOSED")); !ok(r) {
		t.Fatalf("close of the abandoned Alipay trade: %+v", r)
	}
	if m := b.money(t, "ALR-3"); m != (money{"PAID", "wx:4200009003", 0}) {
		t.Errorf("after Alipay closed a trade that did not pay: %+v", m)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE order_no = 'ALR-3' AND topic = 'ORDER_REFUNDED'`); n != 0 {
		t.Errorf("ORDER_REFUNDED emitted for an order nobody refunded")
	}
	b.checkInvariants(t)
}

// The generic channel's refund fields.
func TestGenericRefundFields(t *testing.T) {
	b := setup(t, options{})
	b.order(t, "GR-1", durable.PendingPay, 1999)
	b.post(t, body("T-gr1", "PAY_SUCCESS", "GR-1", 1999))
	refund := func(id string, amount int) string {
		return `{"channel_txn_id":"T-gr1","event_type":"REFUND_SUCCESS","order_no":"GR-1","amount":1999,"currency":"CNY","refund_id":"` +
			id + `","refund_amount":` + strconv.Itoa(amount) + `}`
	}
	if r := b.post(t, refund("RF-1", 500)); r.status != 200 || r.body != `{"code":"SUCCESS","outcome":"applied","status":"PAID"}` {
		t.Errorf("partial refund: %d %s", r.status, r.body)
	}
	if r := b.post(t, refund("RF-2", 1600)); r.status != 422 || !strings.Contains(r.body, `"refund_exceeds"`) {
		t.Errorf("refund beyond what was paid: %d %s", r.status, r.body)
	}
	if r := b.post(t, refund("RF-2", 1499)); r.status != 200 || r.body != `{"code":"SUCCESS","outcome":"applied","status":"REFUNDED"}` {
		t.Errorf("final refund: %d %s", r.status, r.body)
	}
	before := b.counts(t)
	for name, p := range map[string]string{
		"refund_amount without refund_id": `{"channel_txn_id":"T","event_type":"REFUND_SUCCESS","order_no":"GR-1","amount":1999,"currency":"CNY","refund_amount":5}`,
		"refund_amount over amount":       `{"channel_txn_id":"T","event_type":"REFUND_SUCCESS","order_no":"GR-1","amount":1999,"currency":"CNY","refund_id":"R","refund_amount":2000}`,
		"refund_id on a payment":          `{"channel_txn_id":"T","event_type":"PAY_SUCCESS","order_no":"GR-1","amount":1999,"currency":"CNY","refund_id":"R"}`,
		"refund_amount zero":              `{"channel_txn_id":"T","event_type":"REFUND_SUCCESS","order_no":"GR-1","amount":1999,"currency":"CNY","refund_id":"R","refund_amount":0}`,
	} {
		if r := b.post(t, p); r.status != 400 {
			t.Errorf("%s: %d %s, want 400", name, r.status, r.body)
		}
	}
	if after := b.counts(t); after.claims != before.claims || after.outbox != before.outbox {
		t.Errorf("a refused body stored something: %+v -> %+v", before, after)
	}
	b.checkInvariants(t)
}
