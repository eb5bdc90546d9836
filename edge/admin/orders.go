package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/channel"
)

// OrderStore is what the orders API reads and writes. *durable.Store
// satisfies it.
type OrderStore interface {
	PutOrder(ctx context.Context, orderNo string, amount int64, currency, channel string) (created bool, err error)
	PatchOrder(ctx context.Context, orderNo string, amount int64, currency string) error
	OrderHistory(ctx context.Context, orderNo string, limit int) (durable.OrderHistory, error)
	OrderEvent(ctx context.Context, orderNo string, e durable.Event, requestID string) (durable.Result, error)
}

// Redriver decides a stored delivery again. *Server satisfies it.
type Redriver interface {
	Redrive(ctx context.Context, channelName string, body []byte) (channel.Verdict, edge.Outcome, error)
}

// adminTimeout bounds an admin call to Postgres (the operator pool has its
// own statement timeout besides).
const adminTimeout = 5 * time.Second

// orderJSON is an order as GET /orders/{order_no} shows it.
type orderJSON struct {
	OrderNo        string    `json:"order_no"`
	Status         string    `json:"status"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	PaidBy         *string   `json:"paid_by"`
	RefundedAmount int64     `json:"refunded_amount"`
	UpdatedAt      time.Time `json:"updated_at"`
	// Channel is the channel the order system named at PUT (omitted when
	// none: every channel with query credentials is asked).
	Channel string         `json:"channel,omitempty"`
	Claims  []claimJSON    `json:"claims"`
	Refunds []refundJSON   `json:"refunds"`
	Events  []eventJSON    `json:"events"`
	Reviews []orderRevJSON `json:"reviews"`
	// Truncated: a list held more than the request's limit; its oldest
	// rows were left out.
	Truncated bool `json:"truncated,omitempty"`
}

// orderConflictJSON is a 409 of PUT or PATCH: why, and the order as it is.
type orderConflictJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	orderJSON
}

type claimJSON struct {
	BizKey    string    `json:"biz_key"`
	Outcome   string    `json:"outcome"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
}

type refundJSON struct {
	Trade     string    `json:"trade"`
	RefundID  string    `json:"refund_id"`
	Amount    int64     `json:"amount"`
	CreatedAt time.Time `json:"created_at"`
}

type eventJSON struct {
	ID          int64           `json:"id"`
	EventID     *string         `json:"event_id"`
	Topic       string          `json:"topic"`
	Payload     json.RawMessage `json:"payload"`
	CreatedAt   time.Time       `json:"created_at"`
	PublishedAt *time.Time      `json:"published_at"`
}

type orderRevJSON struct {
	ID         int64      `json:"id"`
	Reason     string     `json:"reason"`
	BizKey     string     `json:"biz_key"`
	CreatedAt  time.Time  `json:"created_at"`
	ResolvedAt *time.Time `json:"resolved_at"`
}

func toOrderJSON(h durable.OrderHistory) orderJSON {
	o := orderJSON{OrderNo: h.OrderNo, Status: string(h.Status), Amount: h.Amount, Currency: h.Currency,
		PaidBy: h.PaidBy, RefundedAmount: h.RefundedAmount, UpdatedAt: h.UpdatedAt.UTC(), Channel: h.Channel,
		Claims: []claimJSON{}, Refunds: []refundJSON{}, Events: []eventJSON{}, Reviews: []orderRevJSON{},
		Truncated: h.Truncated}
	for _, c := range h.Claims {
		o.Claims = append(o.Claims, claimJSON{c.BizKey, c.Outcome, string(c.Status), c.CreatedAt.UTC()})
	}
	for _, r := range h.Refunds {
		o.Refunds = append(o.Refunds, refundJSON{r.Trade, r.RefundID, r.Amount, r.CreatedAt.UTC()})
	}
	for _, e := range h.Events {
		o.Events = append(o.Events, eventJSON{e.ID, e.EventID, e.Topic, e.Payload, e.CreatedAt.UTC(), utcPtr(e.PublishedAt)})
	}
	for _, v := range h.Reviews {
		o.Reviews = append(o.Reviews, orderRevJSON{v.ID, string(v.Reason), v.BizKey, v.CreatedAt.UTC(), utcPtr(v.ResolvedAt)})
	}
	return o
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// orderFields are the body of PUT and PATCH, checked by the callback body's
// rules: amount an integer literal [1-9][0-9]* at most 2^53-1, currency
// [A-Z]{3}; channel (PUT only, optional) a channel name [a-z0-9_]{1,32}.
func orderFields(body []byte, withChannel bool) (amount int64, currency, ch string, err error) {
	var req struct {
		Amount   json.RawMessage `json:"amount"`
		Currency string          `json:"currency"`
		// Channel is raw: "channel":null is a channel field too, and is
		// refused, never read as "none".
		Channel json.RawMessage `json:"channel"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return 0, "", "", err
	}
	a := string(req.Amount)
	if a == "" || a[0] < '1' || a[0] > '9' || len(a) > 16 {
		return 0, "", "", errors.New("amount: must be a positive integer in minor units, at most 2^53-1")
	}
	n, perr := strconv.ParseInt(a, 10, 64)
	if perr != nil || n > 1<<53-1 {
		return 0, "", "", errors.New("amount: must be a positive integer in minor units, at most 2^53-1")
	}
	if len(req.Currency) != 3 || strings.ToUpper(req.Currency) != req.Currency || strings.IndexFunc(req.Currency, func(r rune) bool { return r < 'A' || r > 'Z' }) >= 0 {
		return 0, "", "", errors.New("currency: must be three upper-case letters")
	}
	if req.Channel != nil {
		if !withChannel {
			return 0, "", "", errors.New("channel: set once, by PUT")
		}
		if json.Unmarshal(req.Channel, &ch) != nil || !channel.ValidChannelName(ch) {
			return 0, "", "", errors.New("channel: must be a channel name, [a-z0-9_]{1,32} (leave it out for none)")
		}
	}
	return n, req.Currency, ch, nil
}

// validID is the rule of order numbers and request ids: 1 to 64
// printable ASCII characters.
func validID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// orders serves /orders/{order_no} (PUT, PATCH, GET, HEAD). GET takes
// ?limit=N (1 to durable.MaxHistoryLimit): the newest rows of each list.
func (a *Server) orders(ctx *fasthttp.RequestCtx, d *Deps, orderNo string) {
	if !validID(orderNo) {
		jsonError(ctx, http.StatusBadRequest, "order_no: must be 1 to 64 printable ASCII characters")
		return
	}
	limit := 0
	if v := ctx.QueryArgs().Peek("limit"); len(v) > 0 {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 1 || n > durable.MaxHistoryLimit {
			jsonError(ctx, http.StatusBadRequest, "limit: must be 1 to "+strconv.Itoa(durable.MaxHistoryLimit))
			return
		}
		limit = n
	}
	rctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	code, conflict := http.StatusOK, ""
	switch {
	case ctx.IsPut():
		amount, currency, ch, err := orderFields(ctx.PostBody(), true)
		if err != nil {
			jsonError(ctx, http.StatusBadRequest, err.Error())
			return
		}
		// An order of a channel edged does not have would never be asked
		// about, nor paid by a callback.
		if ch != "" && a.cfg.Channels != nil && !slices.Contains(a.cfg.Channels, ch) {
			jsonError(ctx, http.StatusBadRequest, fmt.Sprintf("channel: %q is not configured; the configured channels are %s", ch, strings.Join(a.cfg.Channels, ", ")))
			return
		}
		created, err := d.Orders.PutOrder(rctx, orderNo, amount, currency, ch)
		switch {
		case errors.Is(err, durable.ErrOrderExists):
			code, conflict = http.StatusConflict, "the order exists with another amount, currency or channel"
		case err != nil:
			a.unavailable(ctx, "put order", err)
			return
		case created:
			code = http.StatusCreated
		}
	case ctx.IsPatch():
		amount, currency, _, err := orderFields(ctx.PostBody(), false)
		if err != nil {
			jsonError(ctx, http.StatusBadRequest, err.Error())
			return
		}
		switch err := d.Orders.PatchOrder(rctx, orderNo, amount, currency); {
		case errors.Is(err, durable.ErrUnknownOrder):
			jsonError(ctx, http.StatusNotFound, "no such order")
			return
		case errors.Is(err, durable.ErrOrderNotPending):
			code, conflict = http.StatusConflict, "only a PENDING_PAY order can be corrected: what was paid is the amount"
		case err != nil:
			a.unavailable(ctx, "patch order", err)
			return
		}
	}
	h, err := d.Orders.OrderHistory(rctx, orderNo, limit)
	switch {
	case errors.Is(err, durable.ErrUnknownOrder):
		jsonError(ctx, http.StatusNotFound, "no such order")
	case err != nil:
		a.unavailable(ctx, "order history", err)
	case conflict != "":
		writeJSON(ctx, code, orderConflictJSON{Code: "FAIL", Message: conflict, orderJSON: toOrderJSON(h)})
	default:
		writeJSON(ctx, code, toOrderJSON(h))
	}
}

// eventRefusal says why an order's state refuses an internal event.
var eventRefusal = map[durable.Event]string{
	durable.Ship:  "SHIP needs a PAID order",
	durable.Close: "CLOSE needs a PENDING_PAY order",
}

// orderEvent serves POST /orders/{order_no}/events.
func (a *Server) orderEvent(ctx *fasthttp.RequestCtx, d *Deps, orderNo string) {
	var req struct {
		Event     string `json:"event"`
		RequestID string `json:"request_id"`
		// Unchecked closes without asking the channel first.
		Unchecked bool `json:"unchecked"`
	}
	if err := decodeStrict(ctx.PostBody(), &req); err != nil {
		jsonError(ctx, http.StatusBadRequest, err.Error())
		return
	}
	e := durable.Event(req.Event)
	switch {
	case !validID(orderNo):
		jsonError(ctx, http.StatusBadRequest, "order_no: must be 1 to 64 printable ASCII characters")
		return
	case eventRefusal[e] == "":
		jsonError(ctx, http.StatusBadRequest, "event: must be SHIP or CLOSE")
		return
	case !validID(req.RequestID):
		jsonError(ctx, http.StatusBadRequest, "request_id: must be 1 to 64 printable ASCII characters")
		return
	}
	type answer struct {
		Outcome string `json:"outcome"`
		Status  string `json:"status"`
		Message string `json:"message,omitempty"`
	}
	if e == durable.Close && d.Reconcile != nil && !req.Unchecked {
		if status, refusal := a.askBeforeClose(d, orderNo); refusal != "" {
			switch status {
			case "":
				ctx.Response.Header.Set("Retry-After", "5")
				writeJSON(ctx, http.StatusServiceUnavailable, struct {
					Outcome string `json:"outcome"`
					Message string `json:"message"`
				}{"unavailable", refusal})
			default:
				writeJSON(ctx, http.StatusConflict, answer{"refused", status, refusal})
			}
			return
		}
	}
	rctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	res, err := d.Orders.OrderEvent(rctx, orderNo, e, req.RequestID)
	switch {
	case errors.Is(err, durable.ErrUnknownOrder):
		jsonError(ctx, http.StatusNotFound, "no such order")
	case errors.Is(err, durable.ErrRequestReused):
		jsonError(ctx, http.StatusConflict, "request_id: already used for another event of this order")
	case errors.Is(err, durable.ErrEventRefused):
		writeJSON(ctx, http.StatusConflict, answer{"refused", string(res.Status),
			"the order is " + string(res.Status) + ": " + eventRefusal[e] + "; nothing was stored, so this request_id can be sent again once the order allows it"})
	case err != nil:
		a.unavailable(ctx, "order event", err)
	default:
		if res.Replayed {
			ctx.Response.Header.Set(edge.HeaderReplayed, "true")
		}
		writeJSON(ctx, http.StatusOK, answer{Outcome: res.Outcome.String(), Status: string(res.Status)})
	}
}

// askBeforeClose asks the channel about an order still PENDING_PAY before
// the order system closes it (WeChat Pay's own guidance: query before you
// close), so that a payment whose callbacks were lost is not closed over.
// It returns "" when the close may go on: the channel says not paid, closed
// or unknown, no channel with query credentials can answer, or the order
// is no longer pending (the close is decided as ever). Otherwise the
// refusal, with the order's status ("" when the channel could not be
// asked: nothing changed, try again).
func (a *Server) askBeforeClose(d *Deps, orderNo string) (status, refusal string) {
	hctx, hcancel := context.WithTimeout(context.Background(), adminTimeout)
	h, err := d.Orders.OrderHistory(hctx, orderNo, 1)
	hcancel()
	if err != nil || h.Status != durable.PendingPay {
		return "", "" // unknown orders and the others: the close answers
	}
	rctx, cancel := context.WithTimeout(context.Background(), reconcileTimeout)
	defer cancel()
	ans, err := d.Reconcile.Reconcile(rctx, orderNo)
	switch {
	case errors.Is(err, ErrNoQuerier):
		return "", ""
	case err != nil:
		a.log.Warn("close: the channel could not be asked first", "order_no", orderNo, "error", err.Error())
		return "", "the channel could not be asked whether the order was paid, and nothing changed; retry, or send \"unchecked\":true to close it without asking"
	case ans.State == "paid":
		return ans.Status, "the channel says the order was paid: the payment was decided as its callback would be (outcome " + ans.Outcome + "), and the order is not closed"
	case ans.State == "refunded":
		return ans.Status, "the channel says the order was paid and then refunded: held for review (REFUNDED_AT_CHANNEL), and the order is not closed"
	}
	return "", ""
}

// redrivable are the review reasons whose cause an operator can fix after
// the channel stopped retrying: the held delivery may then be decided
// again.
var redrivable = map[durable.ReviewReason]bool{
	durable.ReviewUnknownOrder:   true,
	durable.ReviewAmountMismatch: true,
	durable.ReviewRefundExceeds:  true,
}

// redrive serves POST /review/{id}/redrive.
func (a *Server) redrive(ctx *fasthttp.RequestCtx, d *Deps, id int64) {
	var req struct {
		By string `json:"by"`
	}
	if err := decodeStrict(ctx.PostBody(), &req); err != nil {
		jsonError(ctx, http.StatusBadRequest, err.Error())
		return
	}
	if err := requiredText("by", req.By); err != nil {
		jsonError(ctx, http.StatusBadRequest, err.Error())
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	r, err := d.Reviews.Review(rctx, id)
	switch {
	case errors.Is(err, durable.ErrReviewNotFound):
		jsonError(ctx, http.StatusNotFound, "no such review")
		return
	case err != nil:
		a.unavailable(ctx, "review", err)
		return
	case r.ResolvedAt != nil:
		jsonError(ctx, http.StatusConflict, "review already resolved")
		return
	case !redrivable[r.Reason]:
		jsonError(ctx, http.StatusConflict, "only UNKNOWN_ORDER, AMOUNT_MISMATCH and REFUND_EXCEEDS rows can be re-driven")
		return
	}
	channelName, _, _ := strings.Cut(r.BizKey, ":")
	v, o, err := d.Redrive.Redrive(rctx, channelName, []byte(r.RawBody))
	switch {
	case errors.Is(err, edge.ErrNoChannel):
		jsonError(ctx, http.StatusConflict, "the row's channel is not configured on this node")
		return
	case err != nil:
		a.unavailable(ctx, "redrive", err)
		return
	}
	if v.Success {
		resolution := "re-driven: " + v.Outcome
		resolved, err := d.Reviews.ResolveRedriven(rctx, id, resolution, req.By, o == edge.OutcomeReplayedDB)
		switch {
		case err != nil:
			a.unavailable(ctx, "resolve re-driven review", err)
			return
		case !resolved:
			// A concurrent re-drive of the row settled it (or decided it,
			// and settles it now): this one only replayed that answer, as
			// if it had come after.
			jsonError(ctx, http.StatusConflict, "review already resolved")
			return
		}
		if o == edge.OutcomeReplayedDB {
			ctx.Response.Header.Set(edge.HeaderReplayed, "true")
		}
	}
	a.log.Info("review re-driven", "id", id, "biz_key", r.BizKey, "outcome", o.String(), "by", req.By)
	writeJSON(ctx, http.StatusOK, struct {
		HTTP    int    `json:"http"`
		Code    string `json:"code"`
		Outcome string `json:"outcome,omitempty"`
		Status  string `json:"status,omitempty"`
	}{v.HTTP, v.Code(), v.Outcome, v.Status})
}

// unavailable answers 503 for a failed Postgres call and logs it.
func (a *Server) unavailable(ctx *fasthttp.RequestCtx, op string, err error) {
	a.log.Error(op, "error", err)
	jsonError(ctx, http.StatusServiceUnavailable, "temporarily unavailable; retry")
}

// Reconciler asks the channels about one order now and decides a paid
// answer (package reconcile, adapted by cmd/edged).
type Reconciler interface {
	// Reconcile returns the channel's answer mapped. Its errors:
	// durable.ErrUnknownOrder, ErrNotAsked (the channel could not be
	// asked, its answer failed verification, or no channel has query
	// credentials: nothing applied).
	Reconcile(ctx context.Context, orderNo string) (ReconcileAnswer, error)
}

// ErrNotAsked: the channel could not be asked, or its answer failed
// verification; nothing was applied (502). The error's text after it is
// what the operator reads.
var ErrNotAsked = errors.New("nothing applied")

// ErrNoQuerier: no channel the order may be paid through has query
// credentials; nothing was asked (409 for POST /orders/{no}/reconcile: a
// fact of the configuration, not a failure; a close goes on without
// asking).
var ErrNoQuerier = errors.New("nothing asked")

// ReconcileAnswer is POST /orders/{order_no}/reconcile's answer: which
// channel answered, its answer (paid, pending, closed, not_found), the
// decision's outcome for a paid answer (the state otherwise) and the
// order's state (after the decision, or as it is when none was made).
type ReconcileAnswer struct {
	Channel string `json:"channel"`
	State   string `json:"state"`
	Outcome string `json:"outcome"`
	Status  string `json:"status"`
}

// reconcileTimeout bounds POST /orders/{order_no}/reconcile: the channels'
// answers (an SDK call each, within the channel's rate) and the decision.
const reconcileTimeout = 20 * time.Second

// reconcile serves POST /orders/{order_no}/reconcile. It takes no body.
func (a *Server) reconcile(ctx *fasthttp.RequestCtx, d *Deps, orderNo string) {
	if !validID(orderNo) {
		jsonError(ctx, http.StatusBadRequest, "order_no: must be 1 to 64 printable ASCII characters")
		return
	}
	if body := bytes.TrimSpace(ctx.PostBody()); len(body) > 0 && string(body) != "{}" {
		jsonError(ctx, http.StatusBadRequest, "body: none expected (or {})")
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), reconcileTimeout)
	defer cancel()
	ans, err := d.Reconcile.Reconcile(rctx, orderNo)
	switch {
	case errors.Is(err, durable.ErrUnknownOrder):
		jsonError(ctx, http.StatusNotFound, "no such order")
	case errors.Is(err, ErrNoQuerier):
		jsonError(ctx, http.StatusConflict, err.Error()+": set the channel's query credentials to ask it")
	case errors.Is(err, ErrNotAsked):
		a.log.Warn("reconcile: not asked", "order_no", orderNo, "error", err.Error())
		jsonError(ctx, http.StatusBadGateway, err.Error())
	case err != nil:
		a.unavailable(ctx, "reconcile", err)
	default:
		writeJSON(ctx, http.StatusOK, ans)
	}
}
