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
// ClusterClientCertificate and GuestIdentityGrant controllers) use rather than reading the lease
// or the repo again. Nothing in it comes from the bidder's workspace.
package tenantreach

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
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

// Contract is a requester's contract named by an object of its namespace
// and how its tenant is reached: CC is nil when there is no such
// contract; Reach is set when Mounted; else Why says why not, and Gone
// whether that is for good (no such contract of the requester's side,
// or it is not Active: no tenant to reach).
type Contract struct {
	CC      *marketv1alpha1.ComputeContract
	Reach   Reach
	Mounted bool
	Why     string
	Gone    bool
}

// Lookup returns the contract name of namespace ns in the workspace
// cluster (read through c) and how its tenant is reached.
func (r *Registry) Lookup(ctx context.Context, c client.Reader, cluster, ns, name string) (Contract, error) {
	cc := &marketv1alpha1.ComputeContract{}
	switch err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cc); {
	case apierrors.IsNotFound(err):
		return Contract{Why: fmt.Sprintf("ComputeContract %s: not found in this namespace", name), Gone: true}, nil
	case err != nil:
		return Contract{}, err
	}
	if cc.Spec.Side != marketv1alpha1.SideRequester {
		return Contract{Why: fmt.Sprintf("ComputeContract %s is the bidder's side of a deal: only the requester's own tenant is reached from here", cc.Name), Gone: true}, nil
	}
	if cc.Status.Phase != marketv1alpha1.ContractActive {
		phase := string(cc.Status.Phase)
		if phase == "" {
			phase = "new"
		}
		return Contract{CC: cc, Why: fmt.Sprintf("ComputeContract %s is %s, not Active", cc.Name, phase), Gone: true}, nil
	}
	reach, ok := r.Get(cluster, cc.UID)
	if !ok {
		return Contract{CC: cc, Why: fmt.Sprintf("the tenant of ComputeContract %s is not mounted yet", cc.Name)}, nil
	}
	return Contract{CC: cc, Reach: reach, Mounted: true}, nil
}
