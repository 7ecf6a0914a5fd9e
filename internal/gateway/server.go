package gateway

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Route is one hostname served by the gateway: the requester whose
// association record names it, and the Service of its tenant it goes to.
type Route struct {
	Hostname string
	// DID is the requester's: /.well-known/atproto-did answers it, so the
	// hostname can be the requester's ATProto handle.
	DID string
	// Tenant names the tenant for Server.Tenant (the VM).
	Tenant             string
	Namespace, Service string
	Port               int32
	// Rank orders claims of one hostname from several tenants: the lowest
	// holds it (the controller gives the age of the bidder's contract, so
	// a later lease cannot take a hostname an earlier one serves).
	Rank int64
}

// Routes is the gateway's table of routes, set per tenant.
type Routes struct {
	mu     sync.RWMutex
	byHost map[string][]Route
}

// Set replaces tenant's routes with routes (none: the tenant has no
// route).
func (t *Routes) Set(tenant string, routes []Route) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byHost == nil {
		t.byHost = map[string][]Route{}
	}
	for h, rs := range t.byHost {
		rs = slices.DeleteFunc(rs, func(r Route) bool { return r.Tenant == tenant })
		if len(rs) == 0 {
			delete(t.byHost, h)
		} else {
			t.byHost[h] = rs
		}
	}
	for _, r := range routes {
		r.Tenant = tenant
		h := strings.ToLower(r.Hostname)
		t.byHost[h] = append(t.byHost[h], r)
	}
}

// Get is the route that holds host: of its claims, the lowest rank (then
// the lowest tenant name).
func (t *Routes) Get(host string) (Route, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	rs := t.byHost[strings.ToLower(host)]
	if len(rs) == 0 {
		return Route{}, false
	}
	return slices.MinFunc(rs, func(a, b Route) int {
		if a.Rank != b.Rank {
			return int(min(max(a.Rank-b.Rank, -1), 1))
		}
		return strings.Compare(a.Tenant, b.Tenant)
	}), true
}

// Backend reaches one tenant's Services.
type Backend interface {
	// Endpoints are the ready endpoints of Service ns/name's port; none
	// is a *NoEndpoints error.
	Endpoints(ctx context.Context, ns, name string, port int32) ([]Endpoint, error)
	// DialPod connects to port of pod ns/pod.
	DialPod(ctx context.Context, ns, pod string, port int32) (net.Conn, error)
}

// ReasonHeader names, on the gateway's own answers (404, 421, 503, 502),
// why it did not forward; it is stripped from the tenant's answers.
const ReasonHeader = "Knotless-Gateway-Reason"

// Server forwards HTTP requests by hostname to their route's Service.
type Server struct {
	Routes *Routes
	// Tenant is the backend of a route's tenant.
	Tenant func(ctx context.Context, tenant string) (Backend, error)

	once      sync.Once
	transport *http.Transport
	mu        sync.Mutex
	targets   map[string]target // synthetic host → target
}

// maxTargets bounds the upstreams remembered (pods come and go): past it
// the table starts again, and a dial of a forgotten one fails once (502).
const maxTargets = 4096

func (s *Server) remember(host string, t target) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.targets) >= maxTargets {
		s.targets = nil
	}
	if s.targets == nil {
		s.targets = map[string]target{}
	}
	s.targets[host] = t
}

func (s *Server) lookup(host string) (target, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.targets[host]
	return t, ok
}

// target is what a synthetic upstream host stands for.
type target struct {
	backend Backend
	ep      Endpoint
}

func (s *Server) init() {
	s.once.Do(func() {
		s.transport = &http.Transport{
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
				host, _, _ := net.SplitHostPort(addr)
				t, ok := s.lookup(host)
				if !ok {
					return nil, errors.New("no such upstream")
				}
				return t.backend.DialPod(ctx, t.ep.Namespace, t.ep.Pod, t.ep.Port)
			},
			MaxIdleConnsPerHost:   8,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: 60 * time.Second,
		}
	})
}

// refuse answers with the gateway's own status and reason.
func refuse(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set(ReasonHeader, reason)
	http.Error(w, msg, code)
}

// hostOf is the request's hostname, lowercased, without a port.
func hostOf(r *http.Request) string {
	h := r.Host
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.init()
	host := hostOf(r)
	if r.TLS != nil && !strings.EqualFold(strings.TrimSuffix(r.TLS.ServerName, "."), host) {
		// A connection made for one name is not used for another.
		refuse(w, http.StatusMisdirectedRequest, "Misdirected", "this connection was made for another host")
		return
	}
	route, ok := s.Routes.Get(host)
	if !ok {
		refuse(w, http.StatusNotFound, ReasonNoRoute, "no gateway route for this host")
		return
	}
	if r.URL.Path == "/.well-known/atproto-did" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(route.DID))
		return
	}
	backend, err := s.Tenant(r.Context(), route.Tenant)
	if err != nil {
		refuse(w, http.StatusServiceUnavailable, ReasonTenantUnreachable, "the tenant cannot be reached")
		return
	}
	eps, err := backend.Endpoints(r.Context(), route.Namespace, route.Service, route.Port)
	var none *NoEndpoints
	switch {
	case errors.As(err, &none):
		refuse(w, http.StatusServiceUnavailable, none.Reason, none.Message)
		return
	case err != nil:
		refuse(w, http.StatusServiceUnavailable, ReasonTenantUnreachable, "the tenant's endpoints cannot be read")
		return
	}
	ep := eps[rand.IntN(len(eps))] //nolint:gosec // load spreading, not security
	// One synthetic upstream host per tenant and endpoint, so that the
	// transport pools connections per pod.
	up := fmt.Sprintf("%s.%s.%s.%d.upstream", hexName(route.Tenant), ep.Pod, ep.Namespace, ep.Port)
	s.remember(up, target{backend: backend, ep: ep})
	rp := &httputil.ReverseProxy{
		Transport: s.transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetXForwarded()
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort(up, strconv.Itoa(int(ep.Port)))
			pr.Out.Host = pr.In.Host
		},
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del(ReasonHeader)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) {
			refuse(w, http.StatusBadGateway, ReasonUpstreamFailed, "the service's pod did not answer")
		},
	}
	rp.ServeHTTP(w, r)
}

// hexName makes a tenant name fit a DNS label of the synthetic host.
func hexName(s string) string { return fmt.Sprintf("%x", s) }

// Close closes the idle upstream connections.
func (s *Server) Close() {
	s.init()
	s.transport.CloseIdleConnections()
}
