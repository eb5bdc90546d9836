package query_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/channel/channeltest"
	"github.com/notifyedge/notifyedge/edge/reconcile/query"
)

// testKeys are generated once per test binary: RSA-2048 generation is slow
// on a loaded machine, and no test changes a key.
type testKeys struct {
	merchant, otherMerchant *rsa.PrivateKey
	platform, platform2     *channeltest.WeChatPaySigner
	app, otherApp           *rsa.PrivateKey
	alipay, alipay2         *channeltest.AlipaySigner
}

var keys = sync.OnceValue(func() testKeys {
	gen := func() *rsa.PrivateKey {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			panic(err)
		}
		return k
	}
	wx := func() *channeltest.WeChatPaySigner {
		s, err := channeltest.NewWeChatPaySigner()
		if err != nil {
			panic(err)
		}
		return s
	}
	return testKeys{
		merchant: gen(), otherMerchant: gen(),
		platform: wx(), platform2: wx(),
		app: gen(), otherApp: gen(),
		alipay: &channeltest.AlipaySigner{Key: gen()}, alipay2: &channeltest.AlipaySigner{Key: gen()},
	}
})

// header is a channel.HeaderReader over an http.Header.
type header http.Header

func (h header) Peek(name string) []byte {
	if v := http.Header(h).Values(name); len(v) > 0 {
		return []byte(v[0])
	}
	return nil
}

func (h header) PeekAll(name string) [][]byte {
	var out [][]byte
	for _, v := range http.Header(h).Values(name) {
		out = append(out, []byte(v))
	}
	return out
}

func headerOf(m map[string]string) header {
	h := http.Header{}
	for k, v := range m {
		h.Set(k, v)
	}
	return header(h)
}

// queryNow asks q about orderNo with a generous outer deadline (the
// querier's own timeout is what the tests check).
func queryNow(t *testing.T, q query.Querier, orderNo string) (query.Answer, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return q.Query(ctx, orderNo)
}

// mustAnswer asks and fails the test on an error.
func mustAnswer(t *testing.T, q query.Querier, orderNo string) query.Answer {
	t.Helper()
	a, err := queryNow(t, q, orderNo)
	if err != nil {
		t.Fatalf("query %s: %v", orderNo, err)
	}
	return a
}

// wantUnverified fails the test unless err is ErrUnverified.
func wantUnverified(t *testing.T, what string, a query.Answer, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: accepted (%s %s), want ErrUnverified", what, a.State, a.ChannelState)
	}
	if !errors.Is(err, query.ErrUnverified) {
		t.Fatalf("%s: %v, want ErrUnverified", what, err)
	}
}

// wantFailure fails the test unless err is an error that is not
// ErrUnverified and mentions each of words.
func wantFailure(t *testing.T, what string, a query.Answer, err error, words ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: accepted (%s %s), want an error", what, a.State, a.ChannelState)
	}
	if errors.Is(err, query.ErrUnverified) {
		t.Fatalf("%s: %v: ErrUnverified, want a failure to ask", what, err)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s: %v: does not mention %q", what, err, w)
		}
	}
}

// redrive maps a stored body with ch as a review row's re-drive would.
func redrive(t *testing.T, ch channel.Channel, body []byte) *channel.Delivery {
	t.Helper()
	var d channel.Delivery
	if rej := ch.Redrive(body, &d); rej != nil {
		t.Fatalf("redrive: %v\nbody: %s", rej, body)
	}
	return &d
}

// stateCase is one channel state and what it maps to.
type stateCase struct {
	channelState string
	want         query.State
}
