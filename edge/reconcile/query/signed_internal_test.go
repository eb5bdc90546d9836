package query

import "testing"

// The signed content is the response object's text exactly as sent (white
// space and escapes kept); a repeated object or sign is refused, since
// which one was signed would be ambiguous.
func TestAlipaySigned(t *testing.T) {
	const obj = `{"code":"40004", "msg":"Business Failed","sub_msg":"\u4ea4\u6613\u4e0d\u5b58\u5728"}`
	content, sign, err := alipaySigned([]byte(`{"alipay_trade_query_response":`+obj+`,"sign":"c2ln"}`), "alipay_trade_query_response")
	if err != nil || content != obj || sign != "c2ln" {
		t.Fatalf("%q %q %v", content, sign, err)
	}
	for name, raw := range map[string]string{
		"object twice": `{"alipay_trade_query_response":` + obj + `,"sign":"c2ln","alipay_trade_query_response":{"code":"10000"}}`,
		"sign twice":   `{"alipay_trade_query_response":` + obj + `,"sign":"c2ln","sign":"b3RoZXI="}`,
		"no sign":      `{"alipay_trade_query_response":` + obj + `}`,
		"no object":    `{"error_response":` + obj + `,"sign":"c2ln"}`,
		"not JSON":     `<html>`,
		"sign number":  `{"alipay_trade_query_response":` + obj + `,"sign":1}`,
	} {
		if c, s, err := alipaySigned([]byte(raw), "alipay_trade_query_response"); err == nil {
			t.Errorf("%s: accepted %q %q", name, c, s)
		}
	}
}
