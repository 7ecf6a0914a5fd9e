package gateway

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// Endpoint is a ready pod behind a Service and the port to dial on it.
type Endpoint struct {
	Namespace, Pod string
	Port           int32
}

// Why a Service has no endpoint to forward to: the reasons a Gateway's
// condition and the gateway's 503 give.
const (
	ReasonServiceNotFound   = "ServiceNotFound"
	ReasonPortNotFound      = "PortNotFound"
	ReasonNoReadyEndpoint   = "NoReadyEndpoint"
	ReasonNoRoute           = "NoRoute"
	ReasonUpstreamFailed    = "UpstreamUnreachable"
	ReasonTenantUnreachable = "TenantUnreachable"
)

// maxSlices bounds the EndpointSlices read of one Service (R21): a
// Service has one per 100 endpoints.
const maxSlices = 16

// maxPerSlice bounds the endpoints read of one EndpointSlice (Kubernetes
// puts at most 1000 in one).
const maxPerSlice = 1000

// NoEndpoints is why a Service has no ready endpoint (Reason is one of
// the Reason constants).
type NoEndpoints struct{ Reason, Message string }

func (e *NoEndpoints) Error() string { return e.Message }

// ReadyEndpoints are the ready pods of Service ns/name for its port
// (the Service's port, not the target port), from its EndpointSlices. No
// ready endpoint is a *NoEndpoints error.
func ReadyEndpoints(ctx context.Context, cs kubernetes.Interface, ns, name string, port int32) ([]Endpoint, error) {
	svc, err := cs.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, &NoEndpoints{ReasonServiceNotFound, fmt.Sprintf("service %s/%s does not exist in the tenant", ns, name)}
	}
	if err != nil {
		return nil, err
	}
	sp := tcpPort(svc, port)
	if sp == nil {
		return nil, &NoEndpoints{ReasonPortNotFound, fmt.Sprintf("service %s/%s has no TCP port %d", ns, name, port)}
	}
	slices, err := cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + name, Limit: maxSlices,
	})
	if err != nil {
		return nil, err
	}
	var out []Endpoint
	// The limit is only asked of the tenant's API server: it is kept here.
	for _, s := range slices.Items[:min(len(slices.Items), maxSlices)] {
		out = append(out, readyIn(&s, ns, sp.Name)...)
	}
	if len(out) == 0 {
		return nil, &NoEndpoints{ReasonNoReadyEndpoint, fmt.Sprintf("service %s/%s has no ready endpoint", ns, name)}
	}
	return out, nil
}

// tcpPort is svc's TCP port numbered port, or nil.
func tcpPort(svc *corev1.Service, port int32) *corev1.ServicePort {
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		if p.Port == port && p.Protocol != corev1.ProtocolUDP && p.Protocol != corev1.ProtocolSCTP {
			return p
		}
	}
	return nil
}

// readyIn are the ready pods of one EndpointSlice for the Service port
// named portName ("" when the Service has one unnamed port).
func readyIn(s *discoveryv1.EndpointSlice, ns, portName string) []Endpoint {
	target := int32(-1)
	for _, p := range s.Ports {
		if p.Port != nil && ptr.Deref(p.Name, "") == portName {
			target = *p.Port
		}
	}
	if target < 1 {
		return nil
	}
	var out []Endpoint
	for _, e := range s.Endpoints[:min(len(s.Endpoints), maxPerSlice)] {
		if !ptr.Deref(e.Conditions.Ready, true) || e.TargetRef == nil || e.TargetRef.Kind != "Pod" {
			continue
		}
		out = append(out, Endpoint{Namespace: ns, Pod: e.TargetRef.Name, Port: target})
	}
	return out
}

// KubeBackend reaches one tenant's Services with its admin configuration:
// endpoints from its API (remembered for endpointsTTL), connections
// through its port-forward subresource.
type KubeBackend struct {
	*PodDialer
	cs kubernetes.Interface

	reads singleflight.Group // one read of a Service port at a time
	mu    sync.Mutex
	seen  map[string]seenEndpoints
}

// seenEndpoints are a Service port's endpoints (or why it has none) as
// read at a time.
type seenEndpoints struct {
	at  time.Time
	eps []Endpoint
	err error
}

// endpointsTTL is how long a Service's endpoints are used before they are
// read again: a pod that went ready or away is seen within it.
const endpointsTTL = time.Second

// maxSeen bounds the Service ports remembered per tenant.
const maxSeen = 256

// NewKubeBackend reaches the tenant cfg (its admin) names.
func NewKubeBackend(cfg *rest.Config) (*KubeBackend, error) {
	d, err := NewPodDialer(cfg)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(d.cfg)
	if err != nil {
		return nil, err
	}
	return &KubeBackend{PodDialer: d, cs: cs, seen: map[string]seenEndpoints{}}, nil
}

// Endpoints implements Backend. What the tenant's API answered, even an
// error, is kept for endpointsTTL, and one read of a Service port runs at
// a time, however many requests wait for it; a waiter whose context ends
// stops waiting.
func (b *KubeBackend) Endpoints(ctx context.Context, ns, name string, port int32) ([]Endpoint, error) {
	k := fmt.Sprintf("%s/%s:%d", ns, name, port)
	if s, ok := b.fresh(k); ok {
		return s.eps, s.err
	}
	ch := b.reads.DoChan(k, func() (any, error) {
		// A read that ended between the look above and this flight
		// answers it: no second read.
		if s, ok := b.fresh(k); ok {
			return s, nil
		}
		// The read is shared: no one caller's end cancels it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endpointsRead)
		defer cancel()
		eps, err := ReadyEndpoints(rctx, b.cs, ns, name, port)
		seen := seenEndpoints{at: time.Now(), eps: eps, err: err}
		b.mu.Lock()
		if len(b.seen) >= maxSeen {
			clear(b.seen)
		}
		b.seen[k] = seen
		b.mu.Unlock()
		return seen, nil
	})
	select {
	case r := <-ch:
		seen := r.Val.(seenEndpoints)
		return seen.eps, seen.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// fresh is the answer of the last read of k, if it is recent enough.
func (b *KubeBackend) fresh(k string) (seenEndpoints, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.seen[k]
	return s, ok && time.Since(s.at) < endpointsTTL
}

// endpointsRead bounds one read of a Service's endpoints (both calls).
const endpointsRead = 15 * time.Second
