package bill

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
)

// WeChat Pay trade bill (bill_type=ALL), as its columns are named.
const (
	wxTrade        = "微信订单号"
	wxOrder        = "商户订单号"
	wxState        = "交易状态"
	wxRefundID     = "微信退款单号"
	wxRefundAmount = "退款金额"
	wxRefundState  = "退款状态"
	wxFee          = "手续费"
	wxTotal        = "订单金额"
	wxTime         = "交易时间"

	wxSumCount   = "总交易单数"
	wxSumTotal   = "订单总金额"
	wxSumRefunds = "退款总金额"
	wxSumFees    = "手续费总金额"
)

// WeChatReader reads WeChat Pay's trade bill: UTF-8 CSV, maybe with a BOM,
// every field prefixed with a backtick; the detail header, one row per
// payment (交易状态 SUCCESS), refund (REFUND) or revoked trade (REVOKED,
// counted but neither), then a summary header (总交易单数, ...) and one
// summary row, which the rows must add up to.
type WeChatReader struct {
	r      *csv.Reader
	col    map[string]int
	refund int // 退款状态's column, -1 when the bill has none
	line   int
	totals Totals
	// every row, whatever its state, as the summary counts them.
	rows                     int
	total, refunds, fees     int64
	done                     bool
	err                      error
	headerRead, summaryFound bool
}

// NewWeChat reads the decompressed trade bill from r.
func NewWeChat(r io.Reader) *WeChatReader {
	c := csv.NewReader(&lineLimit{r: r})
	c.FieldsPerRecord = -1
	c.LazyQuotes = true
	c.ReuseRecord = true
	return &WeChatReader{r: c, refund: -1}
}

// Totals are the payments and refunds read so far.
func (w *WeChatReader) Totals() Totals { return w.totals }

// Next returns the next payment or refund; io.EOF once the summary row
// agreed with the rows.
func (w *WeChatReader) Next() (Row, error) {
	if w.err != nil {
		return Row{}, w.err
	}
	row, err := w.next()
	if err != nil {
		w.err = err
	}
	return row, err
}

func (w *WeChatReader) next() (Row, error) {
	for {
		rec, err := w.r.Read()
		w.line++
		if err != nil {
			if errors.Is(err, io.EOF) {
				if !w.summaryFound {
					return Row{}, formatErr(w.line, "the file ends before its summary row (truncated?)")
				}
				return Row{}, io.EOF
			}
			return Row{}, readErr(w.line, err)
		}
		if len(rec) == 1 && cleanField(rec[0]) == "" {
			continue // a blank line
		}
		if w.summaryFound {
			return Row{}, formatErr(w.line, "a line after the summary row")
		}
		if !w.headerRead {
			col, err := columns(rec, w.line, wxTrade, wxOrder, wxState, wxRefundID, wxRefundAmount, wxFee, wxTotal, wxTime)
			if err != nil {
				return Row{}, err
			}
			w.col, w.headerRead = col, true
			for i, h := range rec {
				if normalizeHeader(h) == wxRefundState {
					w.refund = i
				}
			}
			continue
		}
		if normalizeHeader(rec[0]) == wxSumCount {
			if err := w.summary(rec); err != nil {
				return Row{}, err
			}
			continue
		}
		row, ok, err := w.row(rec)
		if err != nil {
			return Row{}, err
		}
		if ok {
			return row, nil
		}
	}
}

// field is column name of rec, cleaned; "" when the row is short.
func (w *WeChatReader) field(rec []string, name string) string {
	i := w.col[name]
	if i >= len(rec) {
		return ""
	}
	return cleanField(rec[i])
}

// row maps a detail row: ok is false for a row that is neither a payment
// nor a refund (a revoked trade, a refund not yet successful).
func (w *WeChatReader) row(rec []string) (Row, bool, error) {
	if len(rec) < len(w.col) {
		return Row{}, false, formatErr(w.line, "%d fields, fewer than the header's columns", len(rec))
	}
	for _, f := range rec {
		if len(f) > maxField {
			return Row{}, false, formatErr(w.line, "a field of %d bytes", len(f))
		}
	}
	total, ok1 := ParseYuan(w.field(rec, wxTotal))
	refund, ok2 := ParseYuan(orZero(w.field(rec, wxRefundAmount)))
	fee, ok3 := parseDecimal(orZero(w.field(rec, wxFee)), FeeScale)
	if !ok1 || !ok2 || !ok3 {
		return Row{}, false, formatErr(w.line, "an amount (%s, %s, %s) is not yuan", wxTotal, wxRefundAmount, wxFee)
	}
	w.rows++
	w.total += total
	w.refunds += refund
	w.fees += fee
	r := Row{Trade: w.field(rec, wxTrade), OrderNo: w.field(rec, wxOrder), Fee: fee, Time: w.field(rec, wxTime), Line: w.line}
	switch state := w.field(rec, wxState); state {
	case "SUCCESS":
		r.Kind, r.Amount = Payment, total
	case "REFUND":
		if w.refund >= 0 && w.refund < len(rec) {
			if s := cleanField(rec[w.refund]); s != "" && s != "SUCCESS" {
				return Row{}, false, nil // a refund still processing, or failed: no money moved yet
			}
		}
		r.Kind, r.Amount, r.TradeTotal, r.RefundID = Refund, refund, total, w.field(rec, wxRefundID)
		if !checkID(r.RefundID) {
			return Row{}, false, formatErr(w.line, "%s %s: want 1 to 64 printable ASCII characters", wxRefundID, quote(r.RefundID))
		}
	case "REVOKED":
		return Row{}, false, nil
	default:
		return Row{}, false, formatErr(w.line, "%s %s: want SUCCESS, REFUND or REVOKED", wxState, quote(state))
	}
	if !checkID(r.Trade) || !checkID(r.OrderNo) {
		return Row{}, false, formatErr(w.line, "%s or %s: want 1 to 64 printable ASCII characters", wxTrade, wxOrder)
	}
	if r.Amount <= 0 {
		return Row{}, false, formatErr(w.line, "a %s of %s fen: want a positive amount", r.Kind, fmt.Sprint(r.Amount))
	}
	w.totals.add(&r)
	return r, true, nil
}

// summary reads the summary header rec and the row after it, and checks
// them against the rows read.
func (w *WeChatReader) summary(header []string) error {
	names := make([]string, len(header))
	for i, h := range header {
		names[i] = normalizeHeader(h)
	}
	line := w.line
	rec, err := w.r.Read()
	w.line++
	if err != nil {
		return formatErr(w.line, "no summary row after the summary header (line %d)", line)
	}
	w.summaryFound = true
	got := map[string]string{}
	for i, n := range names {
		if i < len(rec) {
			got[n] = cleanField(rec[i])
		}
	}
	count, ok := parseDecimal(got[wxSumCount], 0)
	if !ok {
		return formatErr(w.line, "%s %s is not a count", wxSumCount, quote(got[wxSumCount]))
	}
	if count != int64(w.rows) {
		return fmt.Errorf("%w: %s says %d rows, the bill has %d", ErrTotals, wxSumCount, count, w.rows)
	}
	for _, c := range []struct {
		name  string
		scale int
		sum   int64
	}{{wxSumTotal, 2, w.total}, {wxSumRefunds, 2, w.refunds}, {wxSumFees, FeeScale, w.fees}} {
		s, present := got[c.name]
		if !present {
			return formatErr(w.line, "the summary has no %s", c.name)
		}
		v, ok := parseDecimal(s, c.scale)
		if !ok {
			return formatErr(w.line, "%s %s is not yuan", c.name, quote(s))
		}
		if v != c.sum {
			return fmt.Errorf("%w: %s says %s, the rows add up to %s", ErrTotals, c.name, s, formatScaled(c.sum, c.scale))
		}
	}
	return nil
}

// orZero reads an empty amount cell as zero.
func orZero(s string) string {
	if s == "" {
		return "0"
	}
	return s
}

// formatScaled prints n 10^-scale as a decimal.
func formatScaled(n int64, scale int) string {
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	p := int64(1)
	for range scale {
		p *= 10
	}
	if scale == 0 {
		return fmt.Sprintf("%s%d", sign, n)
	}
	return fmt.Sprintf("%s%d.%0*d", sign, n/p, scale, n%p)
}
