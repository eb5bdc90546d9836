package query_test

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/notifyedge/notifyedge/edge/reconcile/query"
)

// keyBytesIn reports whether msg holds any 8 characters in a row of the
// key text (its PEM armour lines aside).
func keyBytesIn(msg, key string) bool {
	var body strings.Builder
	for _, line := range strings.Split(key, "\n") {
		if !strings.HasPrefix(line, "-----") {
			body.WriteString(strings.TrimSpace(line))
		}
	}
	b := body.String()
	for i := 0; i+8 <= len(b); i++ {
		if strings.Contains(msg, b[i:i+8]) {
			return true
		}
	}
	return false
}

// The parser takes PKCS#1 and PKCS#8, as PEM or bare base64 (wrapped or
// not), and yields the same key each time.
func TestParsePrivateKeyForms(t *testing.T) {
	k := keys().merchant
	p8, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	p1 := x509.MarshalPKCS1PrivateKey(k)
	wrapped := base64.StdEncoding.EncodeToString(p8)
	var lines []string
	for len(wrapped) > 64 {
		lines, wrapped = append(lines, wrapped[:64]), wrapped[64:]
	}
	lines = append(lines, wrapped)
	for name, text := range map[string]string{
		"PKCS#1 PEM":            string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: p1})),
		"PKCS#8 PEM":            string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8})),
		"PKCS#1 base64":         base64.StdEncoding.EncodeToString(p1),
		"PKCS#8 base64":         base64.StdEncoding.EncodeToString(p8),
		"PKCS#8 base64, lines":  strings.Join(lines, "\n") + "\n",
		"PKCS#8 PEM, CRLF, pad": "\r\n" + strings.ReplaceAll(string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8})), "\n", "\r\n"),
	} {
		got, err := query.ParsePrivateKey(text)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !got.Equal(k) {
			t.Errorf("%s: another key", name)
		}
	}
}

// Garbage is refused with a message that says why and holds no byte of
// what it was given.
func TestParsePrivateKeyRefusesGarbage(t *testing.T) {
	k := keys().merchant
	p1 := x509.MarshalPKCS1PrivateKey(k)
	pub := x509.MarshalPKCS1PublicKey(&k.PublicKey)
	random := make([]byte, 600)
	rand.Read(random)
	for name, text := range map[string]string{
		"empty":              "",
		"words":              "SECRETSECRETSECRET, nothing like one",
		"random base64":      base64.StdEncoding.EncodeToString(random),
		"truncated PKCS#1":   base64.StdEncoding.EncodeToString(p1[:len(p1)/2]),
		"a public key, PEM":  string(pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: pub})),
		"PEM of random":      string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: random})),
		"an unfinished PEM":  "-----BEGIN PRIVATE KEY-----\n" + base64.StdEncoding.EncodeToString(p1)[:200],
		"two keys":           strings.Repeat(string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: p1})), 2),
		"encrypted PKCS#8":   string(pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: random})),
		"a changed key byte": base64.StdEncoding.EncodeToString(changedByte(p1)),
	} {
		_, err := query.ParsePrivateKey(text)
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if !strings.HasPrefix(err.Error(), "private key: ") {
			t.Errorf("%s: %v: does not say it is about the private key", name, err)
		}
		if keyBytesIn(err.Error(), text) {
			t.Errorf("%s: the message quotes the input: %v", name, err)
		}
	}
}

// changedByte returns der with a byte of the private exponent changed: it
// still parses, but the key no longer holds together.
func changedByte(der []byte) []byte {
	out := append([]byte(nil), der...)
	out[len(out)/2] ^= 0x40
	return out
}
