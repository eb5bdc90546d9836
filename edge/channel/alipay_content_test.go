package channel_test

import (
	"net/url"
	"testing"

	"github.com/notifyedge/notifyedge/edge/channel"
)

// The signed content of an Alipay notification is built as Alipay's own
// Java SDK checks it (AlipaySignature.getSignCheckContentV1): sign and
// sign_type out, parameters with an empty or white-space-only value out,
// keys sorted, values as decoded. A no-break space is not white space to
// Java: that value stays.
func TestAlipaySignedContentFollowsAlipaysSDK(t *testing.T) {
	form := url.Values{
		"trade_no":     {"2026120322001"},
		"sign":         {"c2lnbg=="},
		"sign_type":    {"RSA2"},
		"body":         {""},
		"subject":      {" \t\r\n"},
		"buyer_id":     {"2088102"},
		"passback":     {"\u00a0"},
		"gmt_payment":  {"2026-12-03 10:00:00"},
		"out_trade_no": {"O-1"},
	}
	want := "buyer_id=2088102&gmt_payment=2026-12-03 10:00:00&out_trade_no=O-1&passback=\u00a0&trade_no=2026120322001"
	if got := channel.AlipaySignedContent(form); got != want {
		t.Errorf("content\n got %q\nwant %q", got, want)
	}
}
