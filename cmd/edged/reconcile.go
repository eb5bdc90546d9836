package main

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge"
	"github.com/notifyedge/notifyedge/edge/admin"
	"github.com/notifyedge/notifyedge/edge/reconcile"
	"github.com/notifyedge/notifyedge/edge/reconcile/query"
)

// querySecret reads a query credential given as EDGE_CHANNEL_<C>_<K> (the
// value) or EDGE_CHANNEL_<C>_<K>_FILE (a file read at start and on every
// reload); "" when neither is set.
func querySecret(cc ChannelConfig, k string) (string, error) {
	env := cc.varName
	v, path := cc.Vars[k], cc.Vars[k+"_FILE"]
	switch {
	case v != "" && path != "":
		return "", fmt.Errorf("channel %s: set %s or %s, not both", cc.Name, env(k), env(k+"_FILE"))
	case path != "":
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("channel %s: %s: %w", cc.Name, env(k+"_FILE"), err)
		}
		return string(b), nil
	}
	return v, nil
}

// newQuerier builds the channel's query client from its outbound
// credentials: nil when none is set (the channel is not asked), an error
// naming the variable when they are incomplete or unreadable. The keys that
// verify the answers are those that verify the callbacks.
func newQuerier(cc ChannelConfig, keys channelKeys) (reconcile.Querier, error) {
	env := cc.varName
	base, err := apiURL(cc)
	if err != nil {
		return nil, err
	}
	switch cc.Kind {
	case "wechatpay":
		key, err := querySecret(cc, "MERCHANT_KEY")
		if err != nil {
			return nil, err
		}
		serial := cc.Vars["MERCHANT_SERIAL"]
		if key == "" && serial == "" {
			return nil, nil
		}
		switch {
		case key == "":
			return nil, fmt.Errorf("channel %s: %s is set: set %s (or %s) too, the merchant API private key", cc.Name, env("MERCHANT_SERIAL"), env("MERCHANT_KEY"), env("MERCHANT_KEY_FILE"))
		case serial == "":
			return nil, fmt.Errorf("channel %s: set %s, the serial of the merchant API certificate", cc.Name, env("MERCHANT_SERIAL"))
		case cc.Vars["MCHID"] == "":
			return nil, fmt.Errorf("channel %s: set %s, the merchant id the queries are made as", cc.Name, env("MCHID"))
		}
		pk, err := query.ParsePrivateKey(key)
		if err != nil {
			return nil, fmt.Errorf("channel %s: %s: %w", cc.Name, env("MERCHANT_KEY"), err)
		}
		q, err := query.NewWeChat(query.WeChatConfig{MchID: cc.Vars["MCHID"], MerchantKey: pk, MerchantSerial: serial,
			PlatformKeys: keys.wechat, NotAfter: keys.wechatNotAfter, BaseURL: base})
		if err != nil {
			return nil, fmt.Errorf("channel %s: %w", cc.Name, err)
		}
		return q, nil
	case "alipay":
		key, err := querySecret(cc, "APP_PRIVATE_KEY")
		if err != nil || key == "" {
			return nil, err
		}
		apps := strings.Fields(cc.Vars["APP_ID"])
		if len(apps) == 0 {
			return nil, fmt.Errorf("channel %s: %s is set: set %s too, the app the queries are made as", cc.Name, env("APP_PRIVATE_KEY"), env("APP_ID"))
		}
		qc := query.AlipayConfig{AppID: apps[0], AppPrivateKey: key, PublicKeys: keys.alipay,
			NotAfter: keys.alipayNotAfter, SellerID: cc.Vars["SELLER_ID"], BaseURL: base}
		if err := alipayCertMode(cc, &qc); err != nil {
			return nil, err
		}
		q, err := query.NewAlipay(qc)
		if err != nil {
			return nil, fmt.Errorf("channel %s: %s: %w", cc.Name, env("APP_PRIVATE_KEY"), err)
		}
		return q, nil
	}
	return nil, nil
}

// alipayCertMode reads the public-key certificate mode's files for
// queries: EDGE_CHANNEL_<C>_APP_CERT (the app's public key certificate)
// and EDGE_CHANNEL_<C>_ROOT_CERT (Alipay's root certificate), each a value
// or a _FILE; Alipay's own certificate is the channel's secret, which then
// holds it as PEM. Neither set: public key mode, nothing to do.
func alipayCertMode(cc ChannelConfig, qc *query.AlipayConfig) error {
	env := cc.varName
	app, err := querySecret(cc, "APP_CERT")
	if err != nil {
		return err
	}
	root, err := querySecret(cc, "ROOT_CERT")
	if err != nil {
		return err
	}
	if app == "" && root == "" {
		return nil
	}
	if app == "" || root == "" {
		return fmt.Errorf("channel %s: certificate mode needs both %s and %s (or their _FILE)", cc.Name, env("APP_CERT"), env("ROOT_CERT"))
	}
	var alipayCert []byte
	for rest := []byte(cc.Secret); ; {
		block, next := pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type == "CERTIFICATE" {
			alipayCert = pem.EncodeToMemory(block)
			break
		}
		rest = next
	}
	if alipayCert == nil {
		return fmt.Errorf("channel %s: %s is set: %s must hold Alipay's public key certificate (alipayCertPublicKey_RSA2.crt) as PEM",
			cc.Name, env("APP_CERT"), cc.SecretVar)
	}
	qc.AppCert, qc.RootCert, qc.AlipayCert = []byte(app), []byte(root), alipayCert
	return nil
}

// apiURL is the channel's EDGE_CHANNEL_<C>_API_URL ("" for the channel's
// production address): https://, or plain http:// to a loopback address
// only (a test's fake). The queries carry signed requests and the answers
// decide payments: they never cross a network in the clear.
func apiURL(cc ChannelConfig) (string, error) {
	raw := cc.Vars["API_URL"]
	if raw == "" {
		return "", nil
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("channel %s: %s: not a URL (want https://host[:port][/path])", cc.Name, cc.varName("API_URL"))
	}
	switch {
	case u.Scheme == "https":
		return raw, nil
	case u.Scheme == "http" && isLoopback(u.Hostname()):
		return raw, nil
	}
	return "", fmt.Errorf("channel %s: %s must be https:// (plain http:// only to a loopback address), not %s://%s",
		cc.Name, cc.varName("API_URL"), u.Scheme, u.Host)
}

// isLoopback reports whether host is localhost or a loopback address.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// reconcileMetrics are reconciliation's metrics:
// notifyedge_reconcile_total{channel,result}, counted by the node that
// asked, and notifyedge_reconcile_due and
// notifyedge_reconcile_oldest_due_seconds, read from Postgres at scrape
// time (every node reports the same figures).
type reconcileMetrics struct {
	total *prometheus.CounterVec
}

// reconcileBacklog reads the due orders (*durable.Store).
type reconcileBacklog interface {
	ReconcileBacklog(ctx context.Context, w durable.ReconcileWindow) (due int64, oldest time.Duration, err error)
}

func newReconcileMetrics(reg prometheus.Registerer, store reconcileBacklog, w durable.ReconcileWindow, asks func() bool) (*reconcileMetrics, error) {
	m := &reconcileMetrics{total: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "notifyedge_reconcile_total",
		Help: "Queries of a channel about an order still PENDING_PAY, by result: applied (paid at the channel and applied here: " +
			"its callbacks were lost), skipped, pending, closed, not_found, error (not asked, or the answer failed verification).",
	}, []string{"channel", "result"})}
	for _, c := range []prometheus.Collector{m.total, &reconcileBacklogCollector{store: store, window: w, asks: asks}} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("reconcile metrics: %w", err)
		}
	}
	return m, nil
}

// channels makes every result's series of each channel exist from the
// start, at 0.
func (m *reconcileMetrics) channels(names []string) {
	for _, n := range names {
		for _, r := range reconcile.Results {
			m.total.WithLabelValues(n, r)
		}
	}
}

var (
	descReconcileDue = prometheus.NewDesc("notifyedge_reconcile_due",
		"Orders whose query of the channel is due now (PENDING_PAY, past -reconcile-after, within -reconcile-horizon).", nil, nil)
	descReconcileOldest = prometheus.NewDesc("notifyedge_reconcile_oldest_due_seconds",
		"How long the longest-waiting due order has waited for its query (0 when none): rising, the queries are not keeping up.", nil, nil)
)

// reconcileBacklogCollector reads the due orders at scrape time, on the
// operator pool. A node that would not ask (-reconcile=false, or no channel
// with query credentials) reports neither gauge: its orders are not
// waiting for it, and a backlog nobody is meant to work off must not page.
type reconcileBacklogCollector struct {
	store  reconcileBacklog
	window durable.ReconcileWindow
	asks   func() bool
}

func (c *reconcileBacklogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descReconcileDue
	ch <- descReconcileOldest
}

func (c *reconcileBacklogCollector) Collect(ch chan<- prometheus.Metric) {
	if !c.asks() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	due, oldest, err := c.store.ReconcileBacklog(ctx, c.window)
	if err != nil {
		return // no figure rather than a wrong one
	}
	ch <- prometheus.MustNewConstMetric(descReconcileDue, prometheus.GaugeValue, float64(due))
	ch <- prometheus.MustNewConstMetric(descReconcileOldest, prometheus.GaugeValue, oldest.Seconds())
}

// opsAuthority decides on the operator pool: reconciliation's decisions
// never take the callbacks' connections or budget.
type opsAuthority struct{ store *durable.Store }

func (a opsAuthority) Process(ctx context.Context, n durable.Notification) (durable.Result, error) {
	return a.store.ProcessOps(ctx, n)
}

func (a opsAuthority) RecordReview(ctx context.Context, n durable.Notification, r durable.ReviewReason) error {
	return a.store.RecordReviewOps(ctx, n, r)
}

var _ edge.Authority = opsAuthority{}

// adminReconciler adapts the reconciler to the admin listener's endpoint.
type adminReconciler struct{ r *reconcile.Reconciler }

func (a adminReconciler) Reconcile(ctx context.Context, orderNo string) (admin.ReconcileAnswer, error) {
	rep, err := a.r.Ask(ctx, orderNo)
	if errors.Is(err, reconcile.ErrNoQuerier) && !errors.Is(err, reconcile.ErrNotAsked) {
		return admin.ReconcileAnswer{}, fmt.Errorf("%w: %w", admin.ErrNoQuerier, err)
	}
	if errors.Is(err, reconcile.ErrNotAsked) {
		return admin.ReconcileAnswer{}, fmt.Errorf("%w: %w", admin.ErrNotAsked, err)
	}
	if err != nil {
		return admin.ReconcileAnswer{}, err
	}
	return admin.ReconcileAnswer{Channel: rep.Channel, State: string(rep.State), Outcome: rep.Outcome, Status: rep.Status}, nil
}

// startReconcile builds the reconciler over the store and the channels'
// query clients and, unless -reconcile=false, runs it in the background
// (one node at a time asks; the others stand by).
func (m *Main) startReconcile(metrics *edge.Metrics, queriers map[string]reconcile.Querier) error {
	cfg := m.Config
	w := durable.ReconcileWindow{After: cfg.ReconcileAfter, Horizon: cfg.ReconcileHorizon}
	asks := func() bool {
		m.qmu.Lock()
		r := m.reconciler
		m.qmu.Unlock()
		return cfg.Reconcile && r != nil && r.Asks()
	}
	rm, err := newReconcileMetrics(metrics.Registry, m.store, w, asks)
	if err != nil {
		return err
	}
	r, err := reconcile.New(reconcile.Config{
		Store: m.store, Decider: m.server, Authority: opsAuthority{m.store},
		Window: w, Rate: cfg.ReconcileRate,
		OnResult: func(ch, result string) { rm.total.WithLabelValues(ch, result).Inc() },
		OnState: func(st string) {
			if m.reconcileState.Swap(st) != st {
				m.Logger.Info("reconcile", "state", st)
			}
		},
		Logger: m.Logger,
	})
	if err != nil {
		return err
	}
	m.qmu.Lock()
	m.reconciler, m.reconcileMetrics = r, rm
	if m.queriers != nil {
		queriers = m.queriers // a reload while edged waited for Postgres
	}
	m.qmu.Unlock()
	m.setQueriers(queriers)
	if !cfg.Reconcile {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.stopReconcile, m.reconcileDone = cancel, make(chan struct{})
	go func() {
		defer close(m.reconcileDone)
		r.Run(ctx)
	}()
	return nil
}

// setQueriers swaps in the channels' query clients (at start and on each
// reload), and makes their metric series exist; the bills take the same
// clients.
func (m *Main) setQueriers(qs map[string]reconcile.Querier) {
	defer m.setBillers(qs) // the same clients fetch the statements
	m.qmu.Lock()
	defer m.qmu.Unlock()
	m.queriers = qs // the latest, for startReconcile and startBills
	if m.reconciler == nil {
		return
	}
	m.reconciler.SetQueriers(qs)
	names := make([]string, 0, len(qs))
	for n := range qs {
		names = append(names, n)
	}
	m.reconcileMetrics.channels(names)
}
