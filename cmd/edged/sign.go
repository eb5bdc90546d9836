package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/notifyedge/notifyedge/edge/channel"
)

var errHelp = flag.ErrHelp

// runSign is `edged sign`: it prints the three Standard Webhooks headers for
// a body, or with -url a whole curl command, so people can craft callbacks
// by hand (a signature expires after 5 minutes).
func runSign(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("edged sign", flag.ContinueOnError)
	fs.SetOutput(stderr)
	secret := fs.String("secret", os.Getenv("EDGE_SIGN_SECRET"), `channel secret "whsec_..." (EDGE_SIGN_SECRET)`)
	body := fs.String("body", "", "the JSON body (default: read standard input)")
	id := fs.String("id", "", "webhook-id (default: a fresh msg_...)")
	ts := fs.Int64("timestamp", 0, "webhook-timestamp, unix seconds (default: now)")
	url := fs.String("url", "", "print a curl command for this URL instead of the headers")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *secret == "" {
		fmt.Fprintln(stderr, "edged sign: -secret is required")
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
