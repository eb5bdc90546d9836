package bill

import (
	"archive/zip"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/encoding/simplifiedchinese"
	"golang.org/x/text/transform"
)

// Alipay's trade bill (业务明细), as its columns are named (full-width
// parentheses read as ASCII ones).
const (
	apTrade    = "支付宝交易号"
	apOrder    = "商户订单号"
	apType     = "业务类型"
	apAmount   = "订单金额(元)"
	apRefundID = "退款批次号/请求号"
	apFee      = "服务费(元)"
	apTime     = "完成时间"

	apPayment = "交易"
	apRefund  = "退款"
)

// AlipayReader reads the 业务明细 CSV of Alipay's trade bill, decoded from
// GBK: '#' lines before the header (account, dates) and after the rows
// (the end marker, then the footer: #交易合计：N笔，商家实收共X元，... and
// #退款合计：M笔，商家实收退款共-Y元，...),
// fields padded with tabs, refund rows (业务类型 退款) with a negative
// 订单金额（元）. The footer's counts, and every amount it names after a
// column (商家实收共X元 is the 商家实收（元） column's sum over the payments,
// 商家实收退款共-Y元 the same column's over the refunds), must agree with
// the rows of their kind. A file without refunds may leave #退款合计 out.
type AlipayReader struct {
	r      *csv.Reader
	col    map[string]int
	yuan   map[string]int // every (元) column, for the footer's sums
	line   int
	totals Totals
	sums   map[Kind]map[string]int64
	footer map[Kind]bool
	err    error
	header bool
	ended  bool // past the rows
}

// NewAlipay reads the 业务明细 CSV from r, which holds it as Alipay sends
// it: GBK.
func NewAlipay(r io.Reader) *AlipayReader {
	c := csv.NewReader(transform.NewReader(&lineLimit{r: r}, simplifiedchinese.GBK.NewDecoder()))
	c.FieldsPerRecord = -1
	c.LazyQuotes = true
	c.ReuseRecord = true
	return &AlipayReader{r: c, yuan: map[string]int{}, footer: map[Kind]bool{},
		sums: map[Kind]map[string]int64{Payment: {}, Refund: {}}}
}

// Totals are the payments and refunds read so far.
func (a *AlipayReader) Totals() Totals { return a.totals }

// Next returns the next payment or refund; io.EOF once the footer agreed
// with the rows.
func (a *AlipayReader) Next() (Row, error) {
	if a.err != nil {
		return Row{}, a.err
	}
	row, err := a.next()
	if err != nil {
		a.err = err
	}
	return row, err
}

func (a *AlipayReader) next() (Row, error) {
	for {
		rec, err := a.r.Read()
		a.line++
		if err != nil {
			if errors.Is(err, io.EOF) {
				return Row{}, a.end()
			}
			return Row{}, readErr(a.line, err)
		}
		first := strings.TrimSpace(strings.TrimPrefix(rec[0], "\ufeff"))
		if strings.HasPrefix(first, "#") {
			if a.header {
				a.ended = true
				if err := a.footerLine(strings.Join(rec, ",")); err != nil {
					return Row{}, err
				}
			}
			continue
		}
		if len(rec) == 1 && cleanField(rec[0]) == "" {
			continue
		}
		if a.ended {
			return Row{}, formatErr(a.line, "a row after the end of the rows")
		}
		if !a.header {
			col, err := columns(rec, a.line, apTrade, apOrder, apType, apAmount, apRefundID, apFee, apTime)
			if err != nil {
				return Row{}, err
			}
			a.col, a.header = col, true
			for i, h := range rec {
				if n := normalizeHeader(h); strings.HasSuffix(n, "(元)") {
					a.yuan[n] = i
				}
			}
			continue
		}
		return a.row(rec)
	}
}

func (a *AlipayReader) field(rec []string, name string) string {
	if i := a.col[name]; i < len(rec) {
		return cleanField(rec[i])
	}
	return ""
}

// row maps a detail row.
func (a *AlipayReader) row(rec []string) (Row, error) {
	if len(rec) < len(a.col) {
		return Row{}, formatErr(a.line, "%d fields, fewer than the header's columns", len(rec))
	}
	for _, f := range rec {
		if len(f) > maxField {
			return Row{}, formatErr(a.line, "a field of %d bytes", len(f))
		}
	}
	amount, ok1 := ParseYuan(a.field(rec, apAmount))
	fee, ok2 := parseDecimal(orZero(a.field(rec, apFee)), FeeScale)
	if !ok1 || !ok2 {
		return Row{}, formatErr(a.line, "%s or %s is not yuan", apAmount, apFee)
	}
	r := Row{Trade: a.field(rec, apTrade), OrderNo: a.field(rec, apOrder), Fee: fee, Time: a.field(rec, apTime), Line: a.line}
	switch typ := a.field(rec, apType); typ {
	case apPayment:
		r.Kind, r.Amount = Payment, amount
	case apRefund:
		r.Kind, r.Amount, r.RefundID = Refund, -amount, a.field(rec, apRefundID)
		if !checkID(r.RefundID) {
			return Row{}, formatErr(a.line, "%s %s: want 1 to 64 printable ASCII characters", apRefundID, quote(r.RefundID))
		}
	default:
		return Row{}, formatErr(a.line, "%s %s: want %s or %s", apType, quote(typ), apPayment, apRefund)
	}
	if !checkID(r.Trade) || !checkID(r.OrderNo) {
		return Row{}, formatErr(a.line, "%s or %s: want 1 to 64 printable ASCII characters", apTrade, apOrder)
	}
	if r.Amount <= 0 {
		return Row{}, formatErr(a.line, "a %s whose %s has the wrong sign or is zero", r.Kind, apAmount)
	}
	sums := a.sums[r.Kind]
	for name, i := range a.yuan {
		if i >= len(rec) {
			continue
		}
		if v, ok := parseDecimal(orZero(cleanField(rec[i])), FeeScale); ok {
			sums[name] += v
		} else {
			sums[name] = unsummable
		}
	}
	a.totals.add(&r)
	return r, nil
}

// unsummable marks a column with a cell that is not an amount: the footer
// cannot be checked against it.
const unsummable = -1 << 62

var (
	footerCount  = regexp.MustCompile(`^#(交易|退款)合计[：:]\s*(\d+)\s*笔`)
	footerAmount = regexp.MustCompile(`^(.+?)(?:共|[：:])\s*[￥¥]?\s*([-+]?[0-9.]+)\s*元?$`)
)

// footerLine checks a '#' line after the rows: the totals of payments
// (#交易合计) and of refunds (#退款合计).
func (a *AlipayReader) footerLine(line string) error {
	m := footerCount.FindStringSubmatch(strings.TrimSpace(line))
	if m == nil {
		return nil // the end marker, the export time
	}
	kind, count := Payment, a.totals.Payments
	if m[1] == apRefund {
		kind, count = Refund, a.totals.Refunds
	}
	if a.footer[kind] {
		return formatErr(a.line, "#%s合计 appears twice", m[1])
	}
	a.footer[kind] = true
	if n, ok := parseDecimal(m[2], 0); !ok || n != int64(count) {
		return fmt.Errorf("%w: #%s合计 says %s笔, the bill has %d", ErrTotals, m[1], m[2], count)
	}
	rest := strings.TrimSpace(line[len(m[0]):])
	for _, part := range strings.FieldsFunc(rest, func(r rune) bool { return r == '，' || r == ',' || r == '；' || r == ';' }) {
		am := footerAmount.FindStringSubmatch(strings.TrimSpace(part))
		if am == nil {
			continue
		}
		label := normalizeHeader(am[1])
		if kind == Refund {
			label = strings.TrimSuffix(label, apRefund) // 商家实收退款 is the refunds' 商家实收
		}
		name := label + "(元)"
		sum, ok := a.sums[kind][name]
		if _, isColumn := a.yuan[name]; !isColumn || (ok && sum == unsummable) {
			continue // a figure of no column: nothing to check it against
		}
		v, okv := parseDecimal(am[2], FeeScale)
		if !okv {
			return formatErr(a.line, "#%s合计: %s is not yuan", m[1], quote(am[2]))
		}
		if v != sum {
			return fmt.Errorf("%w: #%s合计 says %s %s元, the rows add up to %s", ErrTotals, m[1], am[1], am[2], formatScaled(sum, FeeScale))
		}
	}
	return nil
}

// end checks that the file had its header and its payments' footer.
func (a *AlipayReader) end() error {
	switch {
	case !a.header:
		return formatErr(a.line, "no header with %s", apTrade)
	case !a.footer[Payment]:
		return formatErr(a.line, "the file ends without #交易合计 (truncated?)")
	case !a.footer[Refund] && a.totals.Refunds > 0:
		return formatErr(a.line, "the file has refunds but no #退款合计")
	}
	return io.EOF
}

// ErrNoDetail: the zip holds no 业务明细 CSV, or more than one.
var ErrNoDetail = errors.New("the bill's zip holds no single 业务明细 CSV")

// OpenAlipayZip opens the 业务明细 CSV (not the 汇总 one) of Alipay's bill
// zip; entry names are GBK unless the entry says UTF-8. It returns the
// entry (as GBK bytes, for NewAlipay) and its name in UTF-8.
func OpenAlipayZip(r io.ReaderAt, size int64) (io.ReadCloser, string, error) {
	z, err := zip.NewReader(r, size)
	if err != nil {
		return nil, "", fmt.Errorf("the bill's zip: %w", err)
	}
	var found *zip.File
	name := ""
	for _, f := range z.File {
		n := entryName(f)
		if !strings.HasSuffix(n, "业务明细.csv") {
			continue // the 汇总 one ends 业务明细(汇总).csv
		}
		if found != nil {
			return nil, "", fmt.Errorf("%w: %s and %s", ErrNoDetail, name, n)
		}
		found, name = f, n
	}
	if found == nil {
		return nil, "", ErrNoDetail
	}
	rc, err := found.Open()
	if err != nil {
		return nil, "", fmt.Errorf("the bill's zip: %s: %w", name, err)
	}
	return rc, name, nil
}

// entryName decodes a zip entry's name: UTF-8 when the entry says so and
// it is valid, else GBK.
func entryName(f *zip.File) string {
	if !f.NonUTF8 && utf8.ValidString(f.Name) {
		return f.Name
	}
	s, _, err := transform.String(simplifiedchinese.GBK.NewDecoder(), f.Name)
	if err != nil {
		return f.Name
	}
	return s
}
