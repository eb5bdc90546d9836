package console_test

import (
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/notifyedge/notifyedge/edge/admin/console"
)

func serve(method, path string) *fasthttp.Response {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod(method)
	ctx.Request.SetRequestURI(path)
	console.Serve(&ctx)
	var resp fasthttp.Response
	ctx.Response.CopyTo(&resp)
	return &resp
}

// The page and its files come from the binary, each with the policy; no
// other path is served, and only GET and HEAD are taken.
func TestServe(t *testing.T) {
	for path, ctype := range map[string]string{"/ui/": "text/html", "/ui/app.js": "javascript", "/ui/app.css": "text/css"} {
		resp := serve("GET", path)
		if resp.StatusCode() != 200 || !strings.Contains(string(resp.Header.ContentType()), ctype) || len(resp.Body()) == 0 {
			t.Errorf("%s: %d %s", path, resp.StatusCode(), resp.Header.ContentType())
		}
		if got := string(resp.Header.Peek("Content-Security-Policy")); got != console.Policy {
			t.Errorf("%s: policy %q", path, got)
		}
		if string(resp.Header.Peek("X-Content-Type-Options")) != "nosniff" {
			t.Errorf("%s: no nosniff", path)
		}
	}
	for _, path := range []string{"/ui/nope.js", "/ui/../admin.go", "/ui/static/app.js", "/ui/.hidden"} {
		if c := serve("GET", path).StatusCode(); c != 404 {
			t.Errorf("%s: %d, want 404", path, c)
		}
	}
	if resp := serve("GET", "/ui"); resp.StatusCode() != 301 || !strings.HasSuffix(string(resp.Header.Peek("Location")), "/ui/") {
		t.Errorf("/ui: %d %s", resp.StatusCode(), resp.Header.Peek("Location"))
	}
	if c := serve("POST", "/ui/").StatusCode(); c != 405 {
		t.Errorf("POST: %d, want 405", c)
	}
	if !console.Owns([]byte("/ui/x")) || !console.Owns([]byte("/ui")) || console.Owns([]byte("/uix")) || console.Owns([]byte("/review")) {
		t.Error("Owns")
	}
	// The page's script never writes markup.
	js := string(serve("GET", "/ui/app.js").Body())
	for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("} {
		if strings.Contains(js, bad) {
			t.Errorf("app.js uses %s", bad)
		}
	}
}
