package gateway

import (
	"cmp"
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
	// Rank orders the claims of a hostname that nobody holds: the lowest
	// takes it (the controller gives the age of the bidder's contract).
	Rank int64
}

// Routes is the gateway's table of routes, set per tenant.
//
// A hostname claimed by several tenants is served for one of them, its
// holder. A later claim never takes a hostname that is held: a holder
// that stops claiming it (its record deleted, its lease ended, or only a
// blip of its VM or of its requester's PDS) keeps it, unserved, for
// HolderGrace; only then does the lowest-ranked claim take it. Holders
// are kept across restarts (Saved, Restore): a restored holder counts as
// one that stopped claiming at the restart.
type Routes struct {
	// Saved, if set, is called with a copy of the holders after they
	// change (with the table's lock held: it must not call back).
	Saved func(holders map[string]string)
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	mu      sync.Mutex
	byHost  map[string][]Route
	holders map[string]holder
}

// holder is a hostname's holder, and since when it has not claimed it
// (zero while it does).
type holder struct {
	tenant string
	idle   time.Time
}

// HolderGrace is how long a holder that no longer claims its hostname
// keeps it.
const HolderGrace = 10 * time.Minute

func (t *Routes) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}

// Restore sets the holders kept before a restart.
func (t *Routes) Restore(holders map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.holders = make(map[string]holder, len(holders))
	for h, tenant := range holders {
		t.holders[h] = holder{tenant: tenant, idle: t.now()}
	}
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
	t.settleAll()
}

// settleAll settles every hostname claimed or held, and saves the holders
// if they changed.
func (t *Routes) settleAll() {
	if t.holders == nil {
		t.holders = map[string]holder{}
	}
	changed := false
	for h := range t.byHost {
		changed = t.settle(h) || changed
	}
	for h := range t.holders {
		if _, claimed := t.byHost[h]; !claimed {
			changed = t.settle(h) || changed
		}
	}
	if changed && t.Saved != nil {
		saved := make(map[string]string, len(t.holders))
		for h, hd := range t.holders {
			saved[h] = hd.tenant
		}
		t.Saved(saved)
	}
}

// settle decides h's holder, and reports whether the holder changed.
func (t *Routes) settle(h string) bool {
	rs := t.byHost[h]
	hd, held := t.holders[h]
	if held {
		if slices.ContainsFunc(rs, func(r Route) bool { return r.Tenant == hd.tenant }) {
			hd.idle = time.Time{}
			t.holders[h] = hd
			return false
		}
		if hd.idle.IsZero() {
			hd.idle = t.now()
			t.holders[h] = hd
		}
		if t.now().Sub(hd.idle) < HolderGrace {
			return false
		}
	}
	if len(rs) == 0 {
		delete(t.holders, h)
		return held
	}
	best := slices.MinFunc(rs, func(a, b Route) int {
		if a.Rank != b.Rank {
			return cmp.Compare(a.Rank, b.Rank)
		}
		return strings.Compare(a.Tenant, b.Tenant)
	})
	t.holders[h] = holder{tenant: best.Tenant}
	return !held || hd.tenant != best.Tenant
}

// Get is the route of host's holder, if it claims host.
func (t *Routes) Get(host string) (Route, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	host = strings.ToLower(host)
	if hd, ok := t.holders[host]; ok && !hd.idle.IsZero() && t.now().Sub(hd.idle) >= HolderGrace {
		// The grace of a holder that let go has passed.
		t.settleAll()
	}
	hd, ok := t.holders[host]
	if !ok {
		return Route{}, false
	}
	for _, r := range t.byHost[host] {
		if r.Tenant == hd.tenant {
			return r, true
		}
	}
	return Route{}, false
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
}

// target is what an upstream request is dialled to: it rides in the
// request's context to the transport's dial.
type target struct {
	backend Backend
	ep      Endpoint
}

type targetKey struct{}

// Bounds of the upstream connections (R21): per pod, in all, and what is
// read of a pod's answer's headers.
const (
	maxConnsPerPod     = 32
	maxIdleConns       = 256
	maxUpstreamHeaders = 64 << 10
)

func (s *Server) init() {
	s.once.Do(func() {
		s.transport = &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				t, ok := ctx.Value(targetKey{}).(target)
				if !ok {
					return nil, errors.New("no upstream")
				}
				return t.backend.DialPod(ctx, t.ep.Namespace, t.ep.Pod, t.ep.Port)
			},
			MaxIdleConnsPerHost:    8,
			MaxConnsPerHost:        maxConnsPerPod,
			MaxIdleConns:           maxIdleConns,
			IdleConnTimeout:        90 * time.Second,
			ResponseHeaderTimeout:  60 * time.Second,
			MaxResponseHeaderBytes: maxUpstreamHeaders,
			// The pod's answer goes as it came: no gzip added and undone
			// in the agent.
			DisableCompression: true,
		}
	})
}

// refuse answers with the gateway's own status and reason; the body says
// the reason only (the tenant's namespaces and Services are not the
// public's business, R17).
func refuse(w http.ResponseWriter, code int, reason string) {
	w.Header().Set(ReasonHeader, reason)
	http.Error(w, reason, code)
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
		refuse(w, http.StatusMisdirectedRequest, "Misdirected")
		return
	}
	route, ok := s.Routes.Get(host)
	if !ok {
		refuse(w, http.StatusNotFound, ReasonNoRoute)
		return
	}
	if r.URL.Path == "/.well-known/atproto-did" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(route.DID))
		return
	}
	backend, err := s.Tenant(r.Context(), route.Tenant)
	if err != nil {
		refuse(w, http.StatusServiceUnavailable, ReasonTenantUnreachable)
		return
	}
	eps, err := backend.Endpoints(r.Context(), route.Namespace, route.Service, route.Port)
	var none *NoEndpoints
	switch {
	case errors.As(err, &none):
		refuse(w, http.StatusServiceUnavailable, none.Reason)
		return
	case err != nil:
		refuse(w, http.StatusServiceUnavailable, ReasonTenantUnreachable)
		return
	}
	ep := eps[rand.IntN(len(eps))] //nolint:gosec // load spreading, not security
	// One synthetic upstream host per tenant and endpoint, so that the
	// transport pools connections per pod.
	up := fmt.Sprintf("%s.%s.%s.%d.upstream", hexName(route.Tenant), ep.Pod, ep.Namespace, ep.Port)
	tg := target{backend: backend, ep: ep}
	rp := &httputil.ReverseProxy{
		Transport: s.transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out = pr.Out.WithContext(context.WithValue(pr.Out.Context(), targetKey{}, tg))
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
			if sw, ok := w.(*stripping); ok {
				w = sw.ResponseWriter // the gateway's own answer keeps its reason
			}
			refuse(w, http.StatusBadGateway, ReasonUpstreamFailed)
		},
	}
	sw := &stripping{ResponseWriter: w}
	rp.ServeHTTP(sw, r)
	// Trailers are written after the handler returns.
	sw.strip()
}

// stripping removes the gateway's reason header from everything a pod's
// answer carries: 1xx answers and trailers too (ModifyResponse sees only
// the final header).
type stripping struct{ http.ResponseWriter }

func (s *stripping) strip() {
	h := s.Header()
	h.Del(ReasonHeader)
	h.Del(http.TrailerPrefix + ReasonHeader)
	if t := h.Values("Trailer"); len(t) > 0 {
		h.Del("Trailer")
		for _, v := range t {
			for _, name := range strings.Split(v, ",") {
				if name = strings.TrimSpace(name); name != "" && !strings.EqualFold(name, ReasonHeader) {
					h.Add("Trailer", name)
				}
			}
		}
	}
}

func (s *stripping) WriteHeader(code int) {
	s.strip()
	s.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection (flush,
// hijack for upgrades).
func (s *stripping) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// hexName makes a tenant name fit a DNS label of the synthetic host.
func hexName(s string) string { return fmt.Sprintf("%x", s) }

// Close closes the idle upstream connections.
func (s *Server) Close() {
	s.init()
	s.transport.CloseIdleConnections()
}
