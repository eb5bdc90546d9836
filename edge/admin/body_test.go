package admin

import (
	"encoding/json"
	"testing"
)

// FuzzAdminBody: no body makes decodeStrict panic, every refusal names a
// field, and what it accepts is one JSON object whose keys are the
// fields, each once, decoded as encoding/json decodes it.
func FuzzAdminBody(f *testing.F) {
	for _, s := range []string{`{"event":"SHIP","request_id":"r"}`, `{"event":"SHIP","event":"CLOSE"}`, `{"Event":"SHIP"}`,
		`{"event":1}`, `[]`, `{} {}`, `{"request_id":"\u0000"}`, `{"event":"SHIP","x":{"y":[1,2]}}`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var got struct {
			Event     string `json:"event"`
			RequestID string `json:"request_id"`
		}
		err := decodeStrict(body, &got)
		if err != nil {
			if fe, ok := err.(*fieldError); !ok || fe.field == "" {
				t.Fatalf("%q: error %v names no field", body, err)
			}
			return
		}
		var keys map[string]json.RawMessage
		if json.Unmarshal(body, &keys) != nil {
			t.Fatalf("%q accepted, but it is not one JSON object", body)
		}
		for k := range keys {
			if k != "event" && k != "request_id" {
				t.Fatalf("%q accepted with the key %q", body, k)
			}
		}
		var want struct {
			Event     string `json:"event"`
			RequestID string `json:"request_id"`
		}
		if json.Unmarshal(body, &want) != nil || want != got {
			t.Fatalf("%q decoded as %+v, encoding/json says %+v", body, got, want)
		}
	})
}
