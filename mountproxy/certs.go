package mountproxy

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"sync"
	"time"

	"github.com/knotless-dev/knotless/internal/tlsfiles"
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

// newReloader reads the shim's serving certificate and requestheader CA.
func newReloader(f Files, every time.Duration) (*tlsfiles.Reloader, error) {
	return tlsfiles.New(f.ServingCert, f.ServingKey, f.RequestHeaderCA, every)
}

// serverTLS serves r's current certificate and asks for (but does not
// verify at the TLS layer) a client certificate: the handler verifies it
// against the current requestheader CA and answers with a reason.
func serverTLS(r *tlsfiles.Reloader) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		ClientAuth:     tls.RequestClientCert,
		GetCertificate: r.GetCertificate,
	}
}

// ClientTLS is a client certificate and the CA that verifies the server,
// both reloaded when their files change (R08). The provider's probe uses
// it to reach the shim.
type ClientTLS struct {
	r  *tlsfiles.Reloader
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
	r, err := tlsfiles.New(certFile, keyFile, caFile, every)
	if err != nil {
		return nil, err
	}
	return &ClientTLS{r: r}, nil
}

// Transport returns a transport for the current material; the server is
// verified against the current CA only.
func (c *ClientTLS) Transport() *http.Transport {
	cert, pool := c.r.Current()
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
