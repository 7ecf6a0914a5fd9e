// Package tlsfiles keeps TLS material read from files current: a key pair
// and, optionally, a CA pool, read again when a file's modification time
// or size changes (R08), so certificates rotate without a restart.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

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

// Reloader holds a current key pair and CA pool read from files.
type Reloader struct {
	files []string // certificate, key[, CA]; or the CA alone (caOnly)
	every time.Duration
	// caOnly: files is a CA bundle only; system: its pool starts from
	// the system's roots.
	caOnly, system bool

	mu      sync.Mutex
	checked time.Time
	stamps  []stamp
	cert    *tls.Certificate
	pool    *x509.CertPool
}

// New loads the certificate and key, and the CA when caFile is not
// empty; every is how often the files are looked at again (at most). It
// fails if they cannot be loaded.
func New(certFile, keyFile, caFile string, every time.Duration) (*Reloader, error) {
	files := []string{certFile, keyFile}
	if caFile != "" {
		files = append(files, caFile)
	}
	r := &Reloader{files: files, every: every}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

// NewCA keeps the CA pool of caFile current (no key pair); with system
// the pool holds the system's roots too. It fails if the file holds no
// PEM certificate.
func NewCA(caFile string, system bool, every time.Duration) (*Reloader, error) {
	r := &Reloader{files: []string{caFile}, every: every, caOnly: true, system: system}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

// Pool is the current CA pool (Current's).
func (r *Reloader) Pool() *x509.CertPool {
	_, pool := r.Current()
	return pool
}

// loadCA reads the CA pool of caOnly.
func (r *Reloader) loadCA(st []stamp) error {
	pemCA, err := os.ReadFile(r.files[0])
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if r.system {
		if sys, err := x509.SystemCertPool(); err == nil {
			pool = sys
		}
	}
	if !pool.AppendCertsFromPEM(pemCA) {
		return errors.New("CA: no PEM certificate in " + r.files[0])
	}
	r.pool, r.stamps = pool, st
	return nil
}

func (r *Reloader) load() error {
	st := make([]stamp, len(r.files))
	for i, p := range r.files {
		s, err := stat(p)
		if err != nil {
			return err
		}
		st[i] = s
	}
	if r.caOnly {
		return r.loadCA(st)
	}
	cert, err := tls.LoadX509KeyPair(r.files[0], r.files[1])
	if err != nil {
		return fmt.Errorf("certificate %s: %w", r.files[0], err)
	}
	var pool *x509.CertPool
	if len(r.files) == 3 {
		pemCA, err := os.ReadFile(r.files[2])
		if err != nil {
			return err
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemCA) {
			return errors.New("CA: no PEM certificate in " + r.files[2])
		}
	}
	r.cert, r.pool, r.stamps = &cert, pool, st
	return nil
}

// Current returns the material, reloading it when a file changed (checked
// at most every r.every). A file that cannot be loaded keeps the previous
// material in use. The pool is nil when no CA file was given.
func (r *Reloader) Current() (*tls.Certificate, *x509.CertPool) {
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

// GetCertificate serves the current certificate (tls.Config.GetCertificate);
// nil for a CA-only Reloader.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c, _ := r.Current()
	return c, nil
}
