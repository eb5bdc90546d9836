package channel_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/notifyedge/notifyedge/edge/channel"
)

// testCert is a certificate of key with serial, valid until notAfter.
func testCert(t *testing.T, key *rsa.PrivateKey, serial int64, notAfter time.Time) []byte {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "platform"},
		NotBefore: notAfter.Add(-365 * 24 * time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func pemOf(typ string, der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

// Every form a channel hands out: base64 DER (PKIX, PKCS#1, a
// certificate), PEM (public key, RSA public key, certificate, several in a
// row), with or without a SERIAL= in front.
func TestParsePublicKeysForms(t *testing.T) {
	k1, _ := rsa.GenerateKey(rand.Reader, 2048)
	k2, _ := rsa.GenerateKey(rand.Reader, 2048)
	pkix1, _ := x509.MarshalPKIXPublicKey(&k1.PublicKey)
	pkcs1 := x509.MarshalPKCS1PublicKey(&k2.PublicKey)
	expiry := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	cert := testCert(t, k2, 0x5157F09EFDC096DE, expiry)
	b64 := base64.StdEncoding.EncodeToString
	for _, c := range []struct {
		name, text string
		want       []channel.PublicKey
	}{
		{"base64 PKIX", b64(pkix1), []channel.PublicKey{{Key: &k1.PublicKey}}},
		{"base64 PKCS#1", b64(pkcs1), []channel.PublicKey{{Key: &k2.PublicKey}}},
		{"base64 certificate", b64(cert), []channel.PublicKey{{Key: &k2.PublicKey, Serial: "5157F09EFDC096DE", NotAfter: expiry}}},
		{"PEM public key", pemOf("PUBLIC KEY", pkix1), []channel.PublicKey{{Key: &k1.PublicKey}}},
		{"PEM RSA public key", pemOf("RSA PUBLIC KEY", pkcs1), []channel.PublicKey{{Key: &k2.PublicKey}}},
		{"PEM certificate", pemOf("CERTIFICATE", cert), []channel.PublicKey{{Key: &k2.PublicKey, Serial: "5157F09EFDC096DE", NotAfter: expiry}}},
		{"two PEM blocks and a base64 key", pemOf("PUBLIC KEY", pkix1) + pemOf("CERTIFICATE", cert) + "\n" + b64(pkcs1) + "\n",
			[]channel.PublicKey{{Key: &k1.PublicKey}, {Key: &k2.PublicKey, Serial: "5157F09EFDC096DE", NotAfter: expiry}, {Key: &k2.PublicKey}}},
		{"serials named", "PUB_KEY_ID_0114=" + pemOf("PUBLIC KEY", pkix1) + " 7A1=" + b64(pkcs1),
			[]channel.PublicKey{{Key: &k1.PublicKey, Serial: "PUB_KEY_ID_0114"}, {Key: &k2.PublicKey, Serial: "7A1"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := channel.ParsePublicKeys(c.text)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.want) {
				t.Fatalf("%d keys, want %d", len(got), len(c.want))
			}
			for i := range got {
				if !got[i].Key.Equal(c.want[i].Key) || got[i].Serial != c.want[i].Serial || !got[i].NotAfter.Equal(c.want[i].NotAfter) {
					t.Errorf("key %d: serial %q not after %v, want %q %v (same key: %v)", i, got[i].Serial, got[i].NotAfter,
						c.want[i].Serial, c.want[i].NotAfter, got[i].Key.Equal(c.want[i].Key))
				}
			}
		})
	}
	// A downloaded .cer: binary DER.
	got, err := channel.ParsePublicKeyFile(cert)
	if err != nil || len(got) != 1 || got[0].Serial != "5157F09EFDC096DE" {
		t.Errorf("DER certificate file: %+v %v", got, err)
	}
}

// What is not a key is refused naming the entry and why, never its bytes.
func TestParsePublicKeysRefusals(t *testing.T) {
	k, _ := rsa.GenerateKey(rand.Reader, 2048)
	pkix1, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
	good := base64.StdEncoding.EncodeToString(pkix1)
	for _, c := range []struct{ name, text, want string }{
		{"empty", "  \n", "no key"},
		{"not base64", good + " not-a-key!", "entry 2: neither PEM nor base64 DER"},
		{"base64 of nothing", good + " " + base64.StdEncoding.EncodeToString([]byte("hello")), "entry 2: neither a certificate"},
		{"cut PEM", "-----BEGIN PUBLIC KEY-----\n" + good[:40], "entry 1: a PEM block that does not end"},
		{"text against PEM", "junk" + pemOf("PUBLIC KEY", pkix1), "entry 1: text against a PEM block"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := channel.ParsePublicKeys(c.text)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
			if strings.Contains(err.Error(), good[:20]) {
				t.Errorf("the error shows key material: %v", err)
			}
		})
	}
}
