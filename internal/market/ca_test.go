package market

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"
)

// testCA is a self-signed CA certificate named cn, as PEM, and its DER.
func testCA(t *testing.T, cn string) ([]byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), der
}

// TestCAFingerprintCoversTheWholeBundle (issue 29): the pin a lease
// carries covers every certificate the mount will trust. A bundle of one
// certificate keeps the value leases already carry (the SHA-256 of its
// DER); a bundle of [honest CA, attacker CA] does not have the honest
// CA's pin (it had before: only the first block was hashed while every
// block was trusted); anything in the bundle that is not a certificate
// makes it refused, so nothing unpinned can ride along.
func TestCAFingerprintCoversTheWholeBundle(t *testing.T) {
	honest, honestDER := testCA(t, "tenant")
	attacker, attackerDER := testCA(t, "attacker")
	sum := sha256.Sum256(honestDER)
	want := "sha256:" + hex.EncodeToString(sum[:])

	for name, bundle := range map[string][]byte{
		"one certificate":      honest,
		"trailing white space": append(append([]byte{}, honest...), "\n\n  \n"...),
		"leading white space":  append([]byte("\n  \r\n"), honest...),
		"CRLF line ends":       []byte(strings.ReplaceAll(string(honest), "\n", "\r\n")),
		"no final line feed":   honest[:len(honest)-1],
	} {
		if got, err := CAFingerprint(bundle); err != nil || got != want {
			t.Errorf("%s: CAFingerprint = %q, %v; want %q (the value leases already carry)", name, got, err, want)
		}
	}

	both := append(append([]byte{}, honest...), attacker...)
	got, err := CAFingerprint(both)
	if err != nil {
		t.Fatalf("[honest, attacker]: %v", err)
	}
	if got == want {
		t.Fatalf("[honest, attacker] has the honest CA's pin %s: the attacker's CA would be trusted unpinned", got)
	}
	all := sha256.Sum256(append(append([]byte{}, honestDER...), attackerDER...))
	if got != "sha256:"+hex.EncodeToString(all[:]) {
		t.Errorf("[honest, attacker] = %s, want the SHA-256 of both DERs in order", got)
	}
	if rev, _ := CAFingerprint(append(append([]byte{}, attacker...), honest...)); rev == got {
		t.Errorf("the order of the bundle does not change its pin")
	}

	key := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte{1, 2, 3}})
	notCert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not a certificate")})
	withHeaders := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: attackerDER})
	broken := []byte("-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n")
	cat := func(parts ...[]byte) []byte {
		var out []byte
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	for name, bundle := range map[string][]byte{
		"empty":                          nil,
		"white space only":               []byte(" \n"),
		"garbage":                        []byte("garbage"),
		"another kind of block":          key,
		"a certificate and a key":        cat(honest, key),
		"an unparsable certificate":      cat(honest, notCert),
		"a certificate with PEM headers": cat(honest, withHeaders),
		"trailing bytes":                 cat(honest, []byte("trailing")),
		"leading bytes":                  cat([]byte("note\n"), honest),
		"bytes between certificates":     cat(honest, []byte("between\n"), attacker),
		"a broken block before one":      cat(broken, honest),
		"a broken block after one":       cat(honest, broken),
		"an unterminated block":          cat(honest, []byte("-----BEGIN CERTIFICATE-----\nMIIB\n")),
	} {
		if got, err := CAFingerprint(bundle); err == nil {
			t.Errorf("%s: CAFingerprint = %q, want a refusal", name, got)
		} else if !strings.Contains(err.Error(), "CA bundle") {
			t.Errorf("%s: error %q does not say it is about the CA bundle", name, err)
		}
	}
}
