package channel

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strings"
	"sync"
	"time"
)

// The generic channel: a JSON body (see jsonbody.go) authenticated by the
// Standard Webhooks scheme. Headers:
//
//	webhook-id:        the delivery's message id
//	webhook-timestamp: unix seconds, at most 5 minutes from now
//	webhook-signature: space-separated "v1,<base64 HMAC-SHA256>" entries over
//	                   "{id}.{timestamp}.{raw body}"; any one entry may match
//	                   any one of the channel's secrets (rotation)

var (
	headerWebhookID        = "webhook-id"
	headerWebhookTimestamp = "webhook-timestamp"
	headerWebhookSignature = "webhook-signature"
	mediaJSON              = []byte("application/json")
)

// GenericConfig configures a generic JSON channel.
type GenericConfig struct {
	// Name is the channel name, [a-z0-9_]{1,32}.
	Name string
	// Secrets are the channel's signing secrets ("whsec_" + base64 of the
	// key); any one may match, so a rotation holds the old and the new.
	Secrets []string
	// Now is the clock (default time.Now), for tests.
	Now func() time.Time
}

// Generic is the generic JSON channel.
type Generic struct {
	name string
	macs []sync.Pool // one pool of HMAC states per secret
	now  func() time.Time
}

var _ Channel = (*Generic)(nil)

// ErrBadSecret marks a channel secret that is not "whsec_" + base64.
var ErrBadSecret = errors.New("edge: bad channel secret")

// NewGeneric returns the generic channel for cfg.
func NewGeneric(cfg GenericConfig) (*Generic, error) {
	if !ValidChannelName(cfg.Name) {
		return nil, fmt.Errorf("channel %q: name must match [a-z0-9_]{1,32}", cfg.Name)
	}
	if len(cfg.Secrets) == 0 || len(cfg.Secrets) > maxSecrets {
		return nil, fmt.Errorf("channel %s: %w: 1 to %d secrets, got %d", cfg.Name, ErrBadSecret, maxSecrets, len(cfg.Secrets))
	}
	g := &Generic{name: cfg.Name, macs: make([]sync.Pool, len(cfg.Secrets)), now: cfg.Now}
	if g.now == nil {
		g.now = time.Now
	}
	for i, s := range cfg.Secrets {
		key, err := DecodeWebhookSecret(s)
		if err != nil {
			return nil, fmt.Errorf("channel %s: secret %d: %w", cfg.Name, i+1, err)
		}
		g.macs[i].New = func() any { return hmac.New(sha256.New, key) }
	}
	return g, nil
}

// Name returns the channel name.
func (g *Generic) Name() string { return g.name }

// minSecretBytes is the shortest key a secret may decode to: 24 bytes
// (192 bits), the Standard Webhooks libraries' own floor for generated
// secrets.
const minSecretBytes = 24

// DecodeWebhookSecret returns the key of a Standard Webhooks secret,
// "whsec_<base64>" or the bare base64 (both reference libraries take
// either).
func DecodeWebhookSecret(s string) ([]byte, error) {
	b64 := strings.TrimPrefix(s, "whsec_")
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(key) == 0 {
		return nil, fmt.Errorf("%w: not base64 (with or without whsec_)", ErrBadSecret)
	}
	if len(key) < minSecretBytes {
		return nil, fmt.Errorf("%w: %d bytes once decoded, at least %d", ErrBadSecret, len(key), minSecretBytes)
	}
	return key, nil
}

// Parse authenticates req (401) and parses its body (400).
func (g *Generic) Parse(req *Request, d *Delivery) *Reject {
	if rej := g.verify(req, d); rej != nil {
		return rej
	}
	if !isMedia(req.ContentType, mediaJSON) {
		return badRequest("content-type: must be application/json")
	}
	if rej := parseGenericBody(req.Body, d); rej != nil {
		return rej
	}
	d.Finish(g.name)
	return nil
}

// Redrive decides again a body stored in a review row: its signature was
// checked when it arrived (and webhook signatures expire), so only the
// body rules run.
func (g *Generic) Redrive(body []byte, d *Delivery) *Reject {
	if rej := parseGenericBody(body, d); rej != nil {
		return rej
	}
	d.Finish(g.name)
	return nil
}

func (g *Generic) verify(req *Request, d *Delivery) *Reject {
	id, ok1 := single(req.Header, headerWebhookID)
	ts, ok2 := single(req.Header, headerWebhookTimestamp)
	sigs, ok3 := single(req.Header, headerWebhookSignature)
	if !ok1 || !ok2 || !ok3 {
		return unauthorized("webhook-id, webhook-timestamp or webhook-signature repeated: send one of each (several signatures go space-separated in one header)")
	}
	if len(id) == 0 || len(ts) == 0 || len(sigs) == 0 {
		return unauthorized("missing webhook-id, webhook-timestamp or webhook-signature")
	}
	if len(id) > 256 {
		return unauthorized("webhook-id too long")
	}
	sec, ok := parseUnixSeconds(ts)
	if !ok {
		return unauthorized("webhook-timestamp: not unix seconds")
	}
	if d := g.now().Sub(time.Unix(sec, 0)); d > WebhookTolerance || d < -WebhookTolerance {
		return unauthorized("webhook-timestamp: more than 5 minutes from now")
	}
	sums := &d.macs // pooled: a local array would escape through hash.Hash
	n := min(len(g.macs), len(sums))
	for i := range n {
		mac := g.macs[i].Get().(hash.Hash)
		mac.Reset()
		mac.Write(id)
		mac.Write(dot)
		mac.Write(ts)
		mac.Write(dot)
		mac.Write(req.Body)
		mac.Sum(sums[i][:0])
		g.macs[i].Put(mac)
	}
	var got [sha256.Size + 3]byte
	for entry := range bytes.SplitSeq(sigs, space) {
		b64, ok := bytes.CutPrefix(entry, v1Prefix)
		if !ok || base64.StdEncoding.DecodedLen(len(b64)) > len(got) {
			continue
		}
		m, err := base64.StdEncoding.Decode(got[:], b64)
		if err != nil || m != sha256.Size {
			continue
		}
		for i := range n {
			if hmac.Equal(got[:m], sums[i][:]) {
				return nil
			}
		}
	}
	return unauthorized("no webhook-signature entry matches")
}

var (
	dot      = []byte(".")
	space    = []byte(" ")
	v1Prefix = []byte("v1,")
)

// Render renders the generic answer: Content-Type application/json, body
// {"code":..,"outcome":..,"status":..,"message":..}.
func (g *Generic) Render(dst []byte, v *Verdict) ([]byte, string) {
	return AppendVerdictJSON(dst, v), "application/json"
}

// SignWebhook returns the webhook-signature value "v1,<base64>" of body
// under secret for message id and unix timestamp ts: what a channel sends.
func SignWebhook(secret, id string, ts int64, body []byte) (string, error) {
	key, err := DecodeWebhookSecret(secret)
	if err != nil {
		return "", err
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%d.", id, ts)
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)), nil
}
