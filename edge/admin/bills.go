package admin

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/notifyedge/notifyedge/durable"
)

// BillBook serves the daily bills: a run asked for now, and the runs
// recorded.
type BillBook interface {
	// RunDay fetches and compares channel's statement of date
	// (YYYY-MM-DD) now and returns the recorded run whatever its state:
	// ErrNoBiller, ErrBillInProgress, or ErrBillFetch (the run is
	// recorded as error, and returned too).
	RunDay(ctx context.Context, channel, date string) (durable.BillRun, error)
	BillRuns(ctx context.Context, q durable.BillRunQuery) ([]durable.BillRun, error)
	// BillRunOf returns a run with its items; durable.ErrNoBillRun when
	// there is none.
	BillRunOf(ctx context.Context, channel, date string) (durable.BillRun, error)
}

// Errors a BillBook's RunDay reports.
var (
	// ErrNoBiller: no such channel, or it has no query credentials.
	ErrNoBiller = errors.New("admin: no channel of that name with query credentials")
	// ErrBillInProgress: a run of that day is in progress.
	ErrBillInProgress = errors.New("admin: a run of that day is in progress")
	// ErrBillFetch: the channel could not be reached, or its answer failed
	// verification.
	ErrBillFetch = errors.New("admin: the statement could not be fetched")
)

// billRunTimeout bounds POST /bills/{channel}/{date}: a statement of a
// million rows is fetched, compared and acted on within it.
const billRunTimeout = 30 * time.Minute

// validDate reports whether s is a YYYY-MM-DD date.
func validDate(s string) bool {
	_, err := time.Parse(time.DateOnly, s)
	return err == nil && len(s) == len(time.DateOnly)
}

// bills serves GET /bills?channel=&from=&to=.
func (a *Server) bills(ctx *fasthttp.RequestCtx, d *Deps) {
	args := ctx.QueryArgs()
	q := durable.BillRunQuery{Channel: string(args.Peek("channel")), From: string(args.Peek("from")), To: string(args.Peek("to"))}
	for name, v := range map[string]string{"from": q.From, "to": q.To} {
		if v != "" && !validDate(v) {
			jsonError(ctx, http.StatusBadRequest, name+": want YYYY-MM-DD")
			return
		}
	}
	if q.Channel != "" && !validID(q.Channel) {
		jsonError(ctx, http.StatusBadRequest, "channel: not a channel name")
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	runs, err := d.Bills.BillRuns(rctx, q)
	if err != nil {
		a.unavailable(ctx, "bills", err)
		return
	}
	if runs == nil {
		runs = []durable.BillRun{}
	}
	writeJSON(ctx, http.StatusOK, struct {
		Runs []durable.BillRun `json:"runs"`
	}{runs})
}

// billRun serves GET and POST /bills/{channel}/{date}.
func (a *Server) billRun(ctx *fasthttp.RequestCtx, d *Deps, channel, date string) {
	if !validDate(date) {
		jsonError(ctx, http.StatusBadRequest, "date: want YYYY-MM-DD")
		return
	}
	if !ctx.IsPost() {
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		run, err := d.Bills.BillRunOf(rctx, channel, date)
		switch {
		case errors.Is(err, durable.ErrNoBillRun):
			jsonError(ctx, http.StatusNotFound, "no run of channel "+channel+" for "+date)
		case err != nil:
			a.unavailable(ctx, "bill run", err)
		default:
			if run.Items == nil {
				run.Items = []durable.BillItem{}
			}
			writeJSON(ctx, http.StatusOK, run)
		}
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), billRunTimeout)
	defer cancel()
	run, err := d.Bills.RunDay(rctx, channel, date)
	switch {
	case errors.Is(err, ErrNoBiller):
		jsonError(ctx, http.StatusNotFound, "no channel "+channel+" with query credentials: its bills cannot be fetched")
	case errors.Is(err, ErrBillInProgress):
		jsonError(ctx, http.StatusConflict, "a run of channel "+channel+" for "+date+" is in progress; retry when it ends")
	case errors.Is(err, ErrBillFetch):
		a.log.Warn("bills: not fetched", "channel", channel, "date", date, "error", err.Error())
		jsonError(ctx, http.StatusBadGateway, run.Message)
	case err != nil:
		a.unavailable(ctx, "bill run", err)
	default:
		writeJSON(ctx, http.StatusOK, run)
	}
}
