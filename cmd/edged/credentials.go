package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/reconcile"
)

// certWarnAhead is how long before a certificate's expiry edged warns at
// load (the alert rule fires 14 days ahead).
const certWarnAhead = 30 * 24 * time.Hour

// credentials builds the channel set from the configuration and rebuilds it
// on SIGHUP and POST /reload: every credential that comes from a file is
// read again, and the set is swapped whole, or not at all.
type credentials struct {
	m        *Main
	mu       sync.Mutex // one reload at a time
	notAfter *prometheus.GaugeVec
	reloads  *prometheus.CounterVec
}

func newCredentials(m *Main, reg prometheus.Registerer) (*credentials, error) {
	c := &credentials{m: m,
		notAfter: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "notifyedge_channel_cert_not_after_seconds",
			Help: "Expiry (Unix time) of each channel certificate edged verifies signatures with.",
		}, []string{"channel", "serial"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifyedge_config_reloads_total",
			Help: "Credential reloads (SIGHUP, POST /reload) by result: ok, or error (the old set stays in force).",
		}, []string{"result"}),
	}
	c.reloads.WithLabelValues("ok")
	c.reloads.WithLabelValues("error")
	for _, col := range []prometheus.Collector{c.notAfter, c.reloads} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("credential metrics: %w", err)
		}
	}
	return c, nil
}

// build makes every channel of ccs and watches their certificates; it
// returns the channels and, by name, the query clients of those that have
// outbound credentials.
func (c *credentials) build(ccs []ChannelConfig) ([]channel.Channel, map[string]reconcile.Querier, error) {
	chs := make([]channel.Channel, 0, len(ccs))
	qs := map[string]reconcile.Querier{}
	type cert struct {
		channel string
		k       channel.PublicKey
	}
	var certs []cert
	for _, cc := range ccs {
		b, err := newChannel(cc)
		if err != nil {
			return nil, nil, err
		}
		chs = append(chs, b.ch)
		if b.querier != nil {
			qs[cc.Name] = b.querier
		}
		for _, k := range b.certs {
			certs = append(certs, cert{cc.Name, k})
		}
	}
	// Only a set that is going into force is reported.
	c.notAfter.Reset()
	for _, ce := range certs {
		c.notAfter.WithLabelValues(ce.channel, ce.k.Serial).Set(float64(ce.k.NotAfter.Unix()))
		if left := time.Until(ce.k.NotAfter); left < certWarnAhead {
			c.m.Logger.Warn("channel certificate expires soon: add its successor and reload",
				"channel", ce.channel, "serial", ce.k.Serial, "not_after", ce.k.NotAfter.UTC().Format(time.RFC3339),
				"days_left", int(left.Hours()/24))
		}
	}
	return chs, qs, nil
}

// Reload reads the channel configuration again (variables as at start,
// files as they are now), builds the set and swaps it in. On an error the
// old set stays, one ERROR line names the variable and the reason, and the
// error is returned.
func (c *credentials) Reload(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.reload()
	result := "ok"
	if err != nil {
		result = "error"
		c.m.Logger.Error("credential reload failed: the old channel set stays in force", "error", err.Error())
	} else {
		c.m.Logger.Info("credentials reloaded")
	}
	c.reloads.WithLabelValues(result).Inc()
	return err
}

func (c *credentials) reload() error {
	env := c.m.Env
	if env == nil {
		env = os.Environ()
	}
	ccs, err := parseChannels(envVars(env))
	if err != nil {
		return err
	}
	if len(ccs) == 0 {
		if !c.m.Config.Dev {
			return errors.New("no channel configured any more: the old set stays")
		}
		ccs = c.m.Config.Channels // -dev's own demo channel
	}
	chs, qs, err := c.build(ccs)
	if err != nil {
		return err
	}
	if err := c.m.server.SetChannels(chs); err != nil {
		return err
	}
	c.m.setQueriers(qs)
	return nil
}

// onSIGHUP reloads on every SIGHUP until ctx ends.
func (c *credentials) onSIGHUP(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				_ = c.Reload(ctx)
			}
		}
	}()
}
