package main

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/channel/channeltest"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig(nil, []string{"DATABASE_URL=postgres://db/x", "EDGE_SECRET_ACME=" + secret})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Listen: ":8080", AdminListen: "127.0.0.1:9090", DatabaseURL: "postgres://db/x",
		Budget: 200 * time.Millisecond, MaxBody: 64 << 10, ResultTTL: 24 * time.Hour, Drain: 10 * time.Second, Relay: true, GroupCommit: true,
		IdleTimeout: 5 * time.Second, MaxConnsPerIP: 256, DrainDelay: 5 * time.Second, StartTimeout: time.Minute,
		ClaimRetention: 168 * time.Hour, OutboxRetention: 168 * time.Hour, ReviewRetention: 2160 * time.Hour,
		Reconcile: true, ReconcileAfter: 10 * time.Minute, ReconcileHorizon: 72 * time.Hour, ReconcileRate: 10,
		Bills: true, BillsAt: 10*time.Hour + 30*time.Minute, BillsGiveUp: 18 * time.Hour, BillsZone: shanghai(t), BillRetention: 2160 * time.Hour,
		Channels: []ChannelConfig{{Name: "acme", Kind: "generic", Secrets: []string{secret}, Secret: secret, SecretVar: "EDGE_SECRET_ACME"}}}
	if d := cmp.Diff(want, c, cmp.Comparer(func(a, b *time.Location) bool { return a.String() == b.String() })); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

func shanghai(t *testing.T) *time.Location {
	z, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		t.Fatal(err)
	}
	return z
}

func TestParseConfigFlagsOverrideEnv(t *testing.T) {
	file := filepath.Join(t.TempDir(), "secrets")
	os.WriteFile(file, []byte(secret+" whsec_b2xk\n"), 0o600)
	c, err := ParseConfig([]string{"-budget", "150ms", "-max-body", "1MiB", "-relay=false"}, []string{
		"DATABASE_URL=postgres://db/x", "EDGE_BUDGET=1s", "EDGE_MAX_BODY=10KB", "EDGE_LISTEN=:9999",
		"EDGE_SECRETFILE_PAY_2=" + file, "EDGE_CHANNEL_PAY_2_KIND=generic", "EDGE_ADMIN_TOKEN=tok",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Budget != 150*time.Millisecond || c.MaxBody != 1<<20 || c.Listen != ":9999" || c.Relay || c.AdminToken != "tok" {
		t.Errorf("got %+v", c)
	}
	if d := cmp.Diff([]ChannelConfig{{Name: "pay_2", Kind: "generic", Secrets: []string{secret, "whsec_b2xk"},
		Secret: secret + " whsec_b2xk\n", SecretVar: "EDGE_SECRETFILE_PAY_2"}}, c.Channels); d != "" {
		t.Errorf("channels (-want +got):\n%s", d)
	}
	// Every setting has a flag, EDGE_RECONCILE_RATE's too, each typed.
	c, err = ParseConfig([]string{"-reconcile-rate", "2.5", "-bills-at", "09:15", "-bills-tz", "UTC", "-stream-replicas", "2"},
		[]string{"DATABASE_URL=postgres://db/x", "EDGE_SECRET_ACME=" + secret, "EDGE_RECONCILE_RATE=5", "EDGE_BILLS_AT=11:00"})
	if err != nil {
		t.Fatal(err)
	}
	if c.ReconcileRate != 2.5 || c.BillsAt != 9*time.Hour+15*time.Minute || c.BillsZone.String() != "UTC" || c.StreamReplicas != 2 {
		t.Errorf("typed flags over the environment: %+v", c)
	}
	if _, err := ParseConfig([]string{"-reconcile-rate", "0"}, []string{"DATABASE_URL=postgres://db/x", "EDGE_SECRET_ACME=" + secret}); err == nil ||
		!strings.Contains(err.Error(), "reconcile-rate") {
		t.Errorf("-reconcile-rate 0: %v", err)
	}
	// A flag wins even over a variable that would not parse: the command
	// line fixes a bad environment.
	c, err = ParseConfig([]string{"-budget", "100ms", "-bills-tz", "UTC"},
		[]string{"DATABASE_URL=postgres://db/x", "EDGE_SECRET_ACME=" + secret, "EDGE_BUDGET=bogus", "EDGE_BILLS_TZ=Nowhere/Bogus"})
	if err != nil || c.Budget != 100*time.Millisecond || c.BillsZone.String() != "UTC" {
		t.Errorf("flags over unparsable variables: %v, %+v", err, c)
	}
	if _, err := ParseConfig([]string{"-budget", "-1s"}, []string{"DATABASE_URL=postgres://db/x", "EDGE_SECRET_ACME=" + secret}); err == nil ||
		!strings.Contains(err.Error(), "not a positive duration") {
		t.Errorf("-budget -1s: %v, want it to say a positive duration", err)
	}
}

func TestParseConfigErrors(t *testing.T) {
	bad := func(env []string, args []string, want string) {
		t.Helper()
		_, err := ParseConfig(args, env)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("env %v args %v: err %v, want it to mention %q", env, args, err, want)
		}
	}
	db := "DATABASE_URL=postgres://db/x"
	bad([]string{"EDGE_SECRET_ACME=" + secret}, nil, "DATABASE_URL")
	bad([]string{db}, nil, "EDGE_SECRET_")
	bad([]string{db, "EDGE_SECRET_ACME=" + secret, "EDGE_BUDGET=soon"}, nil, "budget")
	bad([]string{db, "EDGE_SECRET_ACME=" + secret}, []string{"-max-body", "lots"}, "max-body")
	bad([]string{db, "EDGE_SECRET_AC-ME=" + secret}, nil, "[a-z0-9_]")
	bad([]string{db, "EDGE_SECRET_ACME= "}, nil, "no secret")
	acme := "EDGE_SECRET_ACME=" + secret
	bad([]string{db, acme}, []string{"-claim-retention", "24h"}, "-claim-retention")
	bad([]string{db, acme, "EDGE_CLAIM_RETENTION=1h"}, nil, "-claim-retention")
	bad([]string{db, acme, "EDGE_CLAIM_RETENTION=a week"}, nil, "claim-retention")
	bad([]string{db, acme}, []string{"-outbox-retention", "0s"}, "outbox-retention")
	bad([]string{db, acme, "EDGE_REVIEW_RETENTION=-1h"}, nil, "review-retention")
	bad([]string{db, acme, "EDGE_RECONCILE=maybe"}, nil, "reconcile")
	bad([]string{db, acme}, []string{"-reconcile-after", "0s"}, "reconcile-after")
	bad([]string{db, acme}, []string{"-reconcile-after", "2h", "-reconcile-horizon", "1h"}, "-reconcile-horizon")
	bad([]string{db, acme, "EDGE_RECONCILE_RATE=0"}, nil, "EDGE_RECONCILE_RATE")
	bad([]string{db, acme, "EDGE_RECONCILE_RATE=fast"}, nil, "EDGE_RECONCILE_RATE")
	bad([]string{db, acme, "EDGE_RECONCILE_RATE=1e6"}, nil, "EDGE_RECONCILE_RATE")
	bad([]string{db, acme, "EDGE_BILLS=sometimes"}, nil, "bills")
	bad([]string{db, acme, "EDGE_BILLS_AT=10.30"}, nil, "bills-at")
	bad([]string{db, acme}, []string{"-bills-at", "25:00"}, "bills-at")
	bad([]string{db, acme, "EDGE_BILLS_AT=19:00"}, nil, "-bills-give-up")
	bad([]string{db, acme, "EDGE_BILLS_TZ=Mars/Olympus"}, nil, "bills-tz")
	bad([]string{db, acme, "EDGE_BILLS_TZ=Local"}, nil, "bills-tz")
	bad([]string{db, acme, "EDGE_BILL_RETENTION=forever"}, nil, "bill-retention")
	if _, err := newChannel(ChannelConfig{Name: "acme", Kind: "telegraph", Secrets: []string{secret}}); err == nil ||
		!strings.Contains(err.Error(), "EDGE_CHANNEL_ACME_KIND") {
		t.Errorf("unknown kind: %v", err)
	}
}

// edged sign's headers verify with the edge's own adapter.
func TestSignVerifies(t *testing.T) {
	payload := `{"channel_txn_id":"T1","event_type":"PAY_SUCCESS","order_no":"O1","amount":1,"currency":"CNY"}`
	var out, errs bytes.Buffer
	if code := runSign([]string{"-secret", secret, "-body", payload, "-id", "msg_fixed"}, &out, &errs); code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	headers := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		headers[k] = v
	}
	if headers["webhook-id"] != "msg_fixed" || headers["webhook-timestamp"] == "" {
		t.Fatalf("headers %v", headers)
	}
	want, _ := channel.SignWebhook(secret, "msg_fixed", mustInt(t, headers["webhook-timestamp"]), []byte(payload))
	if headers["webhook-signature"] != want {
		t.Errorf("signature %s, want %s", headers["webhook-signature"], want)
	}
	out.Reset()
	if code := runSign([]string{"-secret", secret, "-body", "it's", "-url", "http://x/notify/acme"}, &out, &errs); code != 0 ||
		!strings.HasPrefix(out.String(), "curl ") || !strings.Contains(out.String(), `--data-raw 'it'\''s'`) {
		t.Errorf("curl form: %d %s", code, out.String())
	}
	if code := runSign([]string{"-body", "x"}, &out, &errs); code == 0 {
		t.Error("no secret: exit 0")
	}
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The real channels are configured from their variables.
func TestRealChannelKinds(t *testing.T) {
	wx, err := channeltest.NewWeChatPaySigner()
	if err != nil {
		t.Fatal(err)
	}
	ali, _ := channeltest.NewAlipaySigner()
	c, err := ParseConfig(nil, []string{"DATABASE_URL=postgres://db/x",
		"EDGE_SECRET_WX=" + wx.APIv3Key, "EDGE_CHANNEL_WX_KIND=wechatpay",
		"EDGE_CHANNEL_WX_PLATFORM_KEYS=" + wx.Serial + "=" + wx.PublicKeyBase64(), "EDGE_CHANNEL_WX_MCHID=1900000109",
		"EDGE_SECRET_ALI=" + ali.PublicKeyBase64(), "EDGE_CHANNEL_ALI_KIND=alipay", "EDGE_CHANNEL_ALI_APP_ID=2021",
	})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, cc := range c.Channels {
		b, err := newChannel(cc)
		if err != nil {
			t.Fatalf("%s: %v", cc.Name, err)
		}
		ch := b.ch
		if ch.Name() != cc.Name {
			t.Errorf("name %s", ch.Name())
		}
		kinds[ch.Name()] = fmt.Sprintf("%T", ch)
	}
	want := map[string]string{"wx": "*channel.WeChatPay", "ali": "*channel.Alipay"}
	if !maps.Equal(kinds, want) {
		t.Errorf("channels built: %v, want %v", kinds, want)
	}
	bad := ChannelConfig{Name: "wx", Kind: "wechatpay", Secrets: []string{wx.APIv3Key}, Vars: map[string]string{"PLATFORM_KEYS": "nokey"}}
	if _, err := newChannel(bad); err == nil || !strings.Contains(err.Error(), "EDGE_CHANNEL_WX_PLATFORM_KEYS") {
		t.Errorf("bad platform keys: %v", err)
	}
}
