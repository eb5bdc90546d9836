package query

import (
	"encoding/json"
	"fmt"
	"net/url"
)

// A statement's row that the ledger lacks is decided as its callback would
// be: these build the stored deliveries the channels' adapters map as the
// callback of the same payment or refund (channel.Channel.Redrive): same
// key, same digest, same merchant checks, so that a callback arriving
// later is a replay.

// wechatBilled is a notification envelope whose resource is in clear.
type wechatBilled struct {
	ID           string `json:"id"`
	EventType    string `json:"event_type"`
	ResourceType string `json:"resource_type"`
	Summary      string `json:"summary"`
	Resource     any    `json:"resource"`
}

type wechatAmount struct {
	Total    int64  `json:"total"`
	Refund   int64  `json:"refund,omitempty"`
	Currency string `json:"currency,omitempty"`
}

// BillPayment is the stored delivery of a payment the statement shows:
// TRANSACTION.SUCCESS of trade for orderNo, total fen.
func (w *WeChat) BillPayment(trade, orderNo string, total int64) []byte {
	return mustJSON(wechatBilled{ID: "bill-" + trade, EventType: "TRANSACTION.SUCCESS", ResourceType: "bill-row",
		Summary: "the daily bill's row", Resource: map[string]any{
			"mchid": w.cfg.MchID, "out_trade_no": orderNo, "transaction_id": trade, "trade_state": "SUCCESS",
			"amount": wechatAmount{Total: total, Currency: "CNY"},
		}})
}

// BillRefund is the stored delivery of a refund the statement shows:
// REFUND.SUCCESS of trade keyed by refundID, refund fen of total (a
// refund's callback carries no currency; refundedTotal is not WeChat's
// concern: each refund names its own amount).
func (w *WeChat) BillRefund(trade, orderNo, refundID string, total, refund, refundedTotal int64) []byte {
	return mustJSON(wechatBilled{ID: "bill-" + refundID, EventType: "REFUND.SUCCESS", ResourceType: "bill-row",
		Summary: "the daily bill's row", Resource: map[string]any{
			"mchid": w.cfg.MchID, "out_trade_no": orderNo, "transaction_id": trade, "refund_id": refundID,
			"refund_status": "SUCCESS", "amount": wechatAmount{Total: total, Refund: refund},
		}})
}

// BillPayment is the stored delivery of a payment the statement shows:
// the form of a TRADE_SUCCESS notification of trade.
func (a *Alipay) BillPayment(trade, orderNo string, total int64) []byte {
	return []byte(a.billForm(trade, orderNo, total).Encode())
}

// BillRefund is the stored delivery of a refund the statement shows: the
// form of a refund notification keyed by refundID (out_biz_no), whose
// refund_fee is the trade's refunded total with this refund
// (refundedTotal), as Alipay states it.
func (a *Alipay) BillRefund(trade, orderNo, refundID string, total, refund, refundedTotal int64) []byte {
	form := a.billForm(trade, orderNo, total)
	form.Set("out_biz_no", refundID)
	form.Set("refund_fee", fen(refundedTotal))
	return []byte(form.Encode())
}

func (a *Alipay) billForm(trade, orderNo string, total int64) url.Values {
	form := url.Values{}
	form.Set("notify_type", "trade_bill")
	form.Set("trade_no", trade)
	form.Set("out_trade_no", orderNo)
	form.Set("trade_status", "TRADE_SUCCESS")
	form.Set("total_amount", fen(total))
	form.Set("app_id", a.cfg.AppID)
	if a.cfg.SellerID != "" {
		form.Set("seller_id", a.cfg.SellerID)
	}
	form.Set("charset", "utf-8")
	return form
}

// fen prints fen as yuan with two decimals.
func fen(n int64) string { return fmt.Sprintf("%d.%02d", n/100, n%100) }

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("BUG: " + err.Error())
	}
	return b
}
