package serviceauth

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	certutil "k8s.io/client-go/util/cert"
)

// certLife is how long the webhook's serving certificate is valid: a
// tenant apiserver reads its webhook configuration (the CA) once, when
// it starts, so the certificate must outlive every VM started with it.
const certLife = 10 * 365 * 24 * time.Hour

// ServingCert returns the webhook's serving certificate for the IP
// address host and the PEM of the CA that signed it, kept in dir
// (tls.crt, tls.key, readable by the agent only) so that an agent that
// starts again keeps the CA its tenants were started with. It is made
// when neither file exists; one that is unreadable, expired or for
// another address is an error, not replaced: the running tenants trust
// its CA (remove both files to make a new one, then provision the
// tenants again).
func ServingCert(dir, host string) (tls.Certificate, []byte, error) {
	crtPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return tls.Certificate{}, nil, err
	}
	_, crtErr := os.Stat(crtPath)
	_, keyErr := os.Stat(keyPath)
	if !errors.Is(crtErr, os.ErrNotExist) || !errors.Is(keyErr, os.ErrNotExist) {
		pair, ca, err := load(crtPath, keyPath, host)
		if err != nil {
			return pair, nil, fmt.Errorf("the webhook's certificate in %s: %w (remove tls.crt and tls.key to make a new one)", dir, err)
		}
		return pair, ca, os.Chmod(keyPath, 0o600)
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return tls.Certificate{}, nil, fmt.Errorf("the webhook address %q is not an IP address", host)
	}
	crt, key, err := certutil.GenerateSelfSignedCertKeyWithOptions(certutil.SelfSignedCertKeyOptions{
		Host: host, AlternateIPs: []net.IP{ip}, MaxAge: certLife,
	})
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	if err := os.WriteFile(keyPath, key, 0o600); err != nil {
		return tls.Certificate{}, nil, err
	}
	if err := os.WriteFile(crtPath, crt, 0o600); err != nil {
		return tls.Certificate{}, nil, err
	}
	return load(crtPath, keyPath, host)
}

// load reads the pair and checks it serves host now; the CA is the
// chain's last certificate.
func load(crtPath, keyPath, host string) (tls.Certificate, []byte, error) {
	pair, err := tls.LoadX509KeyPair(crtPath, keyPath)
	if err != nil {
		return pair, nil, err
	}
	if len(pair.Certificate) < 2 {
		return pair, nil, errors.New("no CA in the chain")
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return pair, nil, err
	}
	if err := leaf.VerifyHostname(host); err != nil || time.Now().After(leaf.NotAfter) {
		return pair, nil, errors.New("not for this address, or expired")
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pair.Certificate[len(pair.Certificate)-1]})
	return pair, ca, nil
}
