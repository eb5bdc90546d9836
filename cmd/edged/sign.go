package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/channel/channeltest"
	"github.com/notifyedge/notifyedge/edge/reconcile/query"
)

var errHelp = flag.ErrHelp

// runSign is `edged sign`: it makes a ready test callback for a channel of
// any kind, from the credentials the channel is configured with (for
// WeChat Pay and Alipay, the staging keys `edged secret` made, standing in
// for the channel's own), so people can try a channel by hand (a
// signature expires after 5 minutes). It prints the headers and the body,
// or with -url a whole curl command.
func runSign(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("edged sign", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kind := fs.String("kind", "generic", "the channel's kind: generic, wechatpay or alipay")
	secret := fs.String("secret", os.Getenv("EDGE_SIGN_SECRET"), `generic: the channel secret "whsec_..."; wechatpay: the APIv3 key (EDGE_SIGN_SECRET)`)
	keyFile := fs.String("key", os.Getenv("EDGE_SIGN_KEY"), "wechatpay: the platform private key; alipay: Alipay's private key (PEM files `edged secret` wrote) (EDGE_SIGN_KEY)")
	serial := fs.String("serial", "", "wechatpay: the platform key's serial (Wechatpay-Serial), as in EDGE_CHANNEL_<C>_PLATFORM_KEYS")
	event := fs.String("event", "TRANSACTION.SUCCESS", "wechatpay: the event_type (TRANSACTION.SUCCESS, REFUND.SUCCESS, ...)")
	body := fs.String("body", "", "generic: the JSON body; wechatpay: the resource (the transaction or refund, JSON); alipay: the notification's parameters as a JSON object (default: read standard input)")
	id := fs.String("id", "", "generic: webhook-id (default: a fresh msg_...)")
	ts := fs.Int64("timestamp", 0, "the signature's time, unix seconds (default: now)")
	url := fs.String("url", "", "print a curl command for this URL instead of the headers and body")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	b := []byte(*body)
	if *body == "" {
		var err error
		if b, err = io.ReadAll(os.Stdin); err != nil {
			fmt.Fprintln(stderr, "edged sign:", err)
			return 1
		}
	}
	now := time.Now()
	if *ts != 0 {
		now = time.Unix(*ts, 0)
	}
	switch *kind {
	case "generic":
	case "wechatpay", "alipay":
		headers, out, ctype, err := signChannel(*kind, *secret, *keyFile, *serial, *event, b, now)
		if err != nil {
			fmt.Fprintln(stderr, "edged sign:", err)
			return 2
		}
		printSigned(stdout, *url, headers, ctype, out)
		return 0
	default:
		fmt.Fprintf(stderr, "edged sign: -kind %q: want generic, wechatpay or alipay\n", *kind)
		return 2
	}
	if *secret == "" {
		fmt.Fprintln(stderr, "edged sign: -secret is required")
		return 2
	}
	if *id == "" {
		*id = newMessageID()
	}
	if *url != "" {
		cmd, err := signedCurl(*secret, *id, *url, b, now)
		if err != nil {
			fmt.Fprintln(stderr, "edged sign:", err)
			return 2
		}
		fmt.Fprintln(stdout, cmd)
		return 0
	}
	sig, err := channel.SignWebhook(*secret, *id, now.Unix(), b)
	if err != nil {
		fmt.Fprintln(stderr, "edged sign:", err)
		return 2
	}
	fmt.Fprintf(stdout, "webhook-id: %s\nwebhook-timestamp: %d\nwebhook-signature: %s\n", *id, now.Unix(), sig)
	return 0
}

// signChannel makes a WeChat Pay notification (the resource encrypted with
// the APIv3 key, the envelope signed with the platform key) or an Alipay
// one (the form signed with Alipay's key), as the channels send them.
func signChannel(kind, secret, keyFile, serial, event string, body []byte, now time.Time) (headers map[string]string, out []byte, ctype string, err error) {
	if keyFile == "" {
		return nil, nil, "", fmt.Errorf("-key is required for -kind %s: the private key `edged secret -kind %s` wrote", kind, kind)
	}
	pemText, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, "", fmt.Errorf("-key: %w", err)
	}
	key, err := query.ParsePrivateKey(string(pemText))
	if err != nil {
		return nil, nil, "", fmt.Errorf("-key %s: %w", keyFile, err)
	}
	if kind == "alipay" {
		var params map[string]string
		if err := json.Unmarshal(body, &params); err != nil {
			return nil, nil, "", errors.New(`-body: want the notification's parameters as a JSON object of strings, e.g. {"trade_no":"...","out_trade_no":"...","trade_status":"TRADE_SUCCESS","total_amount":"19.99","app_id":"..."}`)
		}
		out, err := (&channeltest.AlipaySigner{Key: key}).Notify(params)
		return nil, out, "application/x-www-form-urlencoded", err
	}
	if len(secret) != 32 {
		return nil, nil, "", errors.New("-secret: the channel's APIv3 key, 32 characters (EDGE_SECRET_<C>)")
	}
	if serial == "" {
		return nil, nil, "", errors.New("-serial is required for -kind wechatpay: the serial the platform key is configured under")
	}
	var resource map[string]any
	if err := json.Unmarshal(body, &resource); err != nil {
		return nil, nil, "", errors.New(`-body: want the resource as a JSON object, e.g. {"mchid":"...","out_trade_no":"...","transaction_id":"...","trade_state":"SUCCESS","amount":{"total":1999,"currency":"CNY"}}`)
	}
	signer := &channeltest.WeChatPaySigner{PlatformKey: key, Serial: serial, APIv3Key: secret}
	headers, out, err = signer.Notify(event, resource, now)
	return headers, out, "application/json", err
}

// printSigned prints a signed callback: its headers and body, or with url
// a curl command that sends it.
func printSigned(w io.Writer, url string, headers map[string]string, ctype string, body []byte) {
	names := make([]string, 0, len(headers))
	for k := range headers {
		names = append(names, k)
	}
	sort.Strings(names)
	if url == "" {
		for _, k := range names {
			fmt.Fprintf(w, "%s: %s\n", k, headers[k])
		}
		fmt.Fprintf(w, "content-type: %s\n\n%s\n", ctype, body)
		return
	}
	cmd := "curl -sS -i -X POST " + shellQuote(url) + " -H " + shellQuote("content-type: "+ctype)
	for _, k := range names {
		cmd += " -H " + shellQuote(k+": "+headers[k])
	}
	fmt.Fprintln(w, cmd+" --data-raw "+shellQuote(string(body)))
}
