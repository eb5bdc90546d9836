package query_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/reconcile/bill"
	"github.com/notifyedge/notifyedge/edge/reconcile/bill/billtest"
	"github.com/notifyedge/notifyedge/edge/reconcile/query"
	"github.com/notifyedge/notifyedge/edge/reconcile/query/querytest"
)

var dayRows = []bill.Row{
	{Kind: bill.Payment, Trade: "4200000001", OrderNo: "o-1", Amount: 1999, Fee: 12000},
	{Kind: bill.Refund, Trade: "4200000001", OrderNo: "o-1", RefundID: "50300001", Amount: 500, Fee: -3000},
}

// readStatement fetches date from b and reads it to its end.
func readStatement(t *testing.T, b query.Biller, date string) ([]bill.Row, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := b.Bill(ctx, date)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	var rows []bill.Row
	for {
		r, err := st.Next()
		if errors.Is(err, io.EOF) {
			return rows, nil
		}
		if err != nil {
			return rows, err
		}
		rows = append(rows, r)
	}
}

var sameRows = cmpopts.IgnoreFields(bill.Row{}, "Line", "Time", "TradeTotal")

func TestWeChatBill(t *testing.T) {
	env := newWeChat(t, false, nil)
	env.fake.SetBill("2026-12-05", querytest.Bill{File: billtest.WeChatBill(dayRows, true)})
	rows, err := readStatement(t, env.q, "2026-12-05")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(dayRows, rows, sameRows); d != "" {
		t.Errorf("rows (-want +got):\n%s", d)
	}

	// A day without trades is an empty statement; one not made yet is
	// not ready.
	env.fake.SetBill("2026-12-04", querytest.Bill{Status: "NO_STATEMENT_EXIST"})
	if rows, err := readStatement(t, env.q, "2026-12-04"); err != nil || len(rows) != 0 {
		t.Errorf("NO_STATEMENT_EXIST: %v, %v; want an empty statement", rows, err)
	}
	env.fake.SetBill("2026-12-03", querytest.Bill{Status: "STATEMENT_CREATING"})
	if _, err := readStatement(t, env.q, "2026-12-03"); !errors.Is(err, query.ErrNotReady) {
		t.Errorf("STATEMENT_CREATING: %v, want ErrNotReady", err)
	}

	// A file whose SHA-1 is not hash_value fails at its end, unverified.
	env.fake.SetBill("2026-12-02", querytest.Bill{File: billtest.WeChatBill(dayRows, false), Hash: "0000000000000000000000000000000000000000"})
	if _, err := readStatement(t, env.q, "2026-12-02"); !errors.Is(err, query.ErrUnverified) {
		t.Errorf("a wrong hash_value: %v, want ErrUnverified", err)
	}

	// A file that does not decompress is refused the same way.
	env.fake.SetBill("2026-12-01", querytest.Bill{File: billtest.WeChatBill(dayRows, false), Corrupt: true})
	if _, err := readStatement(t, env.q, "2026-12-01"); !errors.Is(err, query.ErrUnverified) {
		t.Errorf("a corrupt gzip: %v, want ErrUnverified", err)
	}

	// An answer with a broken signature is unverified, "no statement"
	// included (it must not stand for a day without trades).
	env.fake.SetBadSignature(true)
	if _, err := readStatement(t, env.q, "2026-12-05"); !errors.Is(err, query.ErrUnverified) {
		t.Errorf("a forged answer: %v, want ErrUnverified", err)
	}
	if _, err := readStatement(t, env.q, "2026-12-04"); !errors.Is(err, query.ErrUnverified) {
		t.Errorf("a forged NO_STATEMENT_EXIST: %v, want ErrUnverified", err)
	}
	env.fake.SetBadSignature(false)
	env.fake.SetDown(true)
	if _, err := readStatement(t, env.q, "2026-12-05"); err == nil || errors.Is(err, query.ErrUnverified) {
		t.Errorf("the channel down: %v, want a failure to fetch", err)
	}
}

func TestAlipayBill(t *testing.T) {
	env := newAlipay(t, false, nil)
	zip := billtest.AlipayZip(billtest.AlipayCSV(dayRows, "2088000000000001", "2026-12-05"), "2088000000000001", "2026-12-05")
	env.fake.SetBill("2026-12-05", querytest.Bill{File: zip})
	rows, err := readStatement(t, env.q, "2026-12-05")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(dayRows, rows, sameRows); d != "" {
		t.Errorf("rows (-want +got):\n%s", d)
	}
	if _, err := readStatement(t, env.q, "2026-12-04"); !errors.Is(err, query.ErrNotReady) {
		t.Errorf("isp.bill_not_exist: %v, want ErrNotReady", err)
	}
	env.fake.SetBadSignature(true)
	if _, err := readStatement(t, env.q, "2026-12-05"); !errors.Is(err, query.ErrUnverified) {
		t.Errorf("a forged answer: %v, want ErrUnverified", err)
	}
	if _, err := readStatement(t, env.q, "2026-12-04"); !errors.Is(err, query.ErrUnverified) {
		t.Errorf("a forged isp.bill_not_exist: %v, want ErrUnverified", err)
	}
	env.fake.SetBadSignature(false)
	// A statement whose footer disagrees is read to its end and fails
	// there.
	bad := billtest.AlipayZip([]byte("not a statement"), "2088000000000001", "2026-12-06")
	env.fake.SetBill("2026-12-06", querytest.Bill{File: bad})
	if _, err := readStatement(t, env.q, "2026-12-06"); !errors.Is(err, bill.ErrFormat) {
		t.Errorf("a zip of no statement: %v, want ErrFormat", err)
	}
	if _, err := readStatement(t, env.q, "2026-13-01"); err == nil {
		t.Error("an impossible date was asked for")
	}
}

// A statement's payment and refund, built as stored deliveries, map as the
// channels' own callbacks of the same payment and refund do: same key,
// same digest.
func TestBillBodiesMapAsTheCallbacks(t *testing.T) {
	k := keys()
	t.Run("wechat", func(t *testing.T) {
		e := newWeChat(t, false, nil)
		const orderNo, txnID, refundID = "WX-BILL-1", "4200001234202612030000000009", "50300009"
		parse := func(event string, resource map[string]any) *channel.Delivery {
			h, body, err := k.platform.Notify(event, resource, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			var d channel.Delivery
			if rej := e.ch.Parse(&channel.Request{Channel: []byte("wx"), ContentType: []byte("application/json"), Body: body, Header: headerOf(h)}, &d); rej != nil {
				t.Fatal(rej)
			}
			return &d
		}
		pay := parse("TRANSACTION.SUCCESS", map[string]any{"mchid": wxMchID, "appid": wxAppID, "out_trade_no": orderNo,
			"transaction_id": txnID, "trade_state": "SUCCESS", "amount": map[string]any{"total": 1999, "currency": "CNY"}})
		ref := parse("REFUND.SUCCESS", map[string]any{"mchid": wxMchID, "out_trade_no": orderNo, "transaction_id": txnID,
			"out_refund_no": "R1", "refund_id": refundID, "refund_status": "SUCCESS",
			"amount": map[string]any{"total": 1999, "refund": 500, "payer_total": 1999, "payer_refund": 500}})
		for name, c := range map[string]struct {
			body []byte
			cb   *channel.Delivery
		}{"payment": {e.q.BillPayment(txnID, orderNo, 1999), pay}, "refund": {e.q.BillRefund(txnID, orderNo, refundID, 1999, 500, 500), ref}} {
			d := redrive(t, e.ch, c.body)
			if string(d.Key) != string(c.cb.Key) || d.Digest != c.cb.Digest {
				t.Errorf("%s: billed %s %s, callback %s %s", name, d.Key, d.Digest[:12], c.cb.Key, c.cb.Digest[:12])
			}
		}
	})
	t.Run("alipay", func(t *testing.T) {
		e := newAlipay(t, false, nil)
		const orderNo, tradeNo = "ALI-BILL-1", "2026120322001400001234567899"
		parse := func(form map[string]string) *channel.Delivery {
			body, err := k.alipay.Notify(form)
			if err != nil {
				t.Fatal(err)
			}
			var d channel.Delivery
			if rej := e.ch.Parse(&channel.Request{Channel: []byte("ali"), ContentType: []byte("application/x-www-form-urlencoded"), Body: body}, &d); rej != nil {
				t.Fatal(rej)
			}
			return &d
		}
		base := map[string]string{"notify_type": "trade_status_sync", "notify_id": "n1", "trade_no": tradeNo, "out_trade_no": orderNo,
			"trade_status": "TRADE_SUCCESS", "total_amount": "19.99", "app_id": aliAppID, "seller_id": aliSellerID, "charset": "utf-8"}
		pay := parse(base)
		base["out_biz_no"], base["refund_fee"], base["gmt_refund"] = "RF-1", "5.00", "2026-12-05 10:00:00.000"
		ref := parse(base)
		for name, c := range map[string]struct {
			body []byte
			cb   *channel.Delivery
		}{"payment": {e.q.BillPayment(tradeNo, orderNo, 1999), pay}, "refund": {e.q.BillRefund(tradeNo, orderNo, "RF-1", 1999, 500, 500), ref}} {
			d := redrive(t, e.ch, c.body)
			if string(d.Key) != string(c.cb.Key) || d.Digest != c.cb.Digest {
				t.Errorf("%s: billed %s %s, callback %s %s", name, d.Key, d.Digest[:12], c.cb.Key, c.cb.Digest[:12])
			}
		}
	})
}
