package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/edge/channel"
)

const (
	devChannel  = "demo"
	devOrders   = 300
	devAmount   = 1999
	devCurrency = "CNY"
)

type devState struct {
	secret string
}

// startDev gives -dev its throwaway parts: a local Postgres unless
// DATABASE_URL is set, an in-process Redis unless REDIS_URL is, the demo channel unless channels are configured, and
// an admin token unless EDGE_ADMIN_TOKEN is set.
func (m *Main) startDev(ctx context.Context) error {
	cfg := &m.Config
	if cfg.DatabaseURL == "" {
		c, err := pgtemp.Start(ctx, pgtemp.Options{})
		if err != nil {
			return fmt.Errorf("dev postgres: %w", err)
		}
		m.cluster = c
		cfg.DatabaseURL = c.URL("postgres")
	}
	if cfg.RedisURL == "" {
		mini, err := miniredis.Run()
		if err != nil {
			return fmt.Errorf("dev redis: %w", err)
		}
		m.mini = mini
		cfg.RedisURL = "redis://" + mini.Addr()
	}
	if len(cfg.Channels) == 0 {
		key := make([]byte, 24)
		rand.Read(key)
		m.dev.secret = "whsec_" + base64.StdEncoding.EncodeToString(key)
		cfg.Channels = []ChannelConfig{{Name: devChannel, Kind: "generic", Secrets: []string{m.dev.secret}}}
	}
	if cfg.AdminToken == "" {
		tok := make([]byte, 16)
		rand.Read(tok)
		cfg.AdminToken = hex.EncodeToString(tok)
	}
	if cfg.OrdersToken == "" {
		tok := make([]byte, 16)
		rand.Read(tok)
		cfg.OrdersToken = hex.EncodeToString(tok)
	}
	return nil
}

// seedDev inserts the demo orders DEMO-0001.. (PENDING_PAY) into a
// throwaway database.
func (m *Main) seedDev(ctx context.Context) error {
	if m.cluster == nil {
		return nil // never seed a database the operator gave us
	}
	orders := make([]pgtemp.Order, devOrders)
	for i := range orders {
		orders[i] = pgtemp.Order{No: devOrderNo(i + 1), Status: "PENDING_PAY", Amount: devAmount, Currency: devCurrency}
	}
	return pgtemp.SeedOrders(ctx, m.Config.DatabaseURL, orders)
}

func devOrderNo(i int) string { return fmt.Sprintf("DEMO-%04d", i) }

// printDevBanner prints, as plain text, what -dev made and one ready
// command (nothing before it names the command).
func (m *Main) printDevBanner() {
	w := m.Stdout
	url := "http://" + dialAddr(m.Addr()) + "/notify/" + devChannel
	fmt.Fprintln(w, "notifyedge dev mode")
	if m.cluster != nil {
		fmt.Fprintf(w, "  postgres: throwaway cluster in %s (removed on exit)\n", m.cluster.Dir())
		fmt.Fprintf(w, "  orders:   %s .. %s, PENDING_PAY, %d %s\n", devOrderNo(1), devOrderNo(devOrders), devAmount, devCurrency)
	}
	if m.mini != nil {
		fmt.Fprintln(w, "  redis:    in-process (miniredis), answers hot duplicates")
	} else {
		fmt.Fprintln(w, "  redis:    REDIS_URL")
	}
	fmt.Fprintf(w, "  admin:    http://%s (/metrics, /readyz, /review with Authorization: Bearer %s)\n", dialAddr(m.AdminAddr()), m.Config.AdminToken)
	fmt.Fprintf(w, "  orders:   http://%s/orders/{order_no} with Authorization: Bearer %s\n", dialAddr(m.AdminAddr()), m.Config.OrdersToken)
	if m.dev.secret == "" {
		return
	}
	fmt.Fprintf(w, "  channel:  %s, secret %s\n", devChannel, m.dev.secret)
	body := fmt.Sprintf(`{"channel_txn_id":"TX-%d","event_type":"PAY_SUCCESS","order_no":"%s","amount":%d,"currency":"%s"}`,
		time.Now().Unix(), devOrderNo(1), devAmount, devCurrency)
	cmd, err := signedCurl(m.dev.secret, newMessageID(), url, []byte(body), time.Now())
	if err != nil {
		panic("BUG: sign demo request: " + err.Error())
	}
	fmt.Fprintln(w, "\nPaste this to deliver a payment (valid for 5 minutes; run it twice to see the replay):")
	fmt.Fprintln(w, cmd)
}

// dialAddr turns a listen address into one to dial (":8080" -> 127.0.0.1:8080).
func dialAddr(addr string) string {
	if strings.HasPrefix(addr, ":") {
		return "127.0.0.1" + addr
	}
	return strings.Replace(addr, "[::]", "127.0.0.1", 1)
}

// signedCurl returns a curl command that delivers body to url as message
// id, signed at now.
func signedCurl(secret, id, url string, body []byte, now time.Time) (string, error) {
	sig, err := channel.SignWebhook(secret, id, now.Unix(), body)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("curl -sS -i -X POST %s -H 'content-type: application/json' -H 'webhook-id: %s' -H 'webhook-timestamp: %d' -H 'webhook-signature: %s' --data-raw %s",
		shellQuote(url), id, now.Unix(), sig, shellQuote(string(body))), nil
}

func newMessageID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return "msg_" + hex.EncodeToString(b)
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
