package tlsfiles

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	certutil "k8s.io/client-go/util/cert"
)

// TestNewCAReloads: a CA bundle's pool follows the file (R08); a file
// that holds no certificate keeps the last good pool; none at the start
// is an error.
func TestNewCAReloads(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ca.crt")
	first, _, _ := certutil.GenerateSelfSignedCertKey("first", nil, nil)
	second, _, _ := certutil.GenerateSelfSignedCertKey("second-with-a-longer-name", nil, nil)
	if err := os.WriteFile(path, first, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := NewCA(path, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	trusts := func(pemCert []byte) bool {
		certs, err := certutil.ParseCertsPEM(pemCert)
		if err != nil {
			t.Fatal(err)
		}
		_, err = certs[0].Verify(x509.VerifyOptions{Roots: r.Pool()})
		return err == nil
	}
	if !trusts(first) || trusts(second) {
		t.Fatal("the first pool")
	}
	later := time.Now().Add(time.Minute)
	if err := os.WriteFile(path, second, 0o600); err != nil {
		t.Fatal(err)
	}
	_ = os.Chtimes(path, later, later)
	if trusts(first) || !trusts(second) {
		t.Fatal("the pool did not follow the file")
	}
	if err := os.WriteFile(path, []byte("half written"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = os.Chtimes(path, later.Add(time.Minute), later.Add(time.Minute))
	if !trusts(second) {
		t.Fatal("a bad file replaced the last good pool")
	}
	if _, err := NewCA(filepath.Join(dir, "none"), true, 0); err == nil {
		t.Fatal("no file: no error")
	}
}
