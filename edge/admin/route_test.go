package admin

import (
	"net/url"
	"testing"
)

func TestParseAdminRoute(t *testing.T) {
	for _, c := range []struct {
		method, path string
		ep           endpoint
		allowed      string
		id           int64
		order        string
	}{
		{"GET", "/metrics", epMetrics, "", 0, ""},
		{"POST", "/metrics", epMetrics, "GET, HEAD", 0, ""},
		{"GET", "/review", epReviews, "", 0, ""},
		{"POST", "/review/42/resolve", epReviewResolve, "", 42, ""},
		{"POST", "/review/9223372036854775807/redrive", epReviewRedrive, "", 9223372036854775807, ""},
		{"GET", "/review/42/resolve", epReviewResolve, "POST", 42, ""},
		{"POST", "/review/resolve", epNone, "", 0, ""},
		{"POST", "/review//resolve", epNone, "", 0, ""},
		{"POST", "/review/0/resolve", epNone, "", 0, ""},
		{"POST", "/review/-1/resolve", epNone, "", 0, ""},
		{"POST", "/review/1/resolve/", epNone, "", 0, ""},
		{"GET", "/orders/O1", epOrder, "", 0, "O1"},
		{"PUT", "/orders/a%2Fb%3Fc%23d%25e%20f", epOrder, "", 0, "a/b?c#d%e f"},
		{"POST", "/orders/a%2Fb/events", epOrderEvents, "", 0, "a/b"},
		{"DELETE", "/orders/O1", epOrder, "GET, HEAD, PUT, PATCH", 0, "O1"},
		{"GET", "/orders/a/b", epNone, "", 0, ""},
		{"GET", "/orders/%zz", epNone, "", 0, ""},
		{"GET", "/orders/", epNone, "", 0, ""},
		{"POST", "/reload", epReload, "", 0, ""},
		{"POST", "/cache/epoch", epCacheEpoch, "", 0, ""},
		{"GET", "", epNone, "", 0, ""},
		{"GET", "metrics", epNone, "", 0, ""},
		{"GET", "/bills", epBills, "", 0, ""},
		{"POST", "/bills", epBills, "GET, HEAD", 0, ""},
		{"POST", "/bills/wx/2026-12-05", epBillRun, "", 0, ""},
		{"DELETE", "/bills/wx/2026-12-05", epBillRun, "GET, HEAD, POST", 0, ""},
		{"GET", "/bills/wx", epNone, "", 0, ""},
		{"GET", "/bills//2026-12-05", epNone, "", 0, ""},
	} {
		r := parseAdminRoute([]byte(c.method), []byte(c.path))
		if r.ep != c.ep || r.allowed != c.allowed || r.id != c.id || r.orderNo != c.order {
			t.Errorf("%s %s: %+v, want ep %d allowed %q id %d order %q", c.method, c.path, r, c.ep, c.allowed, c.id, c.order)
		}
	}
	if r := parseAdminRoute([]byte("POST"), []byte("/bills/w%20x/2026-12-05")); r.channel != "w x" || r.date != "2026-12-05" {
		t.Errorf("bill run route %+v", r)
	}
}

// FuzzAdminRoute: no method or raw path makes the router panic, and any
// order number, percent-encoded into the path, routes back to itself.
func FuzzAdminRoute(f *testing.F) {
	for _, s := range []string{"/review/1/resolve", "/review//resolve", "/orders/a%2Fb/events", "/orders/%", "//", "/", ""} {
		f.Add("POST", s, "O/1?#% x")
	}
	f.Fuzz(func(t *testing.T, method, path, orderNo string) {
		r := parseAdminRoute([]byte(method), []byte(path))
		if r.ep == epNone && (r.allowed != "" || r.id != 0 || r.orderNo != "") {
			t.Fatalf("no route but %+v", r)
		}
		if orderNo == "" {
			return
		}
		for _, suffix := range []string{"", "/events"} {
			p := "/orders/" + url.PathEscape(orderNo) + suffix
			got := parseAdminRoute([]byte("GET"), []byte(p))
			if got.orderNo != orderNo {
				t.Fatalf("%q routed to order %q, want %q (%+v)", p, got.orderNo, orderNo, got)
			}
		}
	})
}
