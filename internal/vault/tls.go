package vault

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"sync"
)

// caFile is a CA bundle that is re-read whenever a TLS connection is
// verified, so a rotated CA is used without a restart (R08). Connections
// are pooled, so this happens once per new connection, not per request.
type caFile struct {
	path string

	mu   sync.Mutex
	raw  []byte
	pool *x509.CertPool
}

func (f *caFile) get() (*x509.CertPool, error) {
	raw, err := os.ReadFile(f.path)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		if f.pool != nil {
			// Keep the last good pool while the file is being replaced.
			return f.pool, nil
		}
		return nil, fmt.Errorf("reading CA file: %w", err)
	}
	if f.pool != nil && bytes.Equal(raw, f.raw) {
		return f.pool, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw) {
		if f.pool != nil {
			return f.pool, nil
		}
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", f.path)
	}
	f.raw, f.pool = raw, pool
	return pool, nil
}

// dialTLS returns a DialTLSContext for http.Transport that verifies Vault
// against the CA file's current content (standard chain and host name
// checks; the host name is the one dialled unless base names one).
func dialTLS(base *tls.Config, f *caFile) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		pool, err := f.get()
		if err != nil {
			return nil, err
		}
		cfg := base.Clone()
		cfg.RootCAs = pool
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			cfg.ServerName = host
		}
		d := &tls.Dialer{Config: cfg}
		return d.DialContext(ctx, network, addr)
	}
}
