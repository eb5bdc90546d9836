package main

import (
	"bytes"
	"encoding/base64"
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/channel/channeltest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func pemBlock(typ string, der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

// builds parses env as edged does and builds every channel, returning the
// certificates found by channel.
func builds(t *testing.T, env ...string) map[string][]channel.PublicKey {
	t.Helper()
	c, err := ParseConfig(nil, append([]string{"DATABASE_URL=postgres://db/x"}, env...))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]channel.PublicKey{}
	for _, cc := range c.Channels {
		b, err := newChannel(cc)
		if err != nil {
			t.Fatalf("%s: %v", cc.Name, err)
		}
		out[cc.Name] = b.certs
	}
	return out
}

// Every key variable takes what the channels hand out: base64 DER, PEM
// (several blocks), certificates in PEM or DER, from the variable or its
// file; WeChat's platform keys also from a directory, a bare certificate
// keyed by its own serial.
func TestCredentialForms(t *testing.T) {
	wx, err := channeltest.NewWeChatPaySigner()
	if err != nil {
		t.Fatal(err)
	}
	wx2, _ := channeltest.NewWeChatPaySigner()
	ali, _ := channeltest.NewAlipaySigner()
	ali2, _ := channeltest.NewAlipaySigner()
	expiry := time.Now().Add(400 * 24 * time.Hour).UTC().Truncate(time.Second)
	cert, err := wx.Certificate(expiry)
	if err != nil {
		t.Fatal(err)
	}
	der := func(b64 string) []byte { b, _ := base64.StdEncoding.DecodeString(b64); return b }
	wxBase := []string{"EDGE_SECRET_WX=" + wx.APIv3Key, "EDGE_CHANNEL_WX_KIND=wechatpay"}
	dir := t.TempDir()

	t.Run("wechat PEM entries and a bare certificate", func(t *testing.T) {
		keys := "PUB_KEY_ID_0114=" + pemBlock("PUBLIC KEY", der(wx2.PublicKeyBase64())) + "\n" + pemBlock("CERTIFICATE", cert)
		certs := builds(t, append(wxBase, "EDGE_CHANNEL_WX_PLATFORM_KEYS="+keys)...)
		if len(certs["wx"]) != 1 || certs["wx"][0].Serial != wx.Serial || !certs["wx"][0].NotAfter.Equal(expiry) {
			t.Errorf("certificates %+v, want one with serial %s", certs["wx"], wx.Serial)
		}
	})
	t.Run("wechat directory of .pem and .crt", func(t *testing.T) {
		os.WriteFile(filepath.Join(dir, "wechatpay_"+wx.Serial+".pem"), []byte(pemBlock("CERTIFICATE", cert)), 0o600)
		os.WriteFile(filepath.Join(dir, "PUB_KEY_ID_0115.pem"), []byte(pemBlock("PUBLIC KEY", der(wx2.PublicKeyBase64()))), 0o600)
		os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not read"), 0o600)
		certs := builds(t, append(wxBase, "EDGE_CHANNEL_WX_PLATFORM_KEYS_FILE="+dir)...)
		if len(certs["wx"]) != 1 || certs["wx"][0].Serial != wx.Serial {
			t.Errorf("certificates %+v", certs["wx"])
		}
	})
	t.Run("wechat directory, extensions in upper case", func(t *testing.T) {
		upper := t.TempDir()
		os.WriteFile(filepath.Join(upper, "WECHATPAY_"+wx.Serial+".CRT"), []byte(pemBlock("CERTIFICATE", cert)), 0o600)
		os.WriteFile(filepath.Join(upper, "PUB_KEY_ID_0116.PEM"), []byte(pemBlock("PUBLIC KEY", der(wx2.PublicKeyBase64()))), 0o600)
		certs := builds(t, append(wxBase, "EDGE_CHANNEL_WX_PLATFORM_KEYS_FILE="+upper)...)
		if len(certs["wx"]) != 1 || certs["wx"][0].Serial != wx.Serial {
			t.Errorf("certificates %+v, want the .CRT file's", certs["wx"])
		}
	})
	t.Run("wechat DER certificate file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "platform.cer")
		os.WriteFile(f, cert, 0o600)
		if certs := builds(t, append(wxBase, "EDGE_CHANNEL_WX_PLATFORM_KEYS_FILE="+f)...); len(certs["wx"]) != 1 {
			t.Errorf("certificates %+v", certs["wx"])
		}
	})
	aliBase := []string{"EDGE_CHANNEL_ALI_KIND=alipay"}
	t.Run("alipay PEM in the variable, two during a rotation", func(t *testing.T) {
		v := pemBlock("PUBLIC KEY", der(ali.PublicKeyBase64())) + pemBlock("PUBLIC KEY", der(ali2.PublicKeyBase64()))
		builds(t, append(aliBase, "EDGE_SECRET_ALI="+v)...)
	})
	t.Run("alipay certificate file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "alipayCertPublicKey_RSA2.crt")
		os.WriteFile(f, []byte(pemBlock("CERTIFICATE", cert)), 0o600)
		if certs := builds(t, append(aliBase, "EDGE_SECRETFILE_ALI="+f)...); len(certs["ali"]) != 1 {
			t.Errorf("certificates %+v", certs["ali"])
		}
	})
	t.Run("alipay one-line base64 as before", func(t *testing.T) {
		builds(t, append(aliBase, "EDGE_SECRET_ALI="+ali.PublicKeyBase64())...)
	})
}

// A value that is none of the forms exits at start naming the variable,
// the entry and why, never the key material.
func TestCredentialRefusals(t *testing.T) {
	wx, _ := channeltest.NewWeChatPaySigner()
	ali, _ := channeltest.NewAlipaySigner()
	good := ali.PublicKeyBase64()
	for _, c := range []struct {
		name string
		env  []string
		want []string
	}{
		{"alipay second entry", []string{"EDGE_CHANNEL_ALI_KIND=alipay", "EDGE_SECRET_ALI=" + good + " garbage!"},
			[]string{"EDGE_SECRET_ALI", "entry 2", "neither PEM nor base64 DER"}},
		{"wechat key without serial", []string{"EDGE_SECRET_WX=" + wx.APIv3Key, "EDGE_CHANNEL_WX_KIND=wechatpay",
			"EDGE_CHANNEL_WX_PLATFORM_KEYS=" + wx.Serial + "=" + wx.PublicKeyBase64() + " " + good},
			[]string{"EDGE_CHANNEL_WX_PLATFORM_KEYS", "entry 2", "SERIAL="}},
		{"generic short secret", []string{"EDGE_SECRET_ACME=whsec_" + base64.StdEncoding.EncodeToString([]byte("short"))},
			[]string{"secret 1", "at least 24"}},
		{"alipay API in the clear", []string{"EDGE_CHANNEL_ALI_KIND=alipay", "EDGE_SECRET_ALI=" + good,
			"EDGE_CHANNEL_ALI_API_URL=http://openapi.alipay.example/gateway.do"},
			[]string{"EDGE_CHANNEL_ALI_API_URL", "must be https://", "loopback"}},
		{"wechat API in the clear", []string{"EDGE_SECRET_WX=" + wx.APIv3Key, "EDGE_CHANNEL_WX_KIND=wechatpay",
			"EDGE_CHANNEL_WX_PLATFORM_KEYS=" + wx.Serial + "=" + wx.PublicKeyBase64(), "EDGE_CHANNEL_WX_API_URL=http://10.0.0.8:8080"},
			[]string{"EDGE_CHANNEL_WX_API_URL", "must be https://"}},
		{"API URL not a URL", []string{"EDGE_CHANNEL_ALI_KIND=alipay", "EDGE_SECRET_ALI=" + good, "EDGE_CHANNEL_ALI_API_URL=gateway.do"},
			[]string{"EDGE_CHANNEL_ALI_API_URL", "not a URL"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseConfig(nil, append([]string{"DATABASE_URL=postgres://db/x"}, c.env...))
			if err == nil {
				_, err = newChannel(cfg.Channels[0])
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), good[:24]) {
				t.Errorf("the error shows key material: %v", err)
			}
		})
	}
	// A bare base64 secret, without whsec_, is a Standard Webhooks secret too.
	bare := base64.StdEncoding.EncodeToString([]byte("a secret of twenty-four+ bytes"))
	builds(t, "EDGE_SECRET_ACME="+bare)
	// The channel's API over https, or in the clear to a loopback fake only.
	for _, u := range []string{"https://openapi.alipay.com/gateway.do", "http://127.0.0.1:8080/gateway.do", "http://[::1]:8080/", "http://localhost:8080/"} {
		builds(t, "EDGE_CHANNEL_ALI_KIND=alipay", "EDGE_SECRET_ALI="+good, "EDGE_CHANNEL_ALI_API_URL="+u)
	}
}

// A certificate that expires within 30 days is a warning at load, and
// every certificate's expiry is a gauge.
func TestCertificateExpiryWatched(t *testing.T) {
	wx, _ := channeltest.NewWeChatPaySigner()
	soon := time.Now().Add(10 * 24 * time.Hour).UTC().Truncate(time.Second)
	cert, err := wx.Certificate(soon)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseConfig(nil, []string{"DATABASE_URL=postgres://db/x", "EDGE_SECRET_WX=" + wx.APIv3Key, "EDGE_CHANNEL_WX_KIND=wechatpay",
		"EDGE_CHANNEL_WX_PLATFORM_KEYS=" + pemBlock("CERTIFICATE", cert)})
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	c, err := newCredentials(&Main{Logger: slog.New(slog.NewJSONHandler(&logs, nil))}, reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.build(cfg.Channels); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), `"msg":"channel certificate expires soon: add its successor and reload"`) ||
		!strings.Contains(logs.String(), `"serial":"`+wx.Serial+`"`) {
		t.Errorf("no warning for a certificate 10 days from expiry:\n%s", logs.String())
	}
	if got := testutil.ToFloat64(c.notAfter.WithLabelValues("wx", wx.Serial)); got != float64(soon.Unix()) {
		t.Errorf("gauge %v, want %d", got, soon.Unix())
	}
}
