package bill_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"golang.org/x/text/encoding/simplifiedchinese"
	"golang.org/x/text/transform"

	"github.com/notifyedge/notifyedge/edge/reconcile/bill"
	"github.com/notifyedge/notifyedge/edge/reconcile/bill/billtest"
)

// sample is a day with two payments, a refund of the first, and fees.
var sample = []bill.Row{
	{Kind: bill.Payment, Trade: "4200000001", OrderNo: "o-1", Amount: 1999, Fee: 12000},
	{Kind: bill.Payment, Trade: "4200000002", OrderNo: "o-2", Amount: 5000, Fee: 30000},
	{Kind: bill.Refund, Trade: "4200000001", OrderNo: "o-1", RefundID: "50300001", Amount: 500, Fee: -3000},
}

// readAll reads every row, and the error that ended the reading (nil for
// io.EOF).
func readAll(r bill.Reader) ([]bill.Row, error) {
	var rows []bill.Row
	for {
		row, err := r.Next()
		if errors.Is(err, io.EOF) {
			return rows, nil
		}
		if err != nil {
			return rows, err
		}
		rows = append(rows, row)
	}
}

var ignoreLayout = cmpopts.IgnoreFields(bill.Row{}, "Line", "Time", "TradeTotal")

func TestWeChatBillReadsRowsByHeader(t *testing.T) {
	for _, bom := range []bool{false, true} {
		rows, err := readAll(bill.NewWeChat(bytes.NewReader(billtest.WeChatBill(sample, bom))))
		if err != nil {
			t.Fatalf("bom %v: %v", bom, err)
		}
		if d := cmp.Diff(sample, rows, ignoreLayout); d != "" {
			t.Errorf("bom %v: rows (-want +got):\n%s", bom, d)
		}
	}
}

// TestWeChatBillRealSample reads the shape of a bill as WeChat Pay
// publishes it: columns moved are still found by name, a refund row with
// 订单金额 0.00 and a negative five-decimal fee, a REVOKED row counted by
// the summary and skipped.
func TestWeChatBillRealSample(t *testing.T) {
	const file = "交易时间,公众账号ID,商户号,特约商户号,设备号,微信订单号,商户订单号,用户标识,交易类型,交易状态,付款银行,货币种类,应结订单金额,代金券金额,微信退款单号,商户退款单号,退款金额,充值券退款金额,退款类型,退款状态,商品名称,商户数据包,手续费,费率,订单金额,申请退款金额,费率备注\n" +
		"`2024-07-09 16:47:58,`wxe1696e7c7db8e7f4,`1579507281,`0,`,`4200002166,`5617363390,`oVgf,`JSAPI,`REFUND,`OTHERS,`CNY,`0.00,`0.00,`50302709992024,`5622435300,`50.00,`0.00,`ORIGINAL,`SUCCESS,`2024-06-28 18:30 客户付款,`{\"statement_id\":\"x\"},`-0.27000,`0.54%,`0.00,`50.00,`\n" +
		"`2024-07-09 10:06:33,`wxe1696e7c7db8e7f4,`1579507281,`0,`,`4200002360,`5622334254,`oVgf,`JSAPI,`SUCCESS,`OTHERS,`CNY,`60.00,`0.00,`0,`0,`0.00,`0.00,`,`,`2024-07-10 13:50 客户付款,`{\"k\":1},`0.32000,`0.54%,`60.00,`0.00,`\n" +
		"`2024-07-09 11:00:00,`wxe1696e7c7db8e7f4,`1579507281,`0,`,`4200002361,`5622334255,`oVgf,`MICROPAY,`REVOKED,`OTHERS,`CNY,`0.00,`0.00,`0,`0,`0.00,`0.00,`,`,`x,`,`0.00000,`0.54%,`0.00,`0.00,`\n" +
		"总交易单数,应结订单总金额,退款总金额,充值券退款总金额,手续费总金额,订单总金额,申请退款总金额\n" +
		"`3,`60.00,`50.00,`0.00,`0.05000,`60.00,`50.00\n"
	r := bill.NewWeChat(strings.NewReader(file))
	rows, err := readAll(r)
	if err != nil {
		t.Fatal(err)
	}
	want := []bill.Row{
		{Kind: bill.Refund, Trade: "4200002166", OrderNo: "5617363390", RefundID: "50302709992024", Amount: 5000, Fee: -27000, Time: "2024-07-09 16:47:58", Line: 2},
		{Kind: bill.Payment, Trade: "4200002360", OrderNo: "5622334254", Amount: 6000, Fee: 32000, Time: "2024-07-09 10:06:33", Line: 3},
	}
	if d := cmp.Diff(want, rows); d != "" {
		t.Errorf("rows (-want +got):\n%s", d)
	}
	if got := r.Totals(); got != (bill.Totals{Payments: 1, Refunds: 1, Paid: 6000, Refunded: 5000, Fees: 5000}) {
		t.Errorf("totals %+v", got)
	}
}

func TestWeChatBillRefusesWhatDoesNotAddUp(t *testing.T) {
	good := string(billtest.WeChatBill(sample, true))
	cases := map[string]struct {
		file string
		want error
	}{
		"summary total off":          {string(skewedWeChat(1)), bill.ErrTotals},
		"a row missing":              {strings.Replace(good, strings.SplitAfter(good, "\r\n")[2], "", 1), bill.ErrTotals},
		"truncated":                  {good[:strings.Index(good, "总交易单数")], bill.ErrFormat},
		"no header":                  {strings.SplitN(good, "\r\n", 2)[1], bill.ErrFormat},
		"amount with three decimals": {strings.ReplaceAll(good, "`19.99,", "`19.991,"), bill.ErrFormat},
		"unknown state":              {strings.Replace(good, "`SUCCESS,", "`PAYING,", 1), bill.ErrFormat},
		"a line after the summary":   {good + "`x,`y\r\n", bill.ErrFormat},
	}
	for name, c := range cases {
		_, err := readAll(bill.NewWeChat(strings.NewReader(c.file)))
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", name, err, c.want)
		}
	}
}

func skewedWeChat(skew int64) []byte {
	var b bytes.Buffer
	w := billtest.NewWeChatWriter(&b, false)
	w.Skew = skew
	for _, r := range sample {
		w.Add(r)
	}
	w.Close()
	return b.Bytes()
}

func TestAlipayBillReadsGBKRowsByHeader(t *testing.T) {
	csv := billtest.AlipayCSV(sample, "2088123412341234", "2026-12-05")
	if bytes.Contains(csv, []byte("业务明细")) {
		t.Fatal("the fixture is not GBK")
	}
	r := bill.NewAlipay(bytes.NewReader(csv))
	rows, err := readAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(sample, rows, ignoreLayout); d != "" {
		t.Errorf("rows (-want +got):\n%s", d)
	}
	if got := r.Totals(); got != (bill.Totals{Payments: 2, Refunds: 1, Paid: 6999, Refunded: 500, Fees: 39000}) {
		t.Errorf("totals %+v", got)
	}
}

// TestAlipayBillRealSample is the shape of a published 业务明细 file, with
// its footer's full-width punctuation and the refund footer's negative sum.
func TestAlipayBillRealSample(t *testing.T) {
	const file = "#支付宝业务明细查询\n#账号：[20880211096256330156]\n#起始日期：[2019年09月16日 00:00:00]   终止日期：[2019年09月17日 00:00:00]\n" +
		"#-----------------------------------------业务明细列表----------------------------------------\n" +
		"支付宝交易号,商户订单号,业务类型,商品名称,创建时间,完成时间,门店编号,门店名称,操作员,终端号,对方账户,订单金额（元）,商家实收（元）,支付宝红包（元）,集分宝（元）,支付宝优惠（元）,商家优惠（元）,券核销金额（元）,券名称,商家红包消费金额（元）,卡消费金额（元）,退款批次号/请求号,服务费（元）,分润（元）,备注\n" +
		"2019091622001458860515315453\t,service_1568601259302\t,交易\t,下单测试,2019-09-16 10:55:16,2019-09-16 10:55:23,alipay_store\t,alipay_store\t,alipay\t,\t,*津水(602***@qq.com)\t,0.01,0.01,0.00,0.00,0.00,0.00,0.00,,0.00\t,0.00,\t,0.00,0.00,下单测试\n" +
		"2019091622001458860515315453\t,service_1568601259302\t,退款\t,下单测试,2019-09-16 10:55:16,2019-09-16 10:56:48,alipay_store\t,alipay_store\t,alipay\t,\t,*津水(602***@qq.com)\t,-0.01,-0.01,0.00,0.00,0.00,0.00,0.00,,0.00\t,0.00,re_test_1568602607356\t,0.00,0.00,下单测试\n" +
		"#-----------------------------------------业务明细列表结束------------------------------------\n" +
		"#交易合计：1笔，商家实收共0.01元，商家优惠共0.00元\n#退款合计：1笔，商家实收退款共-0.01元，商家优惠退款共0.00元\n#导出时间：[2019年09月17日 05:46:49]\n"
	gbk, _, err := transform.String(simplifiedchinese.GBK.NewEncoder(), file)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := readAll(bill.NewAlipay(strings.NewReader(gbk)))
	if err != nil {
		t.Fatal(err)
	}
	want := []bill.Row{
		{Kind: bill.Payment, Trade: "2019091622001458860515315453", OrderNo: "service_1568601259302", Amount: 1, Time: "2019-09-16 10:55:23", Line: 6},
		{Kind: bill.Refund, Trade: "2019091622001458860515315453", OrderNo: "service_1568601259302", RefundID: "re_test_1568602607356", Amount: 1, Time: "2019-09-16 10:56:48", Line: 7},
	}
	if d := cmp.Diff(want, rows); d != "" {
		t.Errorf("rows (-want +got):\n%s", d)
	}
	// The footer's sums are checked, not only read: a changed figure fails.
	bad, _, _ := transform.String(simplifiedchinese.GBK.NewEncoder(), strings.Replace(file, "商家实收退款共-0.01元", "商家实收退款共-0.02元", 1))
	if _, err := readAll(bill.NewAlipay(strings.NewReader(bad))); !errors.Is(err, bill.ErrTotals) {
		t.Errorf("a refund footer that disagrees: %v, want ErrTotals", err)
	}
}

func TestAlipayBillRefusesWhatDoesNotAddUp(t *testing.T) {
	utf := func(rows []bill.Row, f func(*billtest.AlipayWriter)) string {
		var b bytes.Buffer
		w := billtest.NewAlipayWriter(&b, "2088123412341234", "2026-12-05")
		if f != nil {
			f(w)
		}
		for _, r := range rows {
			w.Add(r)
		}
		w.Close()
		s, _, _ := transform.String(simplifiedchinese.GBK.NewDecoder(), b.String())
		return s
	}
	good := utf(sample, nil)
	cases := map[string]struct {
		file string
		want error
	}{
		"footer sum off":       {utf(sample, func(w *billtest.AlipayWriter) { w.Skew = 1 }), bill.ErrTotals},
		"footer count off":     {strings.Replace(good, "#交易合计：2笔", "#交易合计：3笔", 1), bill.ErrTotals},
		"truncated":            {good[:strings.Index(good, "#-----------------------------------------业务明细列表结束")], bill.ErrFormat},
		"refunds, no footer":   {utf(sample, func(w *billtest.AlipayWriter) { w.NoRefundFooter = true }), bill.ErrFormat},
		"positive refund":      {strings.Replace(good, "-5.00", "5.00", 2), bill.ErrFormat},
		"unknown type":         {strings.Replace(good, "交易\t", "转账\t", 1), bill.ErrFormat},
		"a row after the end":  {good + "1,2,交易\r\n", bill.ErrFormat},
		"header column absent": {strings.Replace(good, "支付宝交易号,", "交易号,", 1), bill.ErrFormat},
	}
	for name, c := range cases {
		gbk, _, _ := transform.String(simplifiedchinese.GBK.NewEncoder(), c.file)
		_, err := readAll(bill.NewAlipay(strings.NewReader(gbk)))
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", name, err, c.want)
		}
	}
	// A day without refunds may leave the refund footer out.
	noRefunds := utf(sample[:2], func(w *billtest.AlipayWriter) { w.NoRefundFooter = true })
	gbk, _, _ := transform.String(simplifiedchinese.GBK.NewEncoder(), noRefunds)
	if _, err := readAll(bill.NewAlipay(strings.NewReader(gbk))); err != nil {
		t.Errorf("no refunds, no refund footer: %v", err)
	}
}

func TestOpenAlipayZipPicksTheDetailByItsGBKName(t *testing.T) {
	csv := billtest.AlipayCSV(sample, "2088123412341234", "2026-12-05")
	z := billtest.AlipayZip(csv, "2088123412341234", "2026-12-05")
	rc, name, err := bill.OpenAlipayZip(bytes.NewReader(z), int64(len(z)))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if name != "20881234123412340156_20261205_业务明细.csv" {
		t.Errorf("entry %q", name)
	}
	got, _ := io.ReadAll(rc)
	if !bytes.Equal(got, csv) {
		t.Error("the entry is not the detail CSV")
	}
	if _, _, err := bill.OpenAlipayZip(bytes.NewReader(csv), int64(len(csv))); err == nil {
		t.Error("a CSV that is not a zip opened")
	}
}

func TestParseYuanIsExact(t *testing.T) {
	for s, want := range map[string]int64{"19.99": 1999, "0.1": 10, "5": 500, "-0.01": -1, "0.00": 0, "123456789.01": 12345678901} {
		if got, ok := bill.ParseYuan(s); !ok || got != want {
			t.Errorf("ParseYuan(%q) = %d, %v; want %d", s, got, ok, want)
		}
	}
	for _, s := range []string{"", "1e3", "19.999", "1,000.00", "¥1", "1.", ".5", " 1", "--1", "0x10"} {
		if got, ok := bill.ParseYuan(s); ok {
			t.Errorf("ParseYuan(%q) = %d, accepted", s, got)
		}
	}
	if got := bill.FenOfFee(-27000); got != -27 {
		t.Errorf("FenOfFee(-0.27000 yuan) = %d", got)
	}
	if got := bill.FenOfFee(12500); got != 13 {
		t.Errorf("FenOfFee(0.12500 yuan) = %d, want 13 (half away from zero)", got)
	}
}

// A file without line breaks is refused at the line limit, not read whole
// into memory.
func TestLineTooLong(t *testing.T) {
	huge := strings.Repeat("`x", 100<<10)
	if _, err := readAll(bill.NewWeChat(strings.NewReader(huge))); !errors.Is(err, bill.ErrFormat) {
		t.Errorf("wechat: %v, want ErrFormat", err)
	}
	if _, err := readAll(bill.NewAlipay(strings.NewReader(huge))); !errors.Is(err, bill.ErrFormat) {
		t.Errorf("alipay: %v, want ErrFormat", err)
	}
}
