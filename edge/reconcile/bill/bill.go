// Package bill reads the payment channels' daily statements (对账单): WeChat
// Pay's trade bill and Alipay's 业务明细 CSV. Both are read as streams, a
// row at a time, with columns found by their header's name, never by
// position, and amounts in yuan converted to minor units exactly (decimal,
// never float). A statement carries its own totals (WeChat's summary row,
// Alipay's footer); a reader checks its rows against them at the end and
// reports a disagreement as the last row's error, so a caller that applies
// nothing before the end applies nothing from a statement that does not
// add up.
//
// Nothing here talks to a channel: package query fetches the files.
package bill

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Kind is what a statement row records.
type Kind byte

// The kinds of row that are compared with the ledger.
const (
	// Payment: a trade paid (WeChat 交易状态 SUCCESS; Alipay 业务类型 交易).
	Payment Kind = 'P'
	// Refund: money returned on a trade (WeChat REFUND; Alipay 退款).
	Refund Kind = 'R'
)

// String names the kind.
func (k Kind) String() string {
	switch k {
	case Payment:
		return "payment"
	case Refund:
		return "refund"
	}
	return fmt.Sprintf("kind(%d)", byte(k))
}

// Row is one payment or refund of a statement.
type Row struct {
	Kind Kind
	// Trade is the channel's transaction id (WeChat 微信订单号, Alipay
	// 支付宝交易号).
	Trade string
	// OrderNo is the merchant's order number (商户订单号).
	OrderNo string
	// RefundID is the refund's id at the channel (WeChat 微信退款单号,
	// Alipay 退款批次号/请求号); empty for a payment.
	RefundID string
	// Amount is in minor units and positive: for a payment the trade's
	// total (WeChat 订单金额, Alipay 订单金额（元）), for a refund the
	// refund's amount (WeChat 退款金额, Alipay the 退款 row's negative
	// 订单金额（元） negated).
	Amount int64
	// TradeTotal is the trade's total as a refund row states it, 0 when it
	// does not (Alipay's refund rows carry only the refund).
	TradeTotal int64
	// Fee is the channel's fee in 10^-5 yuan (FeeScale), signed: a refund
	// returns part of it (negative).
	Fee int64
	// Time is the row's time as the statement prints it (WeChat 交易时间,
	// Alipay 完成时间).
	Time string
	// Line is the row's line in the file, for messages.
	Line int
}

// Totals are what a statement's rows add up to.
type Totals struct {
	Payments, Refunds int
	// Paid is the sum of the payments' Amount, Refunded of the refunds'
	// (fen), Fees of every row's Fee (signed, 10^-5 yuan).
	Paid, Refunded, Fees int64
}

// add counts r.
func (t *Totals) add(r *Row) {
	switch r.Kind {
	case Payment:
		t.Payments++
		t.Paid += r.Amount
	case Refund:
		t.Refunds++
		t.Refunded += r.Amount
	}
	t.Fees += r.Fee
}

// Reader reads a statement a row at a time.
type Reader interface {
	// Next returns the next payment or refund. At the end it returns
	// io.EOF once the rows agree with the statement's own totals, or an
	// error (ErrTotals) when they do not: a caller applies nothing before
	// it has seen io.EOF.
	Next() (Row, error)
	// Totals are the rows read so far.
	Totals() Totals
}

// ErrFormat: the file is not a statement of the expected shape (no header,
// a missing column, a malformed field). The message names the line.
var ErrFormat = errors.New("the statement does not read")

// ErrTotals: the statement's own totals disagree with its rows.
var ErrTotals = errors.New("the statement's totals disagree with its rows")

// maxLine bounds one line: encoding/csv holds a whole record in memory
// before a field can be checked, so a file without line breaks (or with a
// stray quote that swallows them) is cut off here, keeping the memory a
// statement takes bounded.
const maxLine = 64 << 10

// ErrLineTooLong: a line of the statement is longer than any real row.
var ErrLineTooLong = fmt.Errorf("%w: a line longer than %d bytes", ErrFormat, maxLine)

// lineLimit fails a read once more than maxLine bytes pass without a line
// break.
type lineLimit struct {
	r   io.Reader
	run int
}

func (l *lineLimit) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	for _, c := range p[:n] {
		if c == '\n' {
			l.run = 0
		} else if l.run++; l.run > maxLine {
			return 0, ErrLineTooLong
		}
	}
	return n, err
}

// maxField bounds one field: every id and amount is short; a longer field
// means the file is not what it claims to be.
const maxField = 1024

// formatErr wraps ErrFormat with the line and what is wrong.
func formatErr(line int, format string, args ...any) error {
	return fmt.Errorf("%w: line %d: %s", ErrFormat, line, fmt.Sprintf(format, args...))
}

// readErr reports a failed read: a CSV that does not parse is ErrFormat;
// anything else (the connection, a check of the file as a whole) is passed
// on as it is.
func readErr(line int, err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) || errors.Is(err, ErrLineTooLong) {
		return formatErr(line, "%v", err)
	}
	return fmt.Errorf("line %d: %w", line, err)
}

// normalizeHeader makes a header cell comparable: no BOM, no backtick, no
// white space around it, full-width parentheses as ASCII ones.
func normalizeHeader(s string) string {
	s = strings.TrimPrefix(s, "\ufeff")
	s = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s), "`"))
	return strings.NewReplacer("（", "(", "）", ")").Replace(s)
}

// cleanField is a data cell as its value: the BOM, WeChat's backtick
// prefix and the padding (Alipay pads with tabs) removed.
func cleanField(s string) string {
	s = strings.TrimPrefix(s, "\ufeff")
	return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s), "`"))
}

// columns maps the wanted header names to their positions in header.
// Every name of want must be present exactly once.
func columns(header []string, line int, want ...string) (map[string]int, error) {
	at := make(map[string]int, len(want))
	for _, w := range want {
		at[w] = -1
	}
	for i, h := range header {
		name := normalizeHeader(h)
		if pos, ok := at[name]; ok {
			if pos >= 0 {
				return nil, formatErr(line, "column %q appears twice", name)
			}
			at[name] = i
		}
	}
	for _, w := range want {
		if at[w] < 0 {
			return nil, formatErr(line, "no column %q", w)
		}
	}
	return at, nil
}

// FeeScale is the decimals of a fee: WeChat prints fees to five decimals
// of a yuan. Row.Fee and Totals.Fees count 10^-5 yuan.
const FeeScale = 5

// ParseYuan converts a yuan amount as statements print it ("19.99",
// "-0.50", "0") to minor units (fen), exactly: an optional sign, digits,
// at most two decimals. Thousands separators, exponents, currency signs,
// blanks and a third decimal are refused, never rounded.
func ParseYuan(s string) (int64, bool) { return parseDecimal(s, 2) }

// parseDecimal converts a signed decimal to an integer count of
// 10^-scale, exactly: more decimals than scale are refused.
func parseDecimal(s string, scale int) (int64, bool) {
	neg := false
	if strings.HasPrefix(s, "-") {
		neg, s = true, s[1:]
	} else if strings.HasPrefix(s, "+") {
		s = s[1:]
	}
	whole, frac, dot := strings.Cut(s, ".")
	if whole == "" || dot && frac == "" || len(whole) > 12 || len(frac) > scale {
		return 0, false
	}
	var n int64
	for _, c := range whole + frac {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	for range scale - len(frac) {
		n *= 10
	}
	if neg {
		n = -n
	}
	return n, true
}

// FenOfFee converts a fee sum in 10^-5 yuan to fen, half away from zero.
func FenOfFee(fee int64) int64 {
	if fee < 0 {
		return -FenOfFee(-fee)
	}
	return (fee + 500) / 1000
}

// checkID validates an id field: 1 to 64 printable ASCII characters, the
// rule the channel adapters apply to the same ids in callbacks.
func checkID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

// quote quotes a field for a message, shortened and made printable.
func quote(s string) string {
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "?")
	}
	return fmt.Sprintf("%q", s)
}
