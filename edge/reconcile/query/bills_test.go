package query_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

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
