package channel

import (
	"bytes"
	"unicode/utf8"
)

// The generic channel's body, parsed strictly and without reflection:
//
//	{"channel_txn_id":"...","event_type":"PAY_SUCCESS","order_no":"...","amount":1999,"currency":"CNY"}
//
// One JSON object; a repeated top-level key is refused; unknown fields are
// skipped (but must be valid JSON); strings may use JSON escapes, and the
// decoded value is what the field rules check and the digest covers.

const (
	maxTopLevelKeys = 64
	maxDepth        = 32
	maxSafeInteger  = 1<<53 - 1
)

var (
	keyChannelTxnID = []byte("channel_txn_id")
	keyEventType    = []byte("event_type")
	keyOrderNo      = []byte("order_no")
	keyAmount       = []byte("amount")
	keyCurrency     = []byte("currency")
	keyRefundID     = []byte("refund_id")
	keyRefundAmount = []byte("refund_amount")
)

// parseGenericBody fills d's business fields from body. The slices it sets
// alias body or d's scratch: request-scoped.
func parseGenericBody(body []byte, d *Delivery) *Reject {
	if !utf8.Valid(body) {
		return badRequest("body: not valid UTF-8")
	}
	s := scanner{b: body}
	s.ws()
	if !s.eat('{') {
		return badRequest("body: must be one JSON object")
	}
	const (
		haveTxn = 1 << iota
		haveEvent
		haveOrder
		haveAmount
		haveCurrency
		haveAll = haveTxn | haveEvent | haveOrder | haveAmount | haveCurrency
	)
	var have int
	var event []byte
	haveRefundAmount := false
	s.ws()
	if !s.eat('}') {
		for {
			s.ws()
			if s.peek() != '"' {
				return badRequest("body: expected a field name")
			}
			key, ok := s.str(&d.scratch)
			if !ok {
				return badRequest("body: malformed field name")
			}
			for _, k := range d.keys {
				if bytes.Equal(k, key) {
					return badRequest("%s: repeated field", printable(key))
				}
			}
			if len(d.keys) == maxTopLevelKeys {
				return badRequest("body: more than %d fields", maxTopLevelKeys)
			}
			d.keys = append(d.keys, key)
			s.ws()
			if !s.eat(':') {
				return badRequest("body: expected ':' after %s", printable(key))
			}
			s.ws()
			switch {
			case bytes.Equal(key, keyChannelTxnID):
				if d.TxnID, ok = s.field(&d.scratch); !ok || !printableASCII(d.TxnID, 64) {
					return badRequest("channel_txn_id: must be a string of 1 to 64 printable ASCII characters")
				}
				have |= haveTxn
			case bytes.Equal(key, keyOrderNo):
				if d.OrderNo, ok = s.field(&d.scratch); !ok || !printableASCII(d.OrderNo, 64) {
					return badRequest("order_no: must be a string of 1 to 64 printable ASCII characters")
				}
				have |= haveOrder
			case bytes.Equal(key, keyEventType):
				if event, ok = s.field(&d.scratch); !ok {
					return badRequest("event_type: must be a string")
				}
				have |= haveEvent
			case bytes.Equal(key, keyCurrency):
				if d.Currency, ok = s.field(&d.scratch); !ok || !isCurrency(d.Currency) {
					return badRequest("currency: must be three upper-case letters")
				}
				have |= haveCurrency
			case bytes.Equal(key, keyAmount):
				if d.Amount, ok = s.amount(); !ok {
					return badRequest("amount: must be a positive integer in minor units, at most 2^53-1")
				}
				have |= haveAmount
			case bytes.Equal(key, keyRefundID):
				if d.RefundID, ok = s.field(&d.scratch); !ok || !printableASCII(d.RefundID, 64) {
					return badRequest("refund_id: must be a string of 1 to 64 printable ASCII characters")
				}
			case bytes.Equal(key, keyRefundAmount):
				if d.RefundAmount, ok = s.amount(); !ok {
					return badRequest("refund_amount: must be a positive integer in minor units, at most 2^53-1")
				}
				haveRefundAmount = true
			default:
				if !s.skip(0) {
					return badRequest("%s: malformed value", printable(key))
				}
			}
			s.ws()
			if s.eat(',') {
				continue
			}
			if s.eat('}') {
				break
			}
			return badRequest("body: expected ',' or '}'")
		}
	}
	s.ws()
	if s.i != len(s.b) {
		return badRequest("body: data after the JSON object")
	}
	if have != haveAll {
		for _, m := range []struct {
			bit  int
			name string
		}{{haveTxn, "channel_txn_id"}, {haveEvent, "event_type"}, {haveOrder, "order_no"}, {haveAmount, "amount"}, {haveCurrency, "currency"}} {
			if have&m.bit == 0 {
				return badRequest("%s: missing", m.name)
			}
		}
	}
	if !channelEvent(event) {
		return badRequest("event_type: must be one of PAY_SUCCESS, PAY_CLOSED, REFUND_SUCCESS, REFUND_FAILED, TRADE_CLOSED")
	}
	return refundFields(d, event, haveRefundAmount)
}

// refundFields applies the refund rules to the parsed fields: refund_id and
// refund_amount belong to refund events only; refund_amount needs a
// refund_id (without one the event is a full refund, as it always was) and
// is at most amount; refund_id alone refunds the whole amount.
func refundFields(d *Delivery, event []byte, haveRefundAmount bool) *Reject {
	if !IsRefund(event) {
		if len(d.RefundID) > 0 || haveRefundAmount {
			return badRequest("refund_id, refund_amount: only for REFUND_SUCCESS and REFUND_FAILED")
		}
		d.Event = event
		return nil
	}
	switch {
	case haveRefundAmount && len(d.RefundID) == 0:
		return badRequest("refund_amount: needs a refund_id (without one the refund is of the whole amount)")
	case !haveRefundAmount:
		d.RefundAmount = d.Amount
	case d.RefundAmount > d.Amount:
		return badRequest("refund_amount: at most amount")
	}
	d.Event = event
	return nil
}

// scanner walks a JSON document.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) eat(c byte) bool {
	if s.peek() == c {
		s.i++
		return true
	}
	return false
}

// field reads a string value (ok false for any other type).
func (s *scanner) field(scratch *[]byte) ([]byte, bool) {
	if s.peek() != '"' {
		return nil, false
	}
	return s.str(scratch)
}

// str reads a JSON string at s.i (which must be '"'). Without escapes it
// returns a slice of the input; with escapes it decodes into *scratch and
// returns that part of it.
func (s *scanner) str(scratch *[]byte) ([]byte, bool) {
	s.i++ // opening quote
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			out := s.b[start:s.i]
			s.i++
			return out, true
		case c == '\\':
			return s.escaped(start, scratch)
		case c < 0x20:
			return nil, false
		}
		s.i++
	}
	return nil, false
}

func (s *scanner) escaped(start int, scratch *[]byte) ([]byte, bool) {
	buf := *scratch
	from := len(buf)
	buf = append(buf, s.b[start:s.i]...)
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			*scratch = buf
			return buf[from:], true
		case c < 0x20:
			return nil, false
		case c != '\\':
			buf = append(buf, c)
			s.i++
			continue
		}
		if s.i+1 >= len(s.b) {
			return nil, false
		}
		e := s.b[s.i+1]
		s.i += 2
		switch e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, ok := s.hex4()
			if !ok {
				return nil, false
			}
			if 0xd800 <= r && r < 0xdc00 { // high surrogate: a low one must follow
				if s.i+1 >= len(s.b) || s.b[s.i] != '\\' || s.b[s.i+1] != 'u' {
					return nil, false
				}
				s.i += 2
				lo, ok := s.hex4()
				if !ok || lo < 0xdc00 || lo >= 0xe000 {
					return nil, false
				}
				r = 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00)
			} else if 0xdc00 <= r && r < 0xe000 {
				return nil, false
			}
			buf = utf8.AppendRune(buf, r)
		default:
			return nil, false
		}
	}
	return nil, false
}

func (s *scanner) hex4() (rune, bool) {
	if s.i+4 > len(s.b) {
		return 0, false
	}
	var r rune
	for _, c := range s.b[s.i : s.i+4] {
		var v byte
		switch {
		case '0' <= c && c <= '9':
			v = c - '0'
		case 'a' <= c && c <= 'f':
			v = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(v)
	}
	s.i += 4
	return r, true
}

// amount reads the README's amount: an integer literal [1-9][0-9]* no
// larger than 2^53-1, and nothing else (no sign, fraction or exponent).
func (s *scanner) amount() (int64, bool) {
	start := s.i
	var n int64
	for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		n = n*10 + int64(s.b[s.i]-'0')
		if n > maxSafeInteger {
			return 0, false
		}
		s.i++
	}
	if s.i == start || s.b[start] == '0' {
		return 0, false
	}
	switch s.peek() {
	case ',', '}', ' ', '\t', '\n', '\r':
		return n, true
	}
	return 0, false
}

// skip passes over one JSON value, checking its syntax.
func (s *scanner) skip(depth int) bool {
	if depth > maxDepth {
		return false
	}
	var discard []byte
	switch c := s.peek(); {
	case c == '"':
		_, ok := s.str(&discard)
		return ok
	case c == '{' || c == '[':
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		s.i++
		s.ws()
		if s.eat(end) {
			return true
		}
		for {
			s.ws()
			if c == '{' {
				if s.peek() != '"' {
					return false
				}
				if _, ok := s.str(&discard); !ok {
					return false
				}
				s.ws()
				if !s.eat(':') {
					return false
				}
				s.ws()
			}
			if !s.skip(depth + 1) {
				return false
			}
			s.ws()
			if s.eat(end) {
				return true
			}
			if !s.eat(',') {
				return false
			}
		}
	case c == '-' || '0' <= c && c <= '9':
		return s.number()
	default:
		for _, lit := range [...]string{"true", "false", "null"} {
			if bytes.HasPrefix(s.b[s.i:], []byte(lit)) {
				s.i += len(lit)
				return true
			}
		}
		return false
	}
}

// number passes over a JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() bool {
	digits := func() int {
		n := 0
		for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	s.eat('-')
	if s.eat('0') {
		if c := s.peek(); '0' <= c && c <= '9' {
			return false
		}
	} else if digits() == 0 {
		return false
	}
	if s.eat('.') && digits() == 0 {
		return false
	}
	if s.eat('e') || s.eat('E') {
		if !s.eat('+') {
			s.eat('-')
		}
		if digits() == 0 {
			return false
		}
	}
	return true
}
