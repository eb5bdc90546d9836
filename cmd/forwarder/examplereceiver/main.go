// Command examplereceiver is a complete receiver of the events the
// forwarder POSTs, written to be copied into a merchant's service:
//
//   - it verifies every request with the Standard Webhooks library: the
//     signature over webhook-id, webhook-timestamp and the body, and a
//     timestamp within five minutes of its clock (a replayed capture is
//     refused);
//
//   - it accepts any of several secrets, so a secret is rotated without a
//     lost event: list the new one beside the old, switch the forwarder's
//     FORWARD_SECRET to the new one, then drop the old;
//
//   - it drops duplicates by webhook-id durably: the id is the primary key
//     of an inbox table, inserted in the same transaction as the event's
//     effect, so a re-sent event (the forwarder retries until it gets a
//     2xx) takes effect once, across restarts (an event published before
//     event ids existed has its outbox id for webhook-id, unique within one
//     notifyedge database only: give each database a receiver URL, or an
//     inbox, of its own if old events may still come);
//
//   - it answers as soon as that transaction commits: slow work belongs
//     to a worker that reads the inbox, not to the request, or the
//     forwarder's timeout makes it send the event again.
//
//     DATABASE_URL=postgres://... RECEIVER_SECRETS=whsec_new,whsec_old RECEIVER_LISTEN=:8080 examplereceiver
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(log); err != nil {
		log.Error("receiver stopped", "error", err.Error())
		os.Exit(1)
	}
}

func run(log *slog.Logger) error {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer db.Close()
	h, err := NewHandler(ctx, db, strings.Split(os.Getenv("RECEIVER_SECRETS"), ","), log)
	if err != nil {
		return err
	}
	addr := os.Getenv("RECEIVER_LISTEN")
	if addr == "" {
		addr = ":8080"
	}
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	log.Info("receiver listening", "addr", addr)
	return srv.ListenAndServe()
}

// inboxDDL is the inbox: one row per event taken, keyed by its webhook-id.
const inboxDDL = `CREATE TABLE IF NOT EXISTS webhook_inbox (
	webhook_id  text PRIMARY KEY,
	type        text NOT NULL,
	order_no    text NOT NULL,
	data        jsonb NOT NULL,
	received_at timestamptz NOT NULL DEFAULT now())`

// Event is the body the forwarder sends: the Standard Webhooks payload
// shape. Data holds the outbox payload's fields (order_no, event_type,
// from, to, amount, currency, channel, paid_by, occurred_at, via, ...)
// beside event_id and outbox_id.
type Event struct {
	Type      string          `json:"type"`
	Timestamp time.Time       `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

// Handler receives the forwarder's events.
type Handler struct {
	db       *pgxpool.Pool
	verifier []*standardwebhooks.Webhook
	log      *slog.Logger
}

// NewHandler returns a Handler that accepts events signed with any of
// secrets ("whsec_..."), and creates the inbox table if it is missing.
func NewHandler(ctx context.Context, db *pgxpool.Pool, secrets []string, log *slog.Logger) (*Handler, error) {
	h := &Handler{db: db, log: log}
	for _, s := range secrets {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			return nil, fmt.Errorf("RECEIVER_SECRETS: %w", err)
		}
		h.verifier = append(h.verifier, wh)
	}
	if len(h.verifier) == 0 {
		return nil, errors.New("RECEIVER_SECRETS: no secret (the forwarder's FORWARD_SECRET, whsec_...)")
	}
	if _, err := db.Exec(ctx, inboxDDL); err != nil {
		return nil, fmt.Errorf("create webhook_inbox: %w", err)
	}
	return h, nil
}

// ServeHTTP verifies, records and answers: 204 once the event is taken (or
// was taken before), 401 for a request no secret verifies, 400 for a body
// that is not an event, 413 for one over 1 MiB (an event is a few hundred
// bytes), 503 when the database did not commit (the forwarder sends it
// again).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		http.Error(w, "body over 1 MiB", http.StatusRequestEntityTooLarge)
		return
	}
	if err != nil {
		http.Error(w, "cannot read the body", http.StatusBadRequest)
		return
	}
	if !h.verified(body, r.Header) {
		http.Error(w, "signature or timestamp not valid", http.StatusUnauthorized)
		return
	}
	var ev Event
	var data struct {
		OrderNo string `json:"order_no"`
	}
	if json.Unmarshal(body, &ev) != nil || ev.Type == "" || json.Unmarshal(ev.Data, &data) != nil || data.OrderNo == "" {
		http.Error(w, "not an event", http.StatusBadRequest)
		return
	}
	id := r.Header.Get("webhook-id")
	fresh, err := h.take(r.Context(), id, ev, data.OrderNo)
	if err != nil {
		h.log.Error("event not recorded", "webhook_id", id, "error", err.Error())
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	if !fresh {
		h.log.Info("duplicate event dropped", "webhook_id", id, "type", ev.Type)
	}
	w.WriteHeader(http.StatusNoContent)
}

// verified reports whether any secret verifies the request (signature and
// timestamp tolerance, as the library checks them).
func (h *Handler) verified(body []byte, header http.Header) bool {
	for _, wh := range h.verifier {
		if wh.Verify(body, header) == nil {
			return true
		}
	}
	return false
}

// take records the event and applies its effect in one transaction, unless
// its webhook-id was taken before: then it does nothing and reports false.
func (h *Handler) take(ctx context.Context, id string, ev Event, orderNo string) (fresh bool, err error) {
	err = pgx.BeginFunc(ctx, h.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO webhook_inbox (webhook_id, type, order_no, data)
			VALUES ($1, $2, $3, $4) ON CONFLICT (webhook_id) DO NOTHING`, id, ev.Type, orderNo, ev.Data)
		if err != nil {
			return err
		}
		if fresh = tag.RowsAffected() == 1; !fresh {
			return nil
		}
		// The event's effect goes here, in this transaction: for
		// ORDER_PAID, mark the order paid in your own tables; for
		// ORDER_REFUNDED, record the refund. Anything slow (an e-mail,
		// a call to another service) goes to a worker that reads
		// webhook_inbox.
		return nil
	})
	return fresh, err
}
