package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/edge/channel"
)

// The incident, replayed. For each order, within a compressed "four
// minutes": the first PAY_SUCCESS delivery; a compensation path that moves
// the order on and ships it; a duplicate of the first delivery (same
// notification id); and a third delivery carrying the channel's old
// snapshot of the same payment under a new notification id.
//
// The naive handler is what the incident describes: a notification log
// unique on the channel's notification id (so the old snapshot, re-sent
// under a new id, passes it), duplicates acknowledged, the status written
// without checking the current state, and shipping triggered on every PAID
// write. Both sides log every shipping effect in a table with no unique
// constraint, so "shipped twice" is counted, not prevented by construction.

// IncidentConfig configures RunIncident.
type IncidentConfig struct {
	Orders  int           // default 1000
	Workers int           // concurrent orders in flight (default 32)
	Step    time.Duration // the compressed gap between an order's steps (default 2ms)
	// Progress, if set, receives a line now and then.
	Progress io.Writer
}

// IncidentSide is one side's counts, read from its tables.
type IncidentSide struct {
	Deliveries    int
	Answers       map[string]int // by outcome
	Shipments     int
	ShippedTwice  int // orders with more than one shipment
	OrdersShipped int
}

// IncidentReport is both sides, side by side.
type IncidentReport struct {
	Orders     int
	Naive      IncidentSide
	NotifyEdge IncidentSide
}

const naiveSchema = `
CREATE TABLE IF NOT EXISTS naive_notification_log (notification_id TEXT PRIMARY KEY, received_at TIMESTAMPTZ NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS naive_order (order_no TEXT PRIMARY KEY, status TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS naive_shipping_attempt (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_no TEXT NOT NULL, source TEXT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now());`

// naive is the baseline handler, clearly not notifyedge.
type naive struct{ db *pgxpool.Pool }

func (n *naive) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var body struct {
		OrderNo string `json:"order_no"`
		Event   string `json:"event_type"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	tag, err := n.db.Exec(ctx, `INSERT INTO naive_notification_log (notification_id) VALUES ($1) ON CONFLICT DO NOTHING`, r.Header.Get("webhook-id"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	if tag.RowsAffected() == 0 {
		io.WriteString(w, "duplicate") // acknowledged
		return
	}
	// The status is written without looking at what it is now...
	if _, err := n.db.Exec(ctx, `UPDATE naive_order SET status = 'PAID' WHERE order_no = $1`, body.OrderNo); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	// ...and every PAID write triggers shipping.
	if err := n.ship(ctx, body.OrderNo, "on_paid_write"); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "applied")
}

func (n *naive) ship(ctx context.Context, orderNo, source string) error {
	_, err := n.db.Exec(ctx, `WITH s AS (INSERT INTO naive_shipping_attempt (order_no, source) VALUES ($1, $2))
		UPDATE naive_order SET status = 'SHIPPED' WHERE order_no = $1`, orderNo, source)
	return err
}

// compensate is the naive compensation path: it finds the payment at the
// channel and ships an order still PAID (it does check that much).
func (n *naive) compensate(ctx context.Context, orderNo string) error {
	var status string
	if err := n.db.QueryRow(ctx, `SELECT status FROM naive_order WHERE order_no = $1`, orderNo).Scan(&status); err != nil {
		return err
	}
	if status == "PAID" {
		return n.ship(ctx, orderNo, "compensation")
	}
	return nil
}

// RunIncident starts a stack, replays the incident against both sides and
// reports, from their tables, what happened.
func RunIncident(ctx context.Context, cfg IncidentConfig) (IncidentReport, error) {
	cfg.Orders = max(cfg.Orders, 1)
	if cfg.Workers == 0 {
		cfg.Workers = 32
	}
	if cfg.Step == 0 {
		cfg.Step = 2 * time.Millisecond
	}
	progress := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, format+"\n", args...)
		}
	}
	progress("starting Postgres, Redis, notifyedge, its relay and shipper, and the naive baseline ...")
	st, err := StartStack(ctx, StackConfig{})
	if err != nil {
		return IncidentReport{}, err
	}
	defer st.Close()
	if _, err := st.DB.Exec(ctx, naiveSchema); err != nil {
		return IncidentReport{}, fmt.Errorf("naive schema: %w", err)
	}
	nv := &naive{db: st.DB}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return IncidentReport{}, err
	}
	naiveSrv := &http.Server{Handler: nv}
	go naiveSrv.Serve(ln)
	defer naiveSrv.Close()
	naiveURL := "http://" + ln.Addr().String() + "/notify/" + Channel

	orders, err := pgtemp.SeedPending(ctx, st.DBURL, "INC-%05d", cfg.Orders, 4200)
	if err != nil {
		return IncidentReport{}, err
	}
	naiveRows := make([][]any, len(orders))
	for i, o := range orders {
		naiveRows[i] = []any{o.No, "PENDING_PAY"}
	}
	if _, err := st.DB.CopyFrom(ctx, pgx.Identifier{"naive_order"}, []string{"order_no", "status"}, pgx.CopyFromRows(naiveRows)); err != nil {
		return IncidentReport{}, err
	}

	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Workers * 2}}
	rep := IncidentReport{Orders: cfg.Orders}
	rep.Naive.Answers, rep.NotifyEdge.Answers = map[string]int{}, map[string]int{}
	var mu sync.Mutex
	var failures []error
	var done atomic.Int64
	record := func(side *IncidentSide, outcome string, err error) {
		mu.Lock()
		defer mu.Unlock()
		side.Deliveries++
		if err != nil {
			failures = append(failures, err)
			return
		}
		side.Answers[outcome]++
	}
	// to returns the recorder of one side, so that to(side)(post(...)) reads.
	to := func(side *IncidentSide) func(string, error) {
		return func(outcome string, err error) { record(side, outcome, err) }
	}
	progress("replaying the incident on %d orders ...", cfg.Orders)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				o := orders[i]
				first := fmt.Sprintf(`{"channel_txn_id":"42000%s","event_type":"PAY_SUCCESS","order_no":%q,"amount":4200,"currency":"CNY"}`, o.No, o.No)
				// The channel's old snapshot: the same payment, other bytes
				// (its own field order), re-sent under a new notification id.
				snapshot := fmt.Sprintf(`{"order_no":%q,"amount":4200,"currency":"CNY","channel_txn_id":"42000%s","event_type":"PAY_SUCCESS","trade_state":"SUCCESS"}`, o.No, o.No)
				idFirst, idStale := "n1-"+o.No, "n2-"+o.No
				for _, step := range []func(){
					func() { // 1. the first delivery
						to(&rep.Naive)(naivePost(client, naiveURL, idFirst, first))
						to(&rep.NotifyEdge)(edgePost(client, st.URL, idFirst, first))
					},
					func() { // 2. a compensation path moves the order on and ships it
						if err := nv.compensate(ctx, o.No); err != nil {
							record(&rep.Naive, "", err)
						}
						if _, err := st.Store.Transition(ctx, o.No, durable.PaySuccess); err != nil {
							record(&rep.NotifyEdge, "", err)
						}
						if _, _, err := st.Store.Ship(ctx, "compensation", 0, o.No); err != nil {
							record(&rep.NotifyEdge, "", err)
						}
					},
					func() { // 3. a duplicate of the first delivery
						to(&rep.Naive)(naivePost(client, naiveURL, idFirst, first))
						to(&rep.NotifyEdge)(edgePost(client, st.URL, idFirst, first))
					},
					func() { // 4. the old snapshot under a new notification id
						to(&rep.Naive)(naivePost(client, naiveURL, idStale, snapshot))
						to(&rep.NotifyEdge)(edgePost(client, st.URL, idStale, snapshot))
					},
				} {
					step()
					time.Sleep(cfg.Step)
				}
				if n := done.Add(1); n%max(int64(cfg.Orders/10), 1) == 0 {
					progress("  %d/%d orders replayed", n, cfg.Orders)
				}
			}
		}()
	}
	for i := range orders {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if len(failures) > 0 {
		return rep, fmt.Errorf("%d failed steps, first: %w", len(failures), failures[0])
	}
	progress("waiting for the outbox relay and the shipper to finish ...")
	if err := waitDrained(ctx, st, cfg.Orders); err != nil {
		return rep, err
	}
	if err := readShipments(ctx, st.DB, `naive_shipping_attempt`, &rep.Naive); err != nil {
		return rep, err
	}
	if err := readShipments(ctx, st.DB, `shipment`, &rep.NotifyEdge); err != nil {
		return rep, err
	}
	return rep, nil
}

// waitDrained waits until every order is shipped, the outbox is published
// and the shipper has nothing pending.
func waitDrained(ctx context.Context, st *Stack, orders int) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		shipped, err := count(ctx, st.DB, `SELECT count(*) FROM biz_order WHERE status = 'SHIPPED'`)
		if err != nil {
			return err
		}
		pending, err := count(ctx, st.DB, `SELECT count(*) FROM outbox WHERE published_at IS NULL`)
		if err != nil {
			return err
		}
		if shipped == orders && pending == 0 {
			if p, err := st.Stream.XPending(ctx, "notifyedge:outbox", "shipper").Result(); err == nil && p.Count == 0 {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("the relay and the shipper did not finish within 60 s")
}

func readShipments(ctx context.Context, db *pgxpool.Pool, table string, side *IncidentSide) error {
	err := db.QueryRow(ctx, `SELECT count(*), count(DISTINCT order_no),
		(SELECT count(*) FROM (SELECT order_no FROM `+table+` GROUP BY order_no HAVING count(*) > 1) x) FROM `+table).
		Scan(&side.Shipments, &side.OrdersShipped, &side.ShippedTwice)
	if err != nil {
		return fmt.Errorf("read %s: %w", table, err)
	}
	return nil
}

func naivePost(c *http.Client, url, id, body string) (string, error) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", id)
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("naive: %d %s", resp.StatusCode, b)
	}
	return "ack_" + string(b), nil
}

// edgePost delivers a correctly signed callback and names its outcome.
func edgePost(c *http.Client, base, id, body string) (string, error) {
	ts := time.Now().Unix()
	sig, err := channel.SignWebhook(Secret, id, ts, []byte(body))
	if err != nil {
		return "", err
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/notify/"+Channel, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", fmt.Sprint(ts))
	req.Header.Set("webhook-signature", sig)
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var ans struct {
		Code, Outcome string
	}
	if err := json.Unmarshal(b, &ans); err != nil || resp.StatusCode != 200 {
		return "", fmt.Errorf("notifyedge: %d %s", resp.StatusCode, b)
	}
	if resp.Header.Get("Idempotent-Replayed") == "true" {
		return "replayed", nil
	}
	return ans.Outcome, nil
}

// Table renders the report side by side.
func (r IncidentReport) Table() string {
	var b strings.Builder
	row := func(name string, a, e any) { fmt.Fprintf(&b, "%-34s %16v %16v\n", name, a, e) }
	fmt.Fprintf(&b, "The incident replayed on %d orders: first delivery, compensation ships, duplicate, old snapshot\n\n", r.Orders)
	row("", "naive (baseline)", "notifyedge")
	row("callbacks delivered", r.Naive.Deliveries, r.NotifyEdge.Deliveries)
	keys := map[string]bool{}
	for k := range r.Naive.Answers {
		keys[k] = true
	}
	for k := range r.NotifyEdge.Answers {
		keys[k] = true
	}
	for _, k := range []string{"ack_applied", "ack_duplicate", "applied", "replayed", "skipped"} {
		if keys[k] {
			row("  answered "+k, r.Naive.Answers[k], r.NotifyEdge.Answers[k])
		}
	}
	row("shipping effects", r.Naive.Shipments, r.NotifyEdge.Shipments)
	row("orders shipped", r.Naive.OrdersShipped, r.NotifyEdge.OrdersShipped)
	row("orders shipped twice", r.Naive.ShippedTwice, r.NotifyEdge.ShippedTwice)
	return b.String()
}
