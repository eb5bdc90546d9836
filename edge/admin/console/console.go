// Package console serves the operators' web page on the admin listener:
// the review queue, an order's history, and the node's status, as static
// files embedded in the binary. The page holds no data of its own: it
// calls the admin API from the browser with the token the operator signs
// in with, in the Authorization header, so it opens nothing the API does
// not, and another site cannot make a signed-in browser act (no cookie
// carries the token).
package console

import (
	"embed"
	"mime"
	"net/http"
	"path"
	"strings"

	"github.com/valyala/fasthttp"
)

//go:embed static
var static embed.FS

// Prefix is the path the console is served under.
const Prefix = "/ui/"

// Policy is the page's Content-Security-Policy: its own scripts, styles and
// API calls only; no inline script or style, no plugin, no frame, no form
// posted anywhere, no base URL. Whatever a callback carried is shown as
// text, and were it ever taken for markup, it could run nothing.
const Policy = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Owns reports whether the console serves the raw path p, as the client
// sent it ("/ui" or under "/ui/"). Never a decoded or normalized path: the
// orders API routes on the raw one, so "/orders/..%2Fui%2F" is an order
// number, never the console.
func Owns(p []byte) bool {
	return string(p) == "/ui" || strings.HasPrefix(string(p), Prefix)
}

// Serve answers a request for a path Owns: GET or HEAD of the page or one
// of its files.
func Serve(ctx *fasthttp.RequestCtx) {
	p := string(ctx.Request.URI().PathOriginal())
	if p == "/ui" {
		// A path, not a URL: a redirect built from the Host header would
		// send the browser wherever that header says.
		ctx.Response.Header.Set("Location", Prefix)
		ctx.SetStatusCode(http.StatusMovedPermanently)
		return
	}
	if !ctx.IsGet() && !ctx.IsHead() {
		ctx.Response.Header.Set("Allow", "GET, HEAD")
		ctx.Error("method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name := strings.TrimPrefix(p, Prefix)
	if name == "" {
		name = "index.html"
	}
	if strings.Contains(name, "/") || strings.HasPrefix(name, ".") {
		ctx.Error("not found", http.StatusNotFound)
		return
	}
	b, err := static.ReadFile("static/" + name)
	if err != nil {
		ctx.Error("not found", http.StatusNotFound)
		return
	}
	h := &ctx.Response.Header
	h.Set("Content-Security-Policy", Policy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cache-Control", "no-cache")
	ctype := mime.TypeByExtension(path.Ext(name))
	if ctype == "" {
		ctype = "application/octet-stream"
	}
	ctx.SetContentType(ctype)
	ctx.SetBody(b)
}
