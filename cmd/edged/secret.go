package main

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/channel/channeltest"
)

// runSecret is `edged secret`: it makes the secrets a deployment needs, as
// the environment lines to set. A generic channel's secret and the admin
// and orders tokens are production values. For WeChat Pay and Alipay, the
// channel's own keys come from the channel; for a staging channel that
// `edged sign` can call, it makes stand-ins: an APIv3 key and a platform
// key pair (WeChat Pay), an "Alipay" key pair (Alipay), the private key
// written to -out for `edged sign -key`.
func runSecret(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("edged secret", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kind := fs.String("kind", "generic", "generic (a channel secret), token (the admin and orders tokens), wechatpay or alipay (staging stand-ins for the channel's keys)")
	name := fs.String("channel", "", "the channel's name, for the variables' names (default: the kind)")
	out := fs.String("out", "", "wechatpay, alipay: the file to write the stand-in private key to (PEM, mode 0600)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	ch := *name
	if ch == "" {
		ch = map[string]string{"generic": "acme", "wechatpay": "wx", "alipay": "ali"}[*kind]
	}
	if *kind != "token" && !channel.ValidChannelName(ch) {
		fmt.Fprintf(stderr, "edged secret: -channel %q: want [a-z0-9_]{1,32}\n", ch)
		return 2
	}
	up := strings.ToUpper(ch)
	random := func(n int) []byte {
		b := make([]byte, n)
		rand.Read(b)
		return b
	}
	switch *kind {
	case "generic":
		fmt.Fprintf(stdout, "EDGE_SECRET_%s=whsec_%s\n", up, base64.StdEncoding.EncodeToString(random(32)))
		return 0
	case "token":
		fmt.Fprintf(stdout, "EDGE_ADMIN_TOKEN=%s\nEDGE_ORDERS_TOKEN=%s\n", hex.EncodeToString(random(32)), hex.EncodeToString(random(32)))
		return 0
	case "wechatpay", "alipay":
	default:
		fmt.Fprintf(stderr, "edged secret: -kind %q: want generic, token, wechatpay or alipay\n", *kind)
		return 2
	}
	if *out == "" {
		fmt.Fprintf(stderr, "edged secret: -out is required for -kind %s: where to write the stand-in private key\n", *kind)
		return 2
	}
	var lines []string
	var key []byte
	if *kind == "wechatpay" {
		s, err := channeltest.NewWeChatPaySigner()
		if err != nil {
			fmt.Fprintln(stderr, "edged secret:", err)
			return 1
		}
		key = x509.MarshalPKCS1PrivateKey(s.PlatformKey)
		lines = []string{
			fmt.Sprintf("EDGE_CHANNEL_%s_KIND=wechatpay", up),
			fmt.Sprintf("EDGE_SECRET_%s=%s", up, s.APIv3Key),
			fmt.Sprintf("EDGE_CHANNEL_%s_PLATFORM_KEYS=%s=%s", up, s.Serial, s.PublicKeyBase64()),
			fmt.Sprintf("# edged sign -kind wechatpay -secret %s -key %s -serial %s -body '<resource JSON>'", s.APIv3Key, *out, s.Serial),
		}
	} else {
		s, err := channeltest.NewAlipaySigner()
		if err != nil {
			fmt.Fprintln(stderr, "edged secret:", err)
			return 1
		}
		key = x509.MarshalPKCS1PrivateKey(s.Key)
		lines = []string{
			fmt.Sprintf("EDGE_CHANNEL_%s_KIND=alipay", up),
			fmt.Sprintf("EDGE_SECRET_%s=%s", up, s.PublicKeyBase64()),
			fmt.Sprintf("# edged sign -kind alipay -key %s -body '<the notification's parameters, JSON>'", *out),
		}
	}
	if err := os.WriteFile(*out, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: key}), 0o600); err != nil {
		fmt.Fprintln(stderr, "edged secret:", err)
		return 1
	}
	fmt.Fprintf(stdout, "# staging stand-ins for %s's keys: never a production channel's\n%s\n", ch, strings.Join(lines, "\n"))
	return 0
}
