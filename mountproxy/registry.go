package mountproxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Credential is what the shim authenticates with on a tenant: exactly one
// of a client certificate and a bearer token.
type Credential struct {
	ClientCert *tls.Certificate
	Token      string
}

// Tenant is one tenant apiserver the shim may forward to.
type Tenant struct {
	// LogicalCluster is the workspace the tenant belongs to; Name its name
	// there. Together they form the path /<prefix>/<LogicalCluster>/<Name>/.
	LogicalCluster, Name string
	// URL of the tenant apiserver (https; a path is kept as a prefix).
	URL *url.URL
	// CA verifies the tenant's serving certificate; nothing else does.
	CA         *x509.CertPool
	Credential Credential
}

func (t Tenant) validate() error {
	switch {
	case !validSegment(t.LogicalCluster) || !validSegment(t.Name):
		return fmt.Errorf("tenant %q/%q: logical cluster and name must be DNS labels", t.LogicalCluster, t.Name)
	case t.URL == nil || t.URL.Scheme != "https" || t.URL.Host == "":
		return fmt.Errorf("tenant %s/%s: URL must be https://host[:port]", t.LogicalCluster, t.Name)
	case t.CA == nil:
		return fmt.Errorf("tenant %s/%s: a CA is required (the tenant is never reached without verifying it)", t.LogicalCluster, t.Name)
	case (t.Credential.ClientCert == nil) == (t.Credential.Token == ""):
		return fmt.Errorf("tenant %s/%s: set exactly one of a client certificate and a token", t.LogicalCluster, t.Name)
	}
	return nil
}

type key struct{ lc, name string }

// entry is a registered tenant with its transport; ctx ends when the
// tenant is replaced or removed, which ends its in-flight requests
// (watches, exec streams) at once.
type entry struct {
	tenant    Tenant
	transport *http.Transport
	ctx       context.Context
	cancel    context.CancelFunc
}

// Registry holds the tenants the shim forwards to.
type Registry struct {
	mu      sync.RWMutex
	tenants map[key]*entry
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{tenants: map[key]*entry{}} }

// Set adds or replaces a tenant. A replaced tenant's in-flight requests
// end; new requests use the new URL, CA and credential.
func (r *Registry) Set(t Tenant) error {
	if err := t.validate(); err != nil {
		return err
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: t.CA}
	if c := t.Credential.ClientCert; c != nil {
		tlsConfig.Certificates = []tls.Certificate{*c}
	}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tlsConfig,
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		// HTTP/1.1 only: exec, attach and port-forward upgrade the
		// connection, which HTTP/2 cannot.
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.mu.Lock()
	old := r.tenants[key{t.LogicalCluster, t.Name}]
	r.tenants[key{t.LogicalCluster, t.Name}] = &entry{tenant: t, transport: tr, ctx: ctx, cancel: cancel}
	r.mu.Unlock()
	if old != nil {
		old.cancel()
		old.transport.CloseIdleConnections()
	}
	return nil
}

// Delete removes (revokes) a tenant: the shim refuses it from now on and
// its in-flight requests end.
func (r *Registry) Delete(logicalCluster, name string) {
	r.mu.Lock()
	old := r.tenants[key{logicalCluster, name}]
	delete(r.tenants, key{logicalCluster, name})
	r.mu.Unlock()
	if old != nil {
		old.cancel()
		old.transport.CloseIdleConnections()
	}
}

func (r *Registry) lookup(logicalCluster, name string) (*entry, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.tenants[key{logicalCluster, name}]
	return e, ok
}

// errUnknownTenant: no tenant under this path (never registered, deleted
// or revoked).
var errUnknownTenant = errors.New("unknown tenant")
