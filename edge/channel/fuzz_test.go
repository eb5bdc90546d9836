package channel_test

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/edge/channel"
)

// headerMap is a HeaderReader for tests.
type headerMap map[string]string

func (h headerMap) Peek(name string) []byte { return []byte(h[name]) }

func (h headerMap) PeekAll(name string) [][]byte {
	if v, ok := h[name]; ok && v != "" {
		return [][]byte{[]byte(v)}
	}
	return nil
}

// headerBytes is a HeaderReader that, like fasthttp's, returns stored bytes.
type headerBytes map[string][]byte

func (h headerBytes) Peek(name string) []byte { return h[name] }

func (h headerBytes) PeekAll(name string) [][]byte {
	if v, ok := h[name]; ok && len(v) > 0 {
		return [][]byte{v}
	}
	return nil
}

const fuzzSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// FuzzNotify feeds the generic adapter's parse+verify with arbitrary
// headers and bodies. Half the time the body is correctly signed, so the
// fuzzer reaches the JSON parser. Whatever it accepts must satisfy the
// field rules and agree with encoding/json.
func FuzzNotify(f *testing.F) {
	now := time.Unix(1796200000, 0)
	g, err := channel.NewGeneric(channel.GenericConfig{Name: "acme", Secrets: []string{fuzzSecret}, Now: func() time.Time { return now }})
	if err != nil {
		f.Fatal(err)
	}
	valid := `{"channel_txn_id":"4200001234202612020000001","event_type":"PAY_SUCCESS","order_no":"O202612020001","amount":1999,"currency":"CNY"}`
	for _, seed := range []struct {
		body, id, ts, sig string
		sign              bool
	}{
		{valid, "msg_1", "1796200000", "", true},
		{valid, "msg_1", "1796200000", "v1,AAAA", false},
		{valid, "", "", "", false},
		{`{"channel_txn_id":"T\u0031","event_type":"REFUND_SUCCESS","order_no":"O","amount":1,"currency":"USD","x":[{"y":null}]}`, "m", "1796200100", "", true},
		{`{"amount":1e3}`, "m", "1796200000", "", true},
		{`{"a":1,"a":2}`, "m", "1796200000", "", true},
		{`[]`, "m", "1796199000", "", true},
		{"{\"channel_txn_id\":\"\xff\"}", "m", "1796200000", "", true},
		{valid, "m", "99999999999999999999", "v1,", false},
	} {
		f.Add([]byte(seed.body), seed.id, seed.ts, seed.sig, seed.sign)
	}
	f.Fuzz(func(t *testing.T, body []byte, id, ts, sig string, sign bool) {
		if sign {
			sec, err := strconv.ParseInt(ts, 10, 64)
			if err != nil {
				sec = now.Unix()
				ts = strconv.FormatInt(sec, 10)
			}
			sig, _ = channel.SignWebhook(fuzzSecret, id, sec, body)
		}
		req := channel.Request{
			Channel:     []byte("acme"),
			ContentType: []byte("application/json"),
			Body:        body,
			Header:      headerMap{"webhook-id": id, "webhook-timestamp": ts, "webhook-signature": sig},
		}
		var d channel.Delivery
		if rej := g.Parse(&req, &d); rej != nil {
			if rej.Kind != channel.BadSignature && rej.Kind != channel.BadRequest {
				t.Fatalf("rejection kind %v", rej.Kind)
			}
			return
		}
		if !channel.FieldRulesHold(&d) {
			t.Fatalf("accepted a delivery that breaks the field rules: %+v", d)
		}
		var std struct {
			TxnID    string      `json:"channel_txn_id"`
			Event    string      `json:"event_type"`
			OrderNo  string      `json:"order_no"`
			Amount   json.Number `json:"amount"`
			Currency string      `json:"currency"`
		}
		if err := json.Unmarshal(body, &std); err != nil {
			t.Fatalf("accepted what encoding/json refuses (%v): %q", err, body)
		}
		if std.TxnID != string(d.TxnID) || std.Event != string(d.Event) || std.OrderNo != string(d.OrderNo) ||
			std.Currency != string(d.Currency) || std.Amount.String() != strconv.FormatInt(d.Amount, 10) {
			t.Fatalf("disagrees with encoding/json: %+v vs %q %q %q %d %q", std, d.TxnID, d.Event, d.OrderNo, d.Amount, d.Currency)
		}
	})
}
