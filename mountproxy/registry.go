package mountproxy

import (
	"bytes"
	"context"
	"crypto/tls"

	"fmt"

	"net/http"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/knotless-dev/knotless/internal/mount"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// validate checks that t can be registered: DNS-label names, an https
// URL, a CA and exactly one credential.
func validate(t mount.Tenant) error {
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

// revokedFor is how long a revoked tenant is refused as Revoked (then as
// an unknown tenant), so that revocations do not pile up.
const revokedFor = time.Hour

// sameTarget reports whether two tenants have the same URL, credential
// and principals to impersonate: a registration that changes only the
// CA (a rotation) keeps in-flight requests running; a new URL, credential
// or principals end them (a user no longer named loses their watches).
func sameTarget(t, o mount.Tenant) bool {
	if t.URL.String() != o.URL.String() || t.Credential.Token != o.Credential.Token || !reflect.DeepEqual(t.Impersonate, o.Impersonate) {
		return false
	}
	a, b := t.Credential.ClientCert, o.Credential.ClientCert
	if (a == nil) != (b == nil) {
		return false
	}
	return a == nil || slices.EqualFunc(a.Certificate, b.Certificate, bytes.Equal) && reflect.DeepEqual(a.PrivateKey, b.PrivateKey)
}

// entry is a registered tenant with its transport; ctx ends when the
// tenant is replaced or removed, which ends its in-flight requests
// (watches, exec streams) at once.
type entry struct {
	tenant    mount.Tenant
	transport *http.Transport
	ctx       context.Context
	cancel    context.CancelFunc
}

// RegistryOptions configure the connections to tenants; zero fields take
// defaults.
type RegistryOptions struct {
	// Policy is the address policy every connection to a tenant passes
	// (R18); nil allows public addresses only.
	Policy *netpolicy.Policy
	// ResponseHeaderTimeout bounds the wait for a tenant's response
	// headers (default 60 s, the apiserver's own limit for requests that
	// are not long-running; watches and upgrades answer with headers at
	// once).
	ResponseHeaderTimeout time.Duration
}

// Registry holds the tenants the shim forwards to.
type Registry struct {
	opts    RegistryOptions
	ctx     context.Context
	mu      sync.RWMutex
	tenants map[key]*entry
	// revoked holds tenants removed by Revoke (and when) until they are
	// set again or an hour has passed,
	// so a refusal names the revocation.
	revoked map[key]time.Time
}

// NewRegistry returns an empty registry. Requests to its tenants end
// when ctx ends (at shutdown), or when their tenant is replaced or
// removed.
func NewRegistry(ctx context.Context, o RegistryOptions) *Registry {
	if o.ResponseHeaderTimeout <= 0 {
		o.ResponseHeaderTimeout = 60 * time.Second
	}
	return &Registry{opts: o, ctx: ctx, tenants: map[key]*entry{}, revoked: map[key]time.Time{}}
}

// Set adds or replaces a tenant; new requests use the new URL, CA and
// credential. A new URL or credential ends the replaced tenant's in-flight
// requests; a new CA alone does not. Setting a tenant exactly as it is
// registered changes nothing.
func (r *Registry) Set(t mount.Tenant) error {
	if err := validate(t); err != nil {
		return err
	}
	k := key{t.LogicalCluster, t.Name}
	prev, hadPrev := r.lookup(t.LogicalCluster, t.Name)
	keep := hadPrev && sameTarget(prev.tenant, t)
	if keep && prev.tenant.CA.Equal(t.CA) {
		return nil
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: t.CA}
	if c := t.Credential.ClientCert; c != nil {
		tlsConfig.Certificates = []tls.Certificate{*c}
	}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           r.opts.Policy.Dialer(10 * time.Second).DialContext,
		TLSClientConfig:       tlsConfig,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: r.opts.ResponseHeaderTimeout,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		// HTTP/1.1 only: exec, attach and port-forward upgrade the
		// connection, which HTTP/2 cannot.
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
	ctx, cancel := context.WithCancel(r.ctx)
	if keep {
		// A new CA only: requests in flight on verified connections go on;
		// new connections are verified against the new CA.
		cancel()
		ctx, cancel = prev.ctx, prev.cancel
	}
	r.mu.Lock()
	old := r.tenants[k]
	r.tenants[k] = &entry{tenant: t, transport: tr, ctx: ctx, cancel: cancel}
	delete(r.revoked, k)
	r.mu.Unlock()
	if old != nil {
		if !keep || old != prev {
			old.cancel()
		}
		old.transport.CloseIdleConnections()
	}
	return nil
}

// Delete removes a tenant: the shim refuses it from now on (as an unknown
// tenant) and its in-flight requests end.
func (r *Registry) Delete(logicalCluster, name string) { r.remove(logicalCluster, name, false) }

// Revoke removes a tenant like Delete; refusals name the revocation until
// the tenant is set again.
func (r *Registry) Revoke(logicalCluster, name string) { r.remove(logicalCluster, name, true) }

func (r *Registry) remove(logicalCluster, name string, revoke bool) {
	k := key{logicalCluster, name}
	r.mu.Lock()
	old := r.tenants[k]
	delete(r.tenants, k)
	if revoke {
		now := time.Now()
		r.revoked[k] = now
		for old, at := range r.revoked {
			if now.Sub(at) > revokedFor {
				delete(r.revoked, old)
			}
		}
	} else {
		delete(r.revoked, k)
	}
	r.mu.Unlock()
	if old != nil {
		old.cancel()
		old.transport.CloseIdleConnections()
	}
}

// Len returns the number of registered tenants.
func (r *Registry) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.tenants)
}

func (r *Registry) lookup(logicalCluster, name string) (*entry, bool) {
	e, ok, _ := r.find(logicalCluster, name)
	return e, ok
}

// find also tells whether a missing tenant was revoked.
func (r *Registry) find(logicalCluster, name string) (e *entry, ok, revoked bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	k := key{logicalCluster, name}
	e, ok = r.tenants[k]
	_, revoked = r.revoked[k]
	return e, ok, revoked
}
