package bill_test

import (
	"bytes"
	"testing"

	"github.com/notifyedge/notifyedge/edge/reconcile/bill"
	"github.com/notifyedge/notifyedge/edge/reconcile/bill/billtest"
)

// checkRead reads r to its end and checks what a caller relies on: every
// row returned has ids and a positive amount, and a bill read to io.EOF
// adds up to its totals.
func checkRead(t *testing.T, r bill.Reader) {
	rows, err := readAll(r)
	var sum bill.Totals
	for _, row := range rows {
		if row.Trade == "" || row.OrderNo == "" || row.Amount <= 0 || (row.Kind == bill.Refund) != (row.RefundID != "") {
			t.Fatalf("a row a caller cannot use: %+v", row)
		}
		switch row.Kind {
		case bill.Payment:
			sum.Payments++
			sum.Paid += row.Amount
		case bill.Refund:
			sum.Refunds++
			sum.Refunded += row.Amount
		default:
			t.Fatalf("kind %v", row.Kind)
		}
		sum.Fees += row.Fee
	}
	if err == nil && sum != r.Totals() {
		t.Fatalf("rows add up to %+v, Totals says %+v", sum, r.Totals())
	}
}

func FuzzWeChatBill(f *testing.F) {
	f.Add(billtest.WeChatBill(sample, true))
	f.Add(billtest.WeChatBill(nil, false))
	f.Add(skewedWeChat(7))
	f.Add([]byte("总交易单数\n`0\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkRead(t, bill.NewWeChat(bytes.NewReader(b)))
	})
}

func FuzzAlipayBill(f *testing.F) {
	f.Add(billtest.AlipayCSV(sample, "2088123412341234", "2026-12-05"))
	f.Add(billtest.AlipayCSV(nil, "2088123412341234", "2026-12-05"))
	f.Add([]byte("#交易合计：0笔\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkRead(t, bill.NewAlipay(bytes.NewReader(b)))
	})
}

func FuzzAlipayZip(f *testing.F) {
	f.Add(billtest.AlipayZip(billtest.AlipayCSV(sample, "2088123412341234", "2026-12-05"), "2088123412341234", "2026-12-05"))
	f.Fuzz(func(t *testing.T, b []byte) {
		rc, _, err := bill.OpenAlipayZip(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		defer rc.Close()
		checkRead(t, bill.NewAlipay(rc))
	})
}
