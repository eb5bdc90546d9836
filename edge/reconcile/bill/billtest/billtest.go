// Package billtest writes statements in the channels' own formats, for the
// loopback fakes, the parsers' tests and the benchmark: WeChat Pay's trade
// bill (UTF-8 CSV, backtick-prefixed fields, summary rows) and Alipay's
// 业务明细 CSV (GBK, '#' preamble and footer, tab-padded fields, negative
// refunds) inside its zip (GBK entry names). Writers stream: a bill of a
// million rows never sits in memory.
package billtest

import (
	"archive/zip"
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"

	"golang.org/x/text/encoding/simplifiedchinese"
	"golang.org/x/text/transform"

	"github.com/notifyedge/notifyedge/edge/reconcile/bill"
)

// WeChatHeader is the detail header of bill_type=ALL.
const WeChatHeader = "交易时间,公众账号ID,商户号,特约商户号,设备号,微信订单号,商户订单号,用户标识,交易类型,交易状态,付款银行,货币种类,应结订单金额,代金券金额,微信退款单号,商户退款单号,退款金额,充值券退款金额,退款类型,退款状态,商品名称,商户数据包,手续费,费率,订单金额,申请退款金额,费率备注"

// WeChatSummaryHeader is the summary header.
const WeChatSummaryHeader = "总交易单数,应结订单总金额,退款总金额,充值券退款总金额,手续费总金额,订单总金额,申请退款总金额"

// WeChatWriter writes a trade bill a row at a time; Close writes the
// summary.
type WeChatWriter struct {
	w                    *bufio.Writer
	rows                 int
	total, refunds, fees int64
	// Skew, when set, is added to the summary's 订单总金额: a bill whose
	// totals disagree with its rows.
	Skew int64
}

// NewWeChatWriter starts a bill on w: BOM (when bom), then the header.
func NewWeChatWriter(w io.Writer, bom bool) *WeChatWriter {
	b := bufio.NewWriterSize(w, 64<<10)
	if bom {
		b.WriteString("\ufeff")
	}
	b.WriteString(WeChatHeader + "\r\n")
	return &WeChatWriter{w: b}
}

// Add writes r as the channel does: a payment as SUCCESS with its amounts,
// a refund as REFUND with 订单金额 0.00 and the refund in 退款金额. Fee is
// in 10^-5 yuan.
func (t *WeChatWriter) Add(r bill.Row) {
	state, settle, total, refundID, refund, refundState := "SUCCESS", yuan(r.Amount), yuan(r.Amount), "0", "0.00", ""
	if r.Kind == bill.Refund {
		state, settle, total, refundID, refund, refundState = "REFUND", "0.00", "0.00", r.RefundID, yuan(r.Amount), "SUCCESS"
		t.refunds += r.Amount
	} else {
		t.total += r.Amount
	}
	t.rows++
	t.fees += r.Fee
	at := r.Time
	if at == "" {
		at = "2026-12-05 12:00:00"
	}
	fields := []string{at, "wx2421b1c4370ec43b", "1900000109", "0", "", r.Trade, r.OrderNo, "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o",
		"JSAPI", state, "OTHERS", "CNY", settle, "0.00", refundID, "re" + r.OrderNo, refund, "0.00", "ORIGINAL", refundState,
		"商品，含逗号", `{"k":"v"}`, fee(r.Fee), "0.60%", total, refund, ""}
	for i, f := range fields {
		if i > 0 {
			t.w.WriteByte(',')
		}
		t.w.WriteByte('`')
		t.w.WriteString(f) // as the channel does: never quoted, quotes and all
	}
	t.w.WriteString("\r\n")
}

// Close writes the summary header and row and flushes.
func (t *WeChatWriter) Close() error {
	t.w.WriteString(WeChatSummaryHeader + "\r\n")
	fmt.Fprintf(t.w, "`%d,`%s,`%s,`0.00,`%s,`%s,`%s\r\n", t.rows, yuan(t.total), yuan(t.refunds), fee(t.fees), yuan(t.total+t.Skew), yuan(t.refunds))
	return t.w.Flush()
}

// WeChatBill returns the trade bill of rows.
func WeChatBill(rows []bill.Row, bom bool) []byte {
	var b bytes.Buffer
	w := NewWeChatWriter(&b, bom)
	for _, r := range rows {
		w.Add(r)
	}
	w.Close()
	return b.Bytes()
}

// AlipayHeader is the 业务明细 header, full-width parentheses and all.
const AlipayHeader = "支付宝交易号,商户订单号,业务类型,商品名称,创建时间,完成时间,门店编号,门店名称,操作员,终端号,对方账户,订单金额（元）,商家实收（元）,支付宝红包（元）,集分宝（元）,支付宝优惠（元）,商家优惠（元）,券核销金额（元）,券名称,商家红包消费金额（元）,卡消费金额（元）,退款批次号/请求号,服务费（元）,分润（元）,备注"

// AlipayWriter writes a 业务明细 CSV in GBK a row at a time; Close writes
// the footer.
type AlipayWriter struct {
	w                 *bufio.Writer
	gbk               io.WriteCloser
	pays, refunds     int
	paySum, refundSum int64
	// Skew, when set, is added to the footer's 商家实收 of the payments.
	Skew int64
	// NoRefundFooter leaves #退款合计 out (as a day without refunds may).
	NoRefundFooter bool
}

// NewAlipayWriter starts the CSV on w for account and the day date
// (YYYY-MM-DD).
func NewAlipayWriter(w io.Writer, account, date string) *AlipayWriter {
	gbk := transform.NewWriter(w, simplifiedchinese.GBK.NewEncoder())
	b := bufio.NewWriterSize(gbk, 64<<10)
	d := strings.Split(date, "-")
	fmt.Fprintf(b, "#支付宝业务明细查询\r\n#账号：[%s0156]\r\n#起始日期：[%s年%s月%s日 00:00:00]   终止日期：[%s年%s月%s日 23:59:59]\r\n", account, d[0], d[1], d[2], d[0], d[1], d[2])
	b.WriteString("#-----------------------------------------业务明细列表----------------------------------------\r\n")
	b.WriteString(AlipayHeader + "\r\n")
	return &AlipayWriter{w: b, gbk: gbk}
}

// Add writes r as Alipay does: a payment as 交易, a refund as 退款 with
// negative amounts and its request number; ids padded with a tab.
func (t *AlipayWriter) Add(r bill.Row) {
	typ, amount, refundID := "交易", yuan(r.Amount), ""
	if r.Kind == bill.Refund {
		typ, amount, refundID = "退款", yuan(-r.Amount), r.RefundID
		t.refunds++
		t.refundSum -= r.Amount
	} else {
		t.pays++
		t.paySum += r.Amount
	}
	at := r.Time
	if at == "" {
		at = "2026-12-05 12:00:00"
	}
	fields := []string{r.Trade + "\t", r.OrderNo + "\t", typ + "\t", "测试商品", at, at, "store\t", "门店\t", "alipay\t", "\t",
		"*津水(602***@qq.com)\t", amount, amount, "0.00", "0.00", "0.00", "0.00", "0.00", "", "0.00\t", "0.00", refundID + "\t",
		fee(r.Fee), "0.00", "备注"}
	t.w.WriteString(strings.Join(fields, ",") + "\r\n")
}

// Close writes the end marker and the footer, and flushes.
func (t *AlipayWriter) Close() error {
	t.w.WriteString("#-----------------------------------------业务明细列表结束------------------------------------\r\n")
	fmt.Fprintf(t.w, "#交易合计：%d笔，商家实收共%s元，商家优惠共0.00元\r\n", t.pays, yuan(t.paySum+t.Skew))
	if !t.NoRefundFooter {
		fmt.Fprintf(t.w, "#退款合计：%d笔，商家实收退款共%s元，商家优惠退款共0.00元\r\n", t.refunds, yuan(t.refundSum))
	}
	t.w.WriteString("#导出时间：[2026年12月06日 05:46:49]\r\n")
	if err := t.w.Flush(); err != nil {
		return err
	}
	return t.gbk.Close()
}

// AlipayCSV returns the 业务明细 CSV (GBK) of rows.
func AlipayCSV(rows []bill.Row, account, date string) []byte {
	var b bytes.Buffer
	w := NewAlipayWriter(&b, account, date)
	for _, r := range rows {
		w.Add(r)
	}
	w.Close()
	return b.Bytes()
}

// AlipayZip returns the bill's zip: the 业务明细 CSV and its 汇总, named as
// Alipay names them ({account}0156_{yyyymmdd}_业务明细.csv), in GBK.
func AlipayZip(detail []byte, account, date string) []byte {
	var b bytes.Buffer
	WriteAlipayZip(&b, bytes.NewReader(detail), account, date)
	return b.Bytes()
}

// WriteAlipayZip streams the zip of the detail CSV read from detail to w.
func WriteAlipayZip(w io.Writer, detail io.Reader, account, date string) error {
	z := zip.NewWriter(w)
	day := strings.ReplaceAll(date, "-", "")
	prefix := account + "0156_" + day
	summary, _ := gbk(prefix + "_业务明细(汇总).csv")
	fw, err := z.CreateHeader(&zip.FileHeader{Name: summary, Method: zip.Deflate, NonUTF8: true})
	if err != nil {
		return err
	}
	s, _ := gbk("#支付宝业务汇总查询\r\n门店编号,门店名称,交易订单总笔数,退款订单总笔数,订单金额（元）\r\n#导出时间：[2026年12月06日 05:46:49]\r\n")
	fw.Write([]byte(s))
	name, _ := gbk(prefix + "_业务明细.csv")
	fw, err = z.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Deflate, NonUTF8: true})
	if err != nil {
		return err
	}
	if _, err := io.Copy(fw, detail); err != nil {
		return err
	}
	return z.Close()
}

func gbk(s string) (string, error) {
	out, _, err := transform.String(simplifiedchinese.GBK.NewEncoder(), s)
	return out, err
}

// yuan prints fen as yuan with two decimals.
func yuan(fen int64) string {
	sign := ""
	if fen < 0 {
		sign, fen = "-", -fen
	}
	return fmt.Sprintf("%s%d.%02d", sign, fen/100, fen%100)
}

// fee prints 10^-5 yuan with five decimals.
func fee(n int64) string {
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	return fmt.Sprintf("%s%d.%05d", sign, n/100000, n%100000)
}
