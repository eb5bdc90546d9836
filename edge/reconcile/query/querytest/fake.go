// Package querytest holds loopback fakes of the channels' order-query APIs
// that behave and sign as the channels do, so that the channels' own SDKs
// accept their answers: for tests of reconciliation. Production code never
// imports it.
package querytest

import (
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"
)

// Trade is one order as a fake channel holds it.
type Trade struct {
	// State is the channel's own word: WeChat trade_state (SUCCESS,
	// REFUND, NOTPAY, USERPAYING, PAYERROR, CLOSED, REVOKED) or Alipay
	// trade_status (TRADE_SUCCESS, TRADE_FINISHED, WAIT_BUYER_PAY,
	// TRADE_CLOSED).
	State string
	// TxnID is transaction_id (WeChat) or trade_no (Alipay).
	TxnID string
	// Amount is the order's total in fen.
	Amount int64
	// AmountText, when set, is Alipay's total_amount exactly as sent
	// (default: Amount in yuan with two decimals, e.g. "19.99").
	AmountText string
	// Currency is WeChat's amount.currency (default CNY).
	Currency string
	// PaidAt is success_time (WeChat) or send_pay_date (Alipay) of a paid
	// trade (default: when SetTrade was called).
	PaidAt time.Time
	// MchID and AppID are WeChat's mchid and appid (default: the fake's).
	MchID, AppID string
	// BuyerLogonID is Alipay's buyer_logon_id (default a masked phone).
	BuyerLogonID string
	// OutTradeNo, when set, is the order number the answer names instead
	// of the one asked about: an answer about another order.
	OutTradeNo string
	// WasPaid marks an Alipay TRADE_CLOSED trade that was paid and then
	// refunded in full: its answer says when it was paid (send_pay_date).
	WasPaid bool
}

// fake is the part both fakes share: the trades, the failure switches, the
// request log and the server.
type fake struct {
	mu     sync.Mutex
	trades map[string]Trade
	down   bool
	drop   bool
	stall  bool
	badSig bool
	times  []time.Time
	// bills by date (YYYY-MM-DD), and how often each was asked for.
	bills    map[string]Bill
	billAsks map[string]int
	srv      *httptest.Server
	stop     chan struct{}
	once     sync.Once
}

// start serves h on a free loopback port (TLS with a self-signed
// certificate when useTLS).
func (f *fake) start(h http.Handler, useTLS bool) {
	f.trades = map[string]Trade{}
	f.stop = make(chan struct{})
	wrapped := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.fail(w, r) {
			return
		}
		h.ServeHTTP(w, r)
	})
	f.srv = httptest.NewUnstartedServer(wrapped)
	// A client that refuses the self-signed certificate is what a TLS
	// test checks for: the server need not log each refusal.
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	if useTLS {
		f.srv.StartTLS()
	} else {
		f.srv.Start()
	}
}

// fail records the request and plays the failure switched on, if any:
// it reports whether the request has been dealt with.
func (f *fake) fail(w http.ResponseWriter, r *http.Request) bool {
	f.mu.Lock()
	f.times = append(f.times, time.Now())
	down, drop, stall := f.down, f.drop, f.stall
	f.mu.Unlock()
	switch {
	case drop:
		// Close the connection without a word, as a crashed peer would.
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
				return true
			}
		}
		panic(http.ErrAbortHandler)
	case stall:
		// Answer nothing until the caller gives up (or the fake closes).
		select {
		case <-r.Context().Done():
		case <-f.stop:
		}
		return true
	case down:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"code":"SYSTEM_ERROR","message":"service unavailable"}`))
		return true
	}
	return false
}

// SetTrade makes orderNo known with t (replacing what was there).
func (f *fake) SetTrade(orderNo string, t Trade) {
	if t.PaidAt.IsZero() {
		t.PaidAt = time.Now()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.trades[orderNo] = t
}

// Forget makes orderNo unknown.
func (f *fake) Forget(orderNo string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.trades, orderNo)
}

// trade returns orderNo's trade.
func (f *fake) trade(orderNo string) (Trade, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.trades[orderNo]
	return t, ok
}

// SetDown makes the fake answer 503 to every request while down.
func (f *fake) SetDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

// SetDrop makes the fake close every connection without answering while
// on.
func (f *fake) SetDrop(drop bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drop = drop
}

// SetStall makes the fake hold every request unanswered until the caller
// gives up, while on.
func (f *fake) SetStall(stall bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stall = stall
}

// SetBadSignature makes the fake flip a byte of every answer's signature
// while on.
func (f *fake) SetBadSignature(bad bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.badSig = bad
}

// badSignature reports whether signatures are to be broken.
func (f *fake) badSignature() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.badSig
}

// Requests returns how many requests the fake has received (every one,
// refused and failed ones included).
func (f *fake) Requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.times)
}

// RequestTimes returns when each request arrived, oldest first.
func (f *fake) RequestTimes() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.times...)
}

// URL returns the fake's base URL (http://127.0.0.1:port, or https://).
func (f *fake) URL() string { return f.srv.URL }

// Transport returns a transport that trusts the fake's certificate (for a
// TLS fake; for a plain one, any transport reaches it).
func (f *fake) Transport() http.RoundTripper {
	t := f.srv.Client().Transport.(*http.Transport).Clone()
	if t.TLSClientConfig == nil {
		t.TLSClientConfig = &tls.Config{}
	}
	return t
}

// Close stops the fake: stalled requests are let go, then the server
// closes.
func (f *fake) Close() {
	f.once.Do(func() { close(f.stop) })
	f.srv.Close()
}

// flip returns the base64 signature sig with one byte of the signature
// flipped (sig itself when it is not base64).
func flip(sig string) string {
	raw, err := base64.StdEncoding.DecodeString(sig)
	if err != nil || len(raw) == 0 {
		return sig
	}
	raw[len(raw)/2] ^= 0x01
	return base64.StdEncoding.EncodeToString(raw)
}

// yuan renders fen as Alipay's amount text, e.g. 1999 -> "19.99".
func yuan(fen int64) string { return fmt.Sprintf("%d.%02d", fen/100, fen%100) }
