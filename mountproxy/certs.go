package mountproxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
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

// reloader holds the current serving certificate and requestheader pool.
type reloader struct {
	files Files
	every time.Duration

	mu      sync.Mutex
	checked time.Time
	stamps  [3]stamp
	cert    *tls.Certificate
	pool    *x509.CertPool
}

func newReloader(f Files, every time.Duration) (*reloader, error) {
	r := &reloader{files: f, every: every}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *reloader) load() error {
	var st [3]stamp
	for i, p := range []string{r.files.ServingCert, r.files.ServingKey, r.files.RequestHeaderCA} {
		s, err := stat(p)
		if err != nil {
			return err
		}
		st[i] = s
	}
	cert, err := tls.LoadX509KeyPair(r.files.ServingCert, r.files.ServingKey)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	pemCA, err := os.ReadFile(r.files.RequestHeaderCA)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemCA) {
		return errors.New("requestheader CA: no PEM certificate in " + r.files.RequestHeaderCA)
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
		for i, p := range []string{r.files.ServingCert, r.files.ServingKey, r.files.RequestHeaderCA} {
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
