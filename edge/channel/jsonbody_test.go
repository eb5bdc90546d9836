package channel

import (
	"strings"
	"testing"
)

func TestParseGenericBody(t *testing.T) {
	ok := func(in, txn, event, order string, amount int64, currency string) {
		t.Helper()
		var d Delivery
		if rej := parseGenericBody([]byte(in), &d); rej != nil {
			t.Errorf("%s: rejected: %s", in, rej.Message)
			return
		}
		if string(d.TxnID) != txn || string(d.Event) != event || string(d.OrderNo) != order || d.Amount != amount || string(d.Currency) != currency {
			t.Errorf("%s: got %q %q %q %d %q", in, d.TxnID, d.Event, d.OrderNo, d.Amount, d.Currency)
		}
	}
	bad := func(in, msgPrefix string) {
		t.Helper()
		var d Delivery
		rej := parseGenericBody([]byte(in), &d)
		if rej == nil {
			t.Errorf("%s: accepted", in)
			return
		}
		if rej.Kind != BadRequest || !strings.HasPrefix(rej.Message, msgPrefix) {
			t.Errorf("%s: %v %q, want bad_request %q...", in, rej.Kind, rej.Message, msgPrefix)
		}
	}
	const base = `"channel_txn_id":"T1","event_type":"PAY_SUCCESS","order_no":"O1","currency":"CNY"`
	ok(`{`+base+`,"amount":1999}`, "T1", "PAY_SUCCESS", "O1", 1999, "CNY")
	ok(` {`+base+`,"amount":9007199254740991 } `, "T1", "PAY_SUCCESS", "O1", 9007199254740991, "CNY")
	ok(`{`+base+`,"amount":1,"x":[{},[],"",0,-1.5e+3,true,false,null,{"a":{"b":[1]}}]}`, "T1", "PAY_SUCCESS", "O1", 1, "CNY")
	ok(`{"channel_txn_id":"\u0054\u0031","event_type":"REFUND_SUCCESS","order_no":"O\"1","amount":5,"currency":"USD"}`, "T1", "REFUND_SUCCESS", `O"1`, 5, "USD")
	ok(`{"channel_txn_id":"`+strings.Repeat("9", 64)+`","event_type":"TRADE_CLOSED","order_no":"~!","amount":5,"currency":"USD"}`, strings.Repeat("9", 64), "TRADE_CLOSED", "~!", 5, "USD")

	for _, amount := range []string{`0`, `-5`, `19.99`, `1999.0`, `1e3`, `"1999"`, `01999`, `9007199254740992`, `99999999999999999999`, `null`, `true`, `1999e`, `+1`} {
		bad(`{`+base+`,"amount":`+amount+`}`, "amount:")
	}
	bad(`{"event_type":"PAY_SUCCESS","order_no":"O1","currency":"CNY","amount":1}`, "channel_txn_id: missing")
	bad(`{"channel_txn_id":"T1","order_no":"O1","currency":"CNY","amount":1}`, "event_type: missing")
	bad(`{`+base+`}`, "amount: missing")
	bad(`{`+base+`,"amount":1,"amount":1}`, "amount: repeated field")
	bad(`{`+base+`,"amount":1,"x":1,"x":2}`, "x: repeated field")
	bad(`{`+base+`,"amount":1,"\u0078":1,"x":2}`, "x: repeated field")
	bad(`{"channel_txn_id":"","event_type":"PAY_SUCCESS","order_no":"O1","currency":"CNY","amount":1}`, "channel_txn_id:")
	bad(`{"channel_txn_id":"T 1","event_type":"PAY_SUCCESS","order_no":"O1","currency":"CNY","amount":1}`, "channel_txn_id:")
	bad(`{"channel_txn_id":"`+strings.Repeat("9", 65)+`","event_type":"PAY_SUCCESS","order_no":"O1","currency":"CNY","amount":1}`, "channel_txn_id:")
	bad(`{"channel_txn_id":"T\u00e91","event_type":"PAY_SUCCESS","order_no":"O1","currency":"CNY","amount":1}`, "channel_txn_id:")
	bad(`{"channel_txn_id":7,"event_type":"PAY_SUCCESS","order_no":"O1","currency":"CNY","amount":1}`, "channel_txn_id:")
	bad(`{"channel_txn_id":"T1","event_type":"PAY_SUCCESS","order_no":"O1","currency":"cny","amount":1}`, "currency:")
	bad(`{"channel_txn_id":"T1","event_type":"PAY_SUCCESS","order_no":"O1","currency":"CNYX","amount":1}`, "currency:")
	bad(`{"channel_txn_id":"T1","event_type":"SHIP","order_no":"O1","currency":"CNY","amount":1}`, "event_type:")
	bad(`{"channel_txn_id":"T1","event_type":"pay_success","order_no":"O1","currency":"CNY","amount":1}`, "event_type:")
	bad(`[`+base+`]`, "body: must be one JSON object")
	bad(``, "body: must be one JSON object")
	bad(`{`+base+`,"amount":1}{}`, "body: data after")
	bad(`{`+base+`,"amount":1,}`, "body: expected a field name")
	bad(`{`+base+`,"amount":1,"x":1`, "body: expected ',' or '}'")
	bad(`{`+base+`,"amount":1`, "amount:") // an integer must end at a delimiter
	bad(`{`+base+`,"amount":1,"x":[1,2}`, "x: malformed value")
	bad(`{`+base+`,"amount":1,"x":"\q"}`, "x: malformed value")
	bad(`{`+base+`,"amount":1,"x":"\ud800"}`, "x: malformed value")
	bad(`{`+base+`,"amount":1,"x":`+strings.Repeat("[", 40)+strings.Repeat("]", 40)+`}`, "x: malformed value")
	bad("{"+base+",\"amount\":1,\"x\":\"a\x01b\"}", "x: malformed value")
	bad("{"+base+",\"amount\":1,\"x\":\"\xff\"}", "body: not valid UTF-8")
	bad(`{`+base+`,"amount":1,"x":01}`, "x: malformed value")
	bad(`{`+base+`,"amount":1,"x":tru}`, "x: malformed value")
	many := `{` + base + `,"amount":1`
	for i := range 70 {
		many += `,"k` + strings.Repeat("z", i) + `":1`
	}
	bad(many+`}`, "body: more than")
}
