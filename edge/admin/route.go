package admin

import (
	"bytes"
	"net/http"
	"net/url"
	"strconv"
)

// endpoint is one admin endpoint.
type endpoint uint8

// The admin endpoints.
const (
	epNone endpoint = iota // no such path: 404
	epMetrics
	epHealthz
	epReadyz
	epReviews       // GET /review
	epReviewResolve // POST /review/{id}/resolve
	epReviewRedrive // POST /review/{id}/redrive
	epOrder         // PUT, PATCH, GET /orders/{order_no}
	epOrderEvents   // POST /orders/{order_no}/events
	epOrderRecon    // POST /orders/{order_no}/reconcile
	epReload        // POST /reload
	epCacheEpoch    // POST /cache/epoch
	epBills         // GET /bills
	epBillRun       // GET, POST /bills/{channel}/{date}
)

// adminRoute is a parsed admin request line.
type adminRoute struct {
	ep endpoint
	// allowed is the Allow value when the method is not one the endpoint
	// takes ("" when it is).
	allowed string
	// id is the review id of /review/{id}/...; orderNo the decoded
	// {order_no} of /orders/{order_no}...
	id      int64
	orderNo string
	// channel and date of /bills/{channel}/{date}.
	channel, date string
}

// parseAdminRoute routes on the raw path as the client sent it, split on
// "/" and percent-decoded once per segment: order numbers may hold "/",
// "?", "#", "%" and spaces, percent-encoded, which a normalized path would
// have turned into other routes. Nothing is sliced by offset, so no path
// can make it panic (a fuzz target checks). An empty segment is no route:
// "/review//resolve" is 404, not review "".
func parseAdminRoute(method, rawPath []byte) adminRoute {
	segs, ok := splitPath(rawPath)
	if !ok {
		return adminRoute{}
	}
	var r adminRoute
	want := ""
	switch {
	case len(segs) == 1 && string(segs[0]) == "metrics":
		r.ep, want = epMetrics, "GET, HEAD"
	case len(segs) == 1 && string(segs[0]) == "healthz":
		r.ep, want = epHealthz, "GET, HEAD"
	case len(segs) == 1 && string(segs[0]) == "readyz":
		r.ep, want = epReadyz, "GET, HEAD"
	case len(segs) == 1 && string(segs[0]) == "review":
		r.ep, want = epReviews, "GET, HEAD"
	case len(segs) == 3 && string(segs[0]) == "review" && (string(segs[2]) == "resolve" || string(segs[2]) == "redrive"):
		id, err := strconv.ParseInt(string(segs[1]), 10, 64)
		if err != nil || id < 1 {
			return adminRoute{}
		}
		r.ep, r.id, want = epReviewResolve, id, http.MethodPost
		if string(segs[2]) == "redrive" {
			r.ep = epReviewRedrive
		}
	case len(segs) == 2 && string(segs[0]) == "orders":
		no, ok := unescapeSegment(segs[1])
		if !ok {
			return adminRoute{}
		}
		r.ep, r.orderNo, want = epOrder, no, "GET, HEAD, PUT, PATCH"
	case len(segs) == 3 && string(segs[0]) == "orders" && (string(segs[2]) == "events" || string(segs[2]) == "reconcile"):
		no, ok := unescapeSegment(segs[1])
		if !ok {
			return adminRoute{}
		}
		r.ep, r.orderNo, want = epOrderEvents, no, http.MethodPost
		if string(segs[2]) == "reconcile" {
			r.ep = epOrderRecon
		}
	case len(segs) == 1 && string(segs[0]) == "reload":
		r.ep, want = epReload, http.MethodPost
	case len(segs) == 2 && string(segs[0]) == "cache" && string(segs[1]) == "epoch":
		r.ep, want = epCacheEpoch, http.MethodPost
	case len(segs) == 1 && string(segs[0]) == "bills":
		r.ep, want = epBills, "GET, HEAD"
	case len(segs) == 3 && string(segs[0]) == "bills":
		ch, ok1 := unescapeSegment(segs[1])
		date, ok2 := unescapeSegment(segs[2])
		if !ok1 || !ok2 {
			return adminRoute{}
		}
		r.ep, r.channel, r.date, want = epBillRun, ch, date, "GET, HEAD, POST"
	default:
		return adminRoute{}
	}
	if !methodIn(method, want) {
		r.allowed = want
	}
	return r
}

// splitPath splits "/a/b" into its segments; false for a path that does
// not start with "/" or has an empty segment (a trailing "/" included).
func splitPath(p []byte) ([][]byte, bool) {
	if len(p) < 2 || p[0] != '/' {
		return nil, false
	}
	segs := bytes.Split(p[1:], []byte("/"))
	for _, s := range segs {
		if len(s) == 0 {
			return nil, false
		}
	}
	return segs, true
}

// unescapeSegment percent-decodes one path segment, once.
func unescapeSegment(s []byte) (string, bool) {
	v, err := url.PathUnescape(string(s))
	return v, err == nil && v != ""
}

// methodIn reports whether method is one of the comma-separated list.
func methodIn(method []byte, list string) bool {
	for m := range bytes.SplitSeq([]byte(list), []byte(", ")) {
		if bytes.Equal(m, method) {
			return true
		}
	}
	return false
}
