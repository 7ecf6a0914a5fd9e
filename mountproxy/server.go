package mountproxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/knotless-dev/knotless/internal/promutil"
)

// Options configure a Server.
type Options struct {
	Files Files
	// AllowedNames are the client certificate common names that may assert
	// an identity (kcp-front-proxy's proxy client certificate, the
	// provider's probe). Empty allows any certificate the requestheader CA
	// issued.
	AllowedNames []string
	// PathPrefix precedes /<logical cluster>/<name>/ (default "/tenants/").
	PathPrefix string
	Registry   *Registry
	// ReloadEvery is how often the TLS files are checked for changes
	// (default 2s).
	ReloadEvery time.Duration
	// Headers name the identity headers (default X-Remote-User,
	// X-Remote-Group, X-Remote-Extra-).
	Headers Headers
	// Registerer, when set, gets the shim's metrics.
	Registerer prometheus.Registerer
}

// OutcomeForwarded labels requests sent on to a tenant in
// knotless_mountproxy_requests_total; the other outcomes are reasons.
const OutcomeForwarded = "Forwarded"

// Headers are the names of the identity headers kcp-front-proxy sets
// (its mapping's user_header, group_header and extra_header_prefix).
//
// kcp v0.28.1's front proxy sets the user header but appends groups and
// extras to whatever the caller sent under the same names, so with the
// standard names a caller can add groups and extras to their own identity.
// Names that only the mapping file and the shim know close that: the shim
// reads only those, and removes every X-Remote-* header and every header
// under the configured names before forwarding.
type Headers struct {
	User, Group, ExtraPrefix string
}

func (h Headers) withDefaults() Headers {
	if h.User == "" {
		h.User = "X-Remote-User"
	}
	if h.Group == "" {
		h.Group = "X-Remote-Group"
	}
	if h.ExtraPrefix == "" {
		h.ExtraPrefix = "X-Remote-Extra-"
	}
	h.User, h.Group, h.ExtraPrefix = http.CanonicalHeaderKey(h.User), http.CanonicalHeaderKey(h.Group), http.CanonicalHeaderKey(h.ExtraPrefix)
	return h
}

// identityHeader reports whether a canonical header name carries an
// identity (standard or configured names).
func (h Headers) identityHeader(c string) bool {
	return strings.HasPrefix(c, "X-Remote-") || c == h.User || c == h.Group || strings.HasPrefix(c, h.ExtraPrefix)
}

// Server is the shim.
type Server struct {
	opts   Options
	certs  *reloader
	prefix string
	proxy  *httputil.ReverseProxy
	// requests counts requests by outcome: Forwarded or the reason the
	// shim answered with itself.
	requests *prometheus.CounterVec
	// verified caches client certificates that verified against a pool
	// (key: pool and certificate bytes), so a kept-alive connection does
	// not pay a signature check per request.
	verified sync.Map
}

type verifiedKey struct {
	pool *x509.CertPool
	raw  string
}

// ReasonHeader carries the shim's reason on every response it answers
// itself (never on a tenant's own responses), so a prober tells the
// shim's refusals and the tenant's answers apart without reading status
// codes.
const ReasonHeader = "X-Knotless-Mount-Reason"

// Reasons the shim answers with.
const (
	ReasonNoClientCertificate = "NoClientCertificate"
	ReasonUntrustedClient     = "UntrustedClientCertificate"
	ReasonNameNotAllowed      = "ClientNameNotAllowed"
	ReasonNoIdentity          = "NoIdentity"
	ReasonUnknownPath         = "UnknownPath"
	ReasonUnknownTenant       = "UnknownTenant"
	ReasonRevoked             = "Revoked"
	ReasonTenantUnreachable   = "TenantUnreachable"
	ReasonTenantCertificate   = "TenantCertificateInvalid"
	ReasonTenantError         = "TenantError"
)

// New returns a server; it fails if the TLS files cannot be loaded.
func New(o Options) (*Server, error) {
	if o.Registry == nil {
		return nil, errors.New("mountproxy: a registry is required")
	}
	if o.ReloadEvery <= 0 {
		o.ReloadEvery = 2 * time.Second
	}
	prefix := o.PathPrefix
	if prefix == "" {
		prefix = "/tenants/"
	}
	if !strings.HasPrefix(prefix, "/") || !strings.HasSuffix(prefix, "/") {
		return nil, fmt.Errorf("mountproxy: path prefix %q must start and end with /", prefix)
	}
	certs, err := newReloader(o.Files, o.ReloadEvery)
	if err != nil {
		return nil, fmt.Errorf("mountproxy: %w", err)
	}
	o.Headers = o.Headers.withDefaults()
	s := &Server{opts: o, certs: certs, prefix: prefix}
	s.proxy = s.newProxy()
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "knotless_mountproxy_requests_total",
		Help: "Requests by outcome: Forwarded (sent to the tenant), or the reason the shim answered with (refusals, forwarding errors).",
	}, []string{"outcome"})
	if reg := o.Registerer; reg != nil {
		var err error
		s.requests = promutil.Register(reg, s.requests, &err)
		promutil.Register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "knotless_mountproxy_tenants", Help: "Tenants registered (usable TenantClusters).",
		}, func() float64 { return float64(o.Registry.Len()) }), &err)
		if err != nil {
			return nil, fmt.Errorf("mountproxy metrics: %w", err)
		}
	}
	return s, nil
}

// TLSConfig is the listener's TLS configuration (hot-reloaded material).
func (s *Server) TLSConfig() *tls.Config { return s.certs.TLSConfig() }

// Serve serves HTTPS on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	// HTTP/1.1 only: exec, attach and port-forward upgrade the connection,
	// which HTTP/2 cannot; kcp-front-proxy would otherwise negotiate h2.
	tlsConfig := s.TLSConfig()
	tlsConfig.NextProtos = []string{"http/1.1"}
	srv := &http.Server{Handler: s, TLSConfig: tlsConfig, ReadHeaderTimeout: 30 * time.Second,
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
		<-errc
		return nil
	}
}

// identity is the caller kcp-front-proxy vouches for.
type identity struct {
	user   string
	groups []string
	extra  map[string][]string
}

// authenticate verifies the client certificate, then reads the identity
// headers. It returns a reason and an HTTP status on failure.
func (s *Server) authenticate(r *http.Request) (*identity, int, string, string) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return nil, http.StatusUnauthorized, ReasonNoClientCertificate, "a client certificate issued by the requestheader CA is required"
	}
	_, pool := s.certs.current()
	leaf := r.TLS.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range r.TLS.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	vk := verifiedKey{pool: pool, raw: string(leaf.Raw)}
	if until, ok := s.verified.Load(vk); !ok || time.Now().After(until.(time.Time)) {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			return nil, http.StatusUnauthorized, ReasonUntrustedClient, "the client certificate is not issued by the requestheader CA: " + err.Error()
		}
		// Checked again after a minute (and whenever the CA file changes,
		// which makes a new pool).
		until := time.Now().Add(time.Minute)
		if leaf.NotAfter.Before(until) {
			until = leaf.NotAfter
		}
		s.verified.Store(vk, until)
	}
	if len(s.opts.AllowedNames) > 0 && !slices.Contains(s.opts.AllowedNames, leaf.Subject.CommonName) {
		return nil, http.StatusForbidden, ReasonNameNotAllowed, fmt.Sprintf("client certificate %q may not assert identities", leaf.Subject.CommonName)
	}
	hn := s.opts.Headers
	id := &identity{user: r.Header.Get(hn.User), groups: r.Header.Values(hn.Group), extra: map[string][]string{}}
	if users := r.Header.Values(hn.User); len(users) != 1 || id.user == "" {
		return nil, http.StatusUnauthorized, ReasonNoIdentity, "want exactly one " + hn.User + " header"
	}
	for name, values := range r.Header {
		if k, ok := strings.CutPrefix(http.CanonicalHeaderKey(name), hn.ExtraPrefix); ok {
			if dec, err := url.PathUnescape(k); err == nil {
				k = dec
			}
			id.extra[strings.ToLower(k)] = values
		}
	}
	return id, 0, "", ""
}

// ServeHTTP authenticates, routes and forwards one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, code, reason, msg := s.authenticate(r)
	if id == nil {
		s.refuse(w, code, reason, msg)
		return
	}
	lc, name, rest, ok := ParsePath(s.prefix, r.URL.Path)
	if !ok {
		s.refuse(w, http.StatusNotFound, ReasonUnknownPath, "the path does not name a tenant: want "+s.prefix+"<logical cluster>/<name>/...")
		return
	}
	e, ok, revoked := s.opts.Registry.find(lc, name)
	if revoked {
		s.refuse(w, http.StatusForbidden, ReasonRevoked, fmt.Sprintf("tenant %s in workspace %s is revoked", name, lc))
		return
	}
	if !ok {
		s.refuse(w, http.StatusNotFound, ReasonUnknownTenant, fmt.Sprintf("no tenant %s in workspace %s (not registered, deleted or revoked)", name, lc))
		return
	}
	// The tenant's removal or replacement ends this request at once.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(e.ctx, cancel)
	defer stop()
	ctx = context.WithValue(ctx, forwardKey{}, &forward{entry: e, id: id, rest: rest})
	s.requests.WithLabelValues(OutcomeForwarded).Inc()
	s.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// forward is what the shared reverse proxy needs to know about one
// request; it travels in the request's context.
type forward struct {
	entry *entry
	id    *identity
	rest  string
}

type forwardKey struct{}

func forwardOf(r *http.Request) *forward { return r.Context().Value(forwardKey{}).(*forward) }

// newProxy returns the reverse proxy every request goes through: it sends
// a request to its tenant's transport with the tenant's URL, credential
// and the caller's impersonation.
func (s *Server) newProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Transport: roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			return forwardOf(r).entry.transport.RoundTrip(r)
		}),
		// Streaming responses (watches, logs -f: no Content-Length) are
		// flushed at every write by ReverseProxy itself; others are not
		// flushed early, which saves a write per response.
		FlushInterval: 0,
		BufferPool:    &bufferPool{pool: sync.Pool{New: func() any { return make([]byte, 32<<10) }}},
		Rewrite: func(pr *httputil.ProxyRequest) {
			f := forwardOf(pr.In)
			target := *f.entry.tenant.URL
			target.Path = strings.TrimSuffix(target.Path, "/") + f.rest
			target.RawPath = ""
			target.RawQuery = pr.In.URL.RawQuery
			pr.Out.URL = &target
			pr.Out.Host = ""
			rewriteHeaders(pr.Out.Header, s.opts.Headers, f.id, f.entry.tenant.Credential)
		},
		// The reason header is the shim's alone: a tenant cannot answer
		// with one.
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del(ReasonHeader)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t := forwardOf(r).entry.tenant
			reason, code := ClassifyForwardError(err)
			s.refuse(w, code, reason, fmt.Sprintf("forwarding to tenant %s/%s: %v", t.LogicalCluster, t.Name, err))
		},
	}
}

// bufferPool reuses the 32 KiB copy buffers of response bodies.
type bufferPool struct{ pool sync.Pool }

func (b *bufferPool) Get() []byte  { return b.pool.Get().([]byte) }
func (b *bufferPool) Put(v []byte) { b.pool.Put(v) } //nolint:staticcheck // a slice header per Put is cheaper than 32 KiB per request

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// rewriteHeaders removes every credential and identity header the caller
// sent and sets the tenant credential and the impersonation headers.
func rewriteHeaders(h http.Header, names Headers, id *identity, cred Credential) {
	for name := range h {
		c := http.CanonicalHeaderKey(name)
		if c == "Authorization" || c == "Proxy-Authorization" || strings.HasPrefix(c, "Impersonate-") || names.identityHeader(c) {
			delete(h, name)
		}
	}
	if cred.Token != "" {
		h.Set("Authorization", "Bearer "+cred.Token)
	}
	h.Set("Impersonate-User", id.user)
	for _, g := range id.groups {
		h.Add("Impersonate-Group", g)
	}
	for k, vs := range id.extra {
		for _, v := range vs {
			h.Add("Impersonate-Extra-"+url.PathEscape(k), v)
		}
	}
}

// ClassifyForwardError names why a tenant could not be reached: its
// certificate did not verify against its CA, or the connection failed.
func ClassifyForwardError(err error) (reason string, status int) {
	var unknownAuth x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	switch {
	case errors.As(err, &unknownAuth), errors.As(err, &hostname), errors.As(err, &invalid), errors.As(err, &verify):
		return ReasonTenantCertificate, http.StatusBadGateway
	case errors.Is(err, context.Canceled):
		return ReasonUnknownTenant, http.StatusServiceUnavailable
	}
	var netErr net.Error
	var opErr *net.OpError
	if errors.As(err, &opErr) || errors.As(err, &netErr) {
		return ReasonTenantUnreachable, http.StatusBadGateway
	}
	return ReasonTenantError, http.StatusBadGateway
}

// refuse counts the reason and answers with a Kubernetes Status body and
// the reason header.
func (s *Server) refuse(w http.ResponseWriter, code int, reason, msg string) {
	s.requests.WithLabelValues(reason).Inc()
	w.Header().Set(ReasonHeader, reason)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"kind": "Status", "apiVersion": "v1", "status": "Failure",
		"reason": reason, "message": msg, "code": code,
	})
}
