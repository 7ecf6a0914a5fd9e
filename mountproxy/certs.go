package mountproxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"
)

// Files are the shim's TLS material on disk. Every file is read again when
// its modification time or size changes (R08), so certificates rotate
// without a restart.
type Files struct {
	// ServingCert and ServingKey: the certificate kcp-front-proxy verifies
	// (issued by the CA of its mapping's backend_server_ca).
	ServingCert, ServingKey string
	// RequestHeaderCA verifies the client certificate of kcp-front-proxy
	// (and of the provider's probe).
	RequestHeaderCA string
}

type stamp struct {
	mod  time.Time
	size int64
}

func stat(path string) (stamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}, err
	}
	return stamp{fi.ModTime(), fi.Size()}, nil
}

// reloader holds a current key pair and CA pool read from three files:
// the shim's serving certificate and requestheader CA, or a client's
// certificate and its server's CA.
type reloader struct {
	files [3]string // certificate, key, CA
	every time.Duration

	mu      sync.Mutex
	checked time.Time
	stamps  [3]stamp
	cert    *tls.Certificate
	pool    *x509.CertPool
}

func newReloader(f Files, every time.Duration) (*reloader, error) {
	r := &reloader{files: [3]string{f.ServingCert, f.ServingKey, f.RequestHeaderCA}, every: every}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *reloader) load() error {
	var st [3]stamp
	for i, p := range r.files {
		s, err := stat(p)
		if err != nil {
			return err
		}
		st[i] = s
	}
	cert, err := tls.LoadX509KeyPair(r.files[0], r.files[1])
	if err != nil {
		return fmt.Errorf("certificate %s: %w", r.files[0], err)
	}
	pemCA, err := os.ReadFile(r.files[2])
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemCA) {
		return errors.New("CA: no PEM certificate in " + r.files[2])
	}
	r.cert, r.pool, r.stamps = &cert, pool, st
	return nil
}

// current returns the material, reloading it when a file changed (checked
// at most every r.every). A file that cannot be loaded keeps the previous
// material in use.
func (r *reloader) current() (*tls.Certificate, *x509.CertPool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) >= r.every {
		r.checked = time.Now()
		changed := false
		for i, p := range r.files {
			if s, err := stat(p); err == nil && s != r.stamps[i] {
				changed = true
			}
		}
		if changed {
			_ = r.load() // half-written files: try again at the next check
		}
	}
	return r.cert, r.pool
}

// TLSConfig serves the current certificate and asks for (but does not
// verify at the TLS layer) a client certificate: the handler verifies it
// against the current requestheader CA and answers with a reason.
func (r *reloader) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequestClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, _ := r.current()
			return c, nil
		},
	}
}

// ClientTLS is a client certificate and the CA that verifies the server,
// both reloaded when their files change (R08). The provider's probe uses
// it to reach the shim.
type ClientTLS struct {
	r  *reloader
	mu sync.Mutex
	// tr is built for cert and pool; a reload builds a new one.
	cert *tls.Certificate
	pool *x509.CertPool
	tr   *http.Transport
}

// NewClientTLS loads the files; it fails if they cannot be loaded.
func NewClientTLS(certFile, keyFile, caFile string, every time.Duration) (*ClientTLS, error) {
	if every <= 0 {
		every = 2 * time.Second
	}
	r := &reloader{files: [3]string{certFile, keyFile, caFile}, every: every}
	if err := r.load(); err != nil {
		return nil, err
	}
	return &ClientTLS{r: r}, nil
}

// Transport returns a transport for the current material; the server is
// verified against the current CA only.
func (c *ClientTLS) Transport() *http.Transport {
	cert, pool := c.r.current()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tr == nil || cert != c.cert || pool != c.pool {
		if c.tr != nil {
			c.tr.CloseIdleConnections()
		}
		c.cert, c.pool = cert, pool
		c.tr = &http.Transport{
			TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{*cert}},
			TLSHandshakeTimeout: 10 * time.Second,
			IdleConnTimeout:     90 * time.Second,
		}
	}
	return c.tr
}
