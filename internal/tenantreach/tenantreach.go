// Package tenantreach is how the requester's side of a market contract
// reaches its tenant: with what the bidder's signed lease says of the
// tenant (deal.Tenant: endpoint, pinned CA bundle, service identity) and
// a service-auth token of the requester's own DID, through the
// provider's address policy, following no redirect and reading bounded
// answers.
//
// The requester's controller checks the lease and holds the repo that
// mints the tokens; it publishes each mounted contract's Reach in a
// Registry, which other controllers of the requester's side (the
// ClusterClientCertificate controller) use rather than reading the lease
// or the repo again. Nothing in it comes from the bidder's workspace.
package tenantreach

import (
	"context"
	"net/http"
	"net/url"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/knotless-dev/knotless/internal/bodylimit"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// MaxAnswer bounds what is read of one answer of a tenant by a Client
// (an RBAC object, a CertificateSigningRequest).
const MaxAnswer = 1 << 20

// Config is the configuration of the tenant tn as the bearer of token: it
// dials through policy only (no proxy from the environment, whose address
// alone the policy would check) and reads at most maxAnswer of an answer.
// Its clients must follow no redirect (which would carry the token
// elsewhere): Client's does not.
func Config(tn deal.Tenant, token string, policy *netpolicy.Policy, maxAnswer int64) *rest.Config {
	return &rest.Config{Host: tn.Endpoint, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: tn.CA}, Timeout: 15 * time.Second,
		Proxy: func(*http.Request) (*url.URL, error) { return nil, nil }, Dial: policy.Dialer(10 * time.Second).DialContext,
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper { return bodylimit.Transport(rt, maxAnswer) }}
}

// Client is a client of the tenant tn as the bearer of token (Config,
// answers of at most MaxAnswer) that follows no redirect.
func Client(tn deal.Tenant, token string, policy *netpolicy.Policy) (kubernetes.Interface, error) {
	cfg := Config(tn, token, policy, MaxAnswer)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	hc.CheckRedirect = netpolicy.NoRedirects
	return kubernetes.NewForConfigAndClient(cfg, hc)
}

// Reach is how a mounted contract's tenant is reached by the requester's
// side.
type Reach struct {
	// Tenant is what the bidder's lease says of the tenant, as checked by
	// deal.TenantOf.
	Tenant deal.Tenant
	// Client returns a client of the tenant as the requester's DID: it
	// bears a service-auth token the requester's repo mints for the
	// tenant, expiring at exp, and is a Client (the provider's address
	// policy, no redirect, bounded answers).
	Client func(ctx context.Context, exp time.Time) (kubernetes.Interface, error)
}

// Registry holds the Reach of every contract the requester's side has
// mounted, by workspace (logical cluster) and contract UID: a contract of
// another workspace, or another contract of the same name, finds nothing.
type Registry struct{ m sync.Map }

func key(cluster string, uid types.UID) string { return cluster + "/" + string(uid) }

// Put records the Reach of the contract uid in cluster.
func (r *Registry) Put(cluster string, uid types.UID, reach Reach) {
	r.m.Store(key(cluster, uid), reach)
}

// Get returns the Reach of the contract uid in cluster, if it is mounted.
func (r *Registry) Get(cluster string, uid types.UID) (Reach, bool) {
	if r == nil {
		return Reach{}, false
	}
	v, ok := r.m.Load(key(cluster, uid))
	if !ok {
		return Reach{}, false
	}
	return v.(Reach), true
}

// Delete forgets the contract uid of cluster (its mount is gone).
func (r *Registry) Delete(cluster string, uid types.UID) {
	if r != nil {
		r.m.Delete(key(cluster, uid))
	}
}
