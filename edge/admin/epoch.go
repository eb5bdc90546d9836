package admin

import (
	"context"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"
)

// EpochBumper moves the cache epoch on: every cache entry written before
// stops answering, on every node, once its cache has re-read the epoch
// (about a second). *durable.Store satisfies it.
type EpochBumper interface {
	BumpCacheEpoch(ctx context.Context) (string, error)
}

// bumpEpoch serves POST /cache/epoch: an operator repaired claims or orders
// by hand, or restored Postgres or Redis, and no duplicate may be answered
// from what the cache held before. The body is ignored. The answer is the
// new epoch; each node switches to it within about a second.
func (a *Server) bumpEpoch(ctx *fasthttp.RequestCtx, d *Deps) {
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	epoch, err := d.CacheEpoch.BumpCacheEpoch(rctx)
	if err != nil {
		a.log.Error("bump cache epoch", "error", err)
		jsonError(ctx, http.StatusServiceUnavailable, "cache epoch not bumped: Postgres unavailable; retry")
		return
	}
	a.log.Warn("cache epoch bumped: every node answers from Postgres until its cache refills", "epoch", epoch)
	writeJSON(ctx, http.StatusOK, struct {
		Epoch string `json:"epoch"`
	}{epoch})
}
