// Package channeltest produces callbacks exactly as the payment channels
// do, with keys of its own: for tests, benches and local trials. The
// adapters in package channel only verify; forging lives here, apart from
// the production code.
package channeltest

import (
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/notifyedge/notifyedge/edge/channel"
)

// WeChatPaySigner produces callbacks exactly as WeChat Pay does, with keys
// of its own: for tests, benches and local trials.
type WeChatPaySigner struct {
	PlatformKey *rsa.PrivateKey
	Serial      string
	APIv3Key    string
}

// NewWeChatPaySigner generates a platform key pair and an APIv3 key.
func NewWeChatPaySigner() (*WeChatPaySigner, error) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	key := make([]byte, 16)
	rand.Read(key)
	key[0] |= 0x10 // no leading zero: the serial reads the same as a certificate's number
	return &WeChatPaySigner{PlatformKey: k, Serial: fmt.Sprintf("%X", key[:8]), APIv3Key: fmt.Sprintf("%x", key)}, nil
}

// Certificate is a self-signed X.509 certificate (DER) of the platform key,
// its serial number Serial, valid until notAfter: the wechatpay_<serial>.pem
// merchants download, as DER.
func (s *WeChatPaySigner) Certificate(notAfter time.Time) ([]byte, error) {
	serial, ok := new(big.Int).SetString(s.Serial, 16)
	if !ok {
		return nil, fmt.Errorf("serial %q is not hex", s.Serial)
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "Tenpay.com Root CA"},
		NotBefore: notAfter.Add(-5 * 365 * 24 * time.Hour), NotAfter: notAfter}
	return x509.CreateCertificate(rand.Reader, tmpl, tmpl, &s.PlatformKey.PublicKey, s.PlatformKey)
}

// PublicKeyBase64 is the platform public key as base64 DER (PKIX), the form
// EDGE_CHANNEL_<CHANNEL>_PLATFORM_KEYS takes.
func (s *WeChatPaySigner) PublicKeyBase64() string {
	der, _ := x509.MarshalPKIXPublicKey(&s.PlatformKey.PublicKey)
	return base64.StdEncoding.EncodeToString(der)
}

// Notify returns the headers and body of a notification of eventType whose
// resource is the JSON of resource, encrypted with a fresh nonce and signed
// at now.
func (s *WeChatPaySigner) Notify(eventType string, resource any, now time.Time) (map[string]string, []byte, error) {
	plain, err := json.Marshal(resource)
	if err != nil {
		return nil, nil, err
	}
	block, _ := aes.NewCipher([]byte(s.APIv3Key))
	aead, _ := cipher.NewGCM(block)
	nonce := randomAlnum(12)
	ad := "transaction"
	if strings.HasPrefix(eventType, "REFUND.") {
		ad = "refund"
	}
	env := map[string]any{
		"id": "EV-" + randomAlnum(16), "create_time": now.Format(time.RFC3339), "resource_type": "encrypt-resource",
		"event_type": eventType, "summary": "notification",
		"resource": map[string]string{
			"original_type": ad, "algorithm": "AEAD_AES_256_GCM", "associated_data": ad, "nonce": nonce,
			"ciphertext": base64.StdEncoding.EncodeToString(aead.Seal(nil, []byte(nonce), plain, []byte(ad))),
		},
	}
	body, err := json.Marshal(env)
	if err != nil {
		return nil, nil, err
	}
	headers, err := s.Sign(body, now)
	return headers, body, err
}

// Sign returns the Wechatpay-* headers for body at now.
func (s *WeChatPaySigner) Sign(body []byte, now time.Time) (map[string]string, error) {
	ts, nonce := strconv.FormatInt(now.Unix(), 10), randomAlnum(32)
	sum := sha256.Sum256([]byte(ts + "\n" + nonce + "\n" + string(body) + "\n"))
	sig, err := rsa.SignPKCS1v15(rand.Reader, s.PlatformKey, crypto.SHA256, sum[:])
	if err != nil {
		return nil, err
	}
	return map[string]string{
		"Content-Type": "application/json", "Wechatpay-Timestamp": ts, "Wechatpay-Nonce": nonce,
		"Wechatpay-Signature": base64.StdEncoding.EncodeToString(sig), "Wechatpay-Serial": s.Serial,
	}, nil
}

func randomAlnum(n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// AlipaySigner produces notifications exactly as Alipay does, with a key of
// its own: for tests, benches and local trials.
type AlipaySigner struct{ Key *rsa.PrivateKey }

// NewAlipaySigner generates a key pair.
func NewAlipaySigner() (*AlipaySigner, error) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	return &AlipaySigner{Key: k}, nil
}

// PublicKeyBase64 is the public key as base64 DER, the form Alipay's
// console shows and EDGE_SECRET_<CHANNEL> takes.
func (s *AlipaySigner) PublicKeyBase64() string {
	der, _ := x509.MarshalPKIXPublicKey(&s.Key.PublicKey)
	return base64.StdEncoding.EncodeToString(der)
}

// Notify returns the signed form body for params (sign and sign_type are
// added).
func (s *AlipaySigner) Notify(params map[string]string) ([]byte, error) {
	form := url.Values{}
	for k, v := range params {
		form.Set(k, v)
	}
	sum := sha256.Sum256([]byte(channel.AlipaySignedContent(form)))
	sig, err := rsa.SignPKCS1v15(rand.Reader, s.Key, crypto.SHA256, sum[:])
	if err != nil {
		return nil, err
	}
	form.Set("sign_type", "RSA2")
	form.Set("sign", base64.StdEncoding.EncodeToString(sig))
	return []byte(form.Encode()), nil
}

// AlipayCertificates are the public-key certificate mode's files, PEM:
// Alipay's root certificate (alipayRootCert.crt), the app's public key
// certificate (appCertPublicKey_<app id>.crt) and Alipay's
// (alipayCertPublicKey_RSA2.crt), both issued by the root.
type AlipayCertificates struct {
	Root, App, Alipay []byte
}

// NewAlipayCertificates issues the certificate mode's files for the app's
// and Alipay's public keys, under a root of its own.
func NewAlipayCertificates(app, alipay *rsa.PublicKey) (AlipayCertificates, error) {
	rootKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return AlipayCertificates{}, err
	}
	now := time.Now()
	root := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Ant Financial Certification Authority Root"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(10 * 365 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	rootDER, err := x509.CreateCertificate(rand.Reader, root, root, &rootKey.PublicKey, rootKey)
	if err != nil {
		return AlipayCertificates{}, err
	}
	issue := func(serial int64, cn string, pub *rsa.PublicKey) ([]byte, error) {
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, root, pub, rootKey)
		if err != nil {
			return nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
	}
	var c AlipayCertificates
	c.Root = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: rootDER})
	if c.App, err = issue(2, "2021000000000001", app); err != nil {
		return c, err
	}
	if c.Alipay, err = issue(3, "支付宝(中国)网络技术有限公司", alipay); err != nil {
		return c, err
	}
	return c, nil
}
