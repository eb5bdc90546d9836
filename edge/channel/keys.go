package channel

import (
	"bytes"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"
)

// PublicKey is a channel's verifying key as the channel hands it out: a
// bare public key, or an X.509 certificate (then with its serial and its
// expiry).
type PublicKey struct {
	Key *rsa.PublicKey
	// Serial is the serial an entry named ("SERIAL=..."), else a
	// certificate's serial number in upper-case hex (the form the
	// Wechatpay-Serial header carries); "" for a bare key without one.
	Serial string
	// NotAfter is a certificate's expiry; zero for a bare key.
	NotAfter time.Time
}

// ParsePublicKeys reads every key in text, in the forms the channels'
// consoles and downloaders hand out: PEM blocks (PUBLIC KEY, RSA PUBLIC
// KEY, CERTIFICATE; several in a row), and white-space separated base64 DER
// (PKIX or PKCS#1 public keys, certificates). Any item may be prefixed
// "SERIAL=" to name its serial (WeChat Pay's platform keys, "PUB_KEY_ID_..."
// included). An error names the item's position and why, never its bytes.
func ParsePublicKeys(text string) ([]PublicKey, error) {
	var out []PublicKey
	n := 0
	add := func(serial string, der []byte) error {
		n++
		k, err := parseDERKey(der)
		if err != nil {
			return fmt.Errorf("entry %d: %w", n, err)
		}
		if serial != "" {
			k.Serial = serial
		}
		out = append(out, k)
		return nil
	}
	rest := text
	for rest != "" {
		i := strings.Index(rest, "-----BEGIN ")
		before := rest
		if i >= 0 {
			before = rest[:i]
		}
		// The text before a PEM block: base64 items, and perhaps the
		// block's own "SERIAL=" written right against it.
		prefix := ""
		if i >= 0 {
			cut := strings.LastIndexAny(before, " \t\r\n")
			prefix, before = before[cut+1:], before[:cut+1]
		}
		for _, item := range strings.Fields(before) {
			serial, b64 := splitSerial(item)
			der, err := base64.StdEncoding.DecodeString(b64)
			if err != nil {
				n++
				return nil, fmt.Errorf("entry %d: neither PEM nor base64 DER", n)
			}
			if err := add(serial, der); err != nil {
				return nil, err
			}
		}
		if i < 0 {
			break
		}
		serial, ok := strings.CutSuffix(prefix, "=")
		if prefix != "" && (!ok || serial == "") {
			n++
			return nil, fmt.Errorf("entry %d: text against a PEM block (want SERIAL= or nothing)", n)
		}
		block, after := pem.Decode([]byte(rest[i:]))
		if block == nil {
			n++
			return nil, fmt.Errorf("entry %d: a PEM block that does not end", n)
		}
		if err := add(serial, block.Bytes); err != nil {
			return nil, err
		}
		rest = string(after)
	}
	if len(out) == 0 {
		return nil, errors.New("no key")
	}
	return out, nil
}

// ParsePublicKeyFile reads a key file: text as ParsePublicKeys takes it,
// or one binary DER key or certificate (a .cer or .der download).
func ParsePublicKeyFile(b []byte) ([]PublicKey, error) {
	if k, err := parseDERKey(b); err == nil {
		return []PublicKey{k}, nil
	}
	if !isText(b) {
		return nil, errors.New("neither PEM, base64 DER nor a DER key or certificate")
	}
	return ParsePublicKeys(string(b))
}

// splitSerial splits "SERIAL=base64" (base64 alone, its padding included,
// has no serial).
func splitSerial(item string) (serial, b64 string) {
	i := strings.IndexByte(item, '=')
	if i <= 0 || strings.Trim(item[i:], "=") == "" {
		return "", item
	}
	return item[:i], item[i+1:]
}

// parseDERKey reads a certificate, a PKIX or a PKCS#1 RSA public key.
func parseDERKey(der []byte) (PublicKey, error) {
	if c, err := x509.ParseCertificate(der); err == nil {
		rk, ok := c.PublicKey.(*rsa.PublicKey)
		if !ok {
			return PublicKey{}, errors.New("certificate: not an RSA key")
		}
		return PublicKey{Key: rk, Serial: fmt.Sprintf("%X", c.SerialNumber), NotAfter: c.NotAfter}, nil
	}
	if k, err := x509.ParsePKIXPublicKey(der); err == nil {
		if rk, ok := k.(*rsa.PublicKey); ok {
			return PublicKey{Key: rk}, nil
		}
		return PublicKey{}, errors.New("public key: not RSA")
	}
	if k, err := x509.ParsePKCS1PublicKey(der); err == nil {
		return PublicKey{Key: k}, nil
	}
	return PublicKey{}, errors.New("neither a certificate nor a PKIX or PKCS#1 public key")
}

func isText(b []byte) bool {
	return bytes.IndexFunc(b, func(r rune) bool { return r < 0x20 && r != '\n' && r != '\r' && r != '\t' }) < 0
}
