package query

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

// Alipay hands out http:// links on its own hosts: fetched over https.
// Plain http elsewhere is refused but to a loopback fake.
func TestDownloadable(t *testing.T) {
	for raw, want := range map[string]string{
		"http://dwbillcenter.alipay.com/downloadBillFile.resource?bizType=trade&fileType=csv.zip": "https://dwbillcenter.alipay.com/downloadBillFile.resource?bizType=trade&fileType=csv.zip",
		"https://dwbillcenter.alipay.com/x":  "https://dwbillcenter.alipay.com/x",
		"http://127.0.0.1:8080/x?token=1":    "http://127.0.0.1:8080/x?token=1",
		"http://evil.example/x":              "",
		"http://alipay.com.evil.example/x":   "",
		"ftp://dwbillcenter.alipay.com/x":    "",
		"http://dwbillcenter.notalipay.com/": "",
	} {
		got, err := downloadable(raw)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("downloadable(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
}

// A failed download's error never quotes the link (it carries a token).
func TestWithoutURL(t *testing.T) {
	err := withoutURL(&url.Error{Op: "Get", URL: "https://x/y?token=secret", Err: errors.New("connection refused")})
	if strings.Contains(err.Error(), "secret") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("%v", err)
	}
}
