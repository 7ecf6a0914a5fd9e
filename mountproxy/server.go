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
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/knotless-dev/knotless/internal/mount"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/promutil"
	"github.com/knotless-dev/knotless/internal/tlsfiles"
)

// Options configure a Server.
type Options struct {
	Files Files
	// AllowedNames are the client certificate common names that may assert
	// an identity (kcp-front-proxy's proxy client certificate, the
	// provider's probe). Empty allows any certificate the requestheader CA
	// issued.
	AllowedNames []string
	// ProbeNames are the client certificate common names of the provider's
	// probe: they may assert only ProbeUser, only for GET .../version, and
	// are not authorized against kcp (the probe user is no kcp user).
	ProbeNames []string
	// PathPrefix precedes /<logical cluster>/<name>/ (default "/tenants/").
	PathPrefix string
	Registry   *Registry
	// Authorizer decides whether a caller may enter the workspace of the
	// tenant (required; NewSARAuthorizer asks kcp).
	Authorizer Authorizer
	// ReloadEvery is how often the TLS files are checked for changes
	// (default 2s).
	ReloadEvery time.Duration
	// Headers name the identity headers; required, see Headers.Validate.
	Headers Headers
	// Registerer, when set, gets the shim's metrics.
	Registerer prometheus.Registerer
	// Log gets forwarding errors and authorization failures (default:
	// discarded).
	Log logr.Logger
	// ReadHeaderTimeout and IdleTimeout close connections that send no
	// request headers, or no next request, in time (default 10 s and 90 s),
	// so refused callers cannot hold connections open.
	ReadHeaderTimeout, IdleTimeout time.Duration
}

// HopHeader marks a request the shim forwarded; a request that arrives
// with it has passed the shim before (a tenant URL that leads back to kcp
// or the shim) and is refused, so no request passes the shim twice (R18).
const HopHeader = "X-Knotless-Mount-Hop"

// OutcomeForwarded labels requests sent on to a tenant in
// knotless_mountproxy_requests_total; the other outcomes are reasons.
const OutcomeForwarded = "Forwarded"

// Headers are the names of the identity headers kcp-front-proxy sets
// (its mapping's user_header, group_header and extra_header_prefix).
//
// kcp v0.28.1's front proxy sets the user header but appends groups and
// extras to whatever the caller sent under the same names, and passes a
// request without a client certificate on with the caller's headers
// untouched. The names are therefore a secret shared by the mapping and
// the shim (R17): the shim reads only those, never names them in an
// answer, refuses standard names, and removes every X-Remote-* header and
// every header under the configured names before forwarding.
type Headers struct {
	User, Group, ExtraPrefix string
}

// minHeaderName is the shortest identity header name accepted: enough for
// a prefix and at least 8 random bytes in hex.
const minHeaderName = 20

// Validate refuses missing, standard, short or overlapping names. Its
// errors name the flag's value, which only the operator sees.
func (h Headers) Validate() error {
	for _, n := range []struct{ what, name string }{{"user header", h.User}, {"group header", h.Group}, {"extra header prefix", h.ExtraPrefix}} {
		if err := ValidateHeaderName(n.what, n.name); err != nil {
			return err
		}
	}
	u, g, e := http.CanonicalHeaderKey(h.User), http.CanonicalHeaderKey(h.Group), http.CanonicalHeaderKey(h.ExtraPrefix)
	if u == g || strings.HasPrefix(u, e) || strings.HasPrefix(g, e) {
		return errors.New("the user header, group header and extra header prefix must be distinct and neither header may start with the extra prefix")
	}
	return nil
}

// ValidateHeaderName refuses a missing, standard or short identity header
// name, one with characters other than letters, digits and '-', or one
// without 16 hex digits in a row (64 random bits).
func ValidateHeaderName(what, n string) error {
	switch {
	case n == "":
		return fmt.Errorf("the %s is required: choose a name callers cannot guess, e.g. X-Knotless-<16 random hex digits>-%s (docs/mountproxy.md)", what, exampleSuffix(what))
	case standardHeader(http.CanonicalHeaderKey(n)):
		return fmt.Errorf("the %s %q is a standard name (X-Remote-*, Impersonate-*, Authorization): callers could send it themselves", what, n)
	case len(n) < minHeaderName:
		return fmt.Errorf("the %s %q is shorter than %d characters: include at least 16 random hex digits", what, n, minHeaderName)
	case strings.ContainsFunc(n, func(r rune) bool {
		return !(r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}):
		return fmt.Errorf("the %s %q may contain only letters, digits and '-'", what, n)
	case !hasRandomPart(n):
		return fmt.Errorf("the %s %q has no run of 16 hex digits: include at least 64 random bits, e.g. X-Knotless-$(openssl rand -hex 8)-%s", what, n, exampleSuffix(what))
	}
	return nil
}

// exampleSuffix ends the example name of an error about what.
func exampleSuffix(what string) string {
	switch {
	case strings.Contains(what, "group"):
		return "Group"
	case strings.Contains(what, "extra"):
		return "Extra-"
	}
	return "User"
}

// hasRandomPart reports whether n holds 16 hex digits in a row.
func hasRandomPart(n string) bool {
	run := 0
	for _, r := range n {
		if r >= '0' && r <= '9' || r >= 'a' && r <= 'f' || r >= 'A' && r <= 'F' {
			if run++; run == 16 {
				return true
			}
		} else {
			run = 0
		}
	}
	return false
}

// standardHeader reports whether a canonical name is one a caller or a
// proxy may set for its own reasons.
func standardHeader(c string) bool {
	return strings.HasPrefix(c, "X-Remote-") || strings.HasPrefix(c, "Impersonate-") || c == "Authorization" || c == "Proxy-Authorization" || c == HopHeader || c == ReasonHeader
}

func (h Headers) canonical() Headers {
	return Headers{http.CanonicalHeaderKey(h.User), http.CanonicalHeaderKey(h.Group), http.CanonicalHeaderKey(h.ExtraPrefix)}
}

// identityHeader reports whether a canonical header name carries an
// identity (standard or configured names).
func (h Headers) identityHeader(c string) bool {
	return strings.HasPrefix(c, "X-Remote-") || c == h.User || c == h.Group || strings.HasPrefix(c, h.ExtraPrefix)
}

// Server is the shim.
type Server struct {
	opts   Options
	log    logr.Logger
	certs  *tlsfiles.Reloader
	prefix string
	proxy  *httputil.ReverseProxy
	// requests counts requests by outcome: Forwarded or the reason the
	// shim answered with itself.
	requests *prometheus.CounterVec
	// latency observes each request once, by the same outcome: until
	// the tenant's response headers for Forwarded (a watch or an exec
	// stream counts until it starts, not while it runs), until the shim's
	// own answer otherwise.
	latency *prometheus.HistogramVec
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
	// ReasonNotAuthorized: kcp does not let the caller enter the
	// workspace that holds the tenant.
	ReasonNotAuthorized = "NotAuthorized"
	// ReasonAuthorizationUnavailable: kcp could not be asked.
	ReasonAuthorizationUnavailable = "AuthorizationUnavailable"
	// ReasonServiceAccount: kcp ServiceAccounts are not forwarded (their
	// names would be the tenant's own ServiceAccounts').
	ReasonServiceAccount = "ServiceAccountNotAllowed"
	// ReasonSystemUser: a system: user is never asserted to a tenant.
	ReasonSystemUser = "SystemUserNotAllowed"
	// ReasonDIDUser: a user named like an ATProto identity (did:...) is
	// never asserted to a tenant, where a DID is an identity of its own
	// with its own rights (reached with its own token).
	ReasonDIDUser = "DIDUserNotAllowed"
	// ReasonPrivilegedGroup: system:masters is never asserted to a tenant.
	ReasonPrivilegedGroup = "PrivilegedGroupNotAllowed"
	// ReasonNotTenantAdmin: the mounted workspace forwards only some kcp
	// users (a market contract's: spec.tenantAdmins.users), and the
	// caller is none of them.
	ReasonNotTenantAdmin = "NotTenantAdmin"
	// ReasonProbeNotAllowed: a probe certificate asked for more than a
	// probe.
	ReasonProbeNotAllowed = "ProbeNotAllowed"
	// ReasonLoop: the request passed the shim before.
	ReasonLoop = "ForwardingLoop"
	// ReasonTenantRedirect: the tenant answered with a redirect, which is
	// never passed to kcp's clients nor followed.
	ReasonTenantRedirect = "TenantRedirect"
	// ReasonAddressNotAllowed: the tenant's address is refused by the
	// operator's address policy.
	ReasonAddressNotAllowed = "AddressNotAllowed"
)

// errTenantRedirect is a tenant's 3xx with a Location.
var errTenantRedirect = errors.New("redirect")

// New returns a server; it fails if the TLS files cannot be loaded.
func New(o Options) (*Server, error) {
	if o.Registry == nil {
		return nil, errors.New("mountproxy: a registry is required")
	}
	if o.ReloadEvery <= 0 {
		o.ReloadEvery = 2 * time.Second
	}
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = 10 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 90 * time.Second
	}
	prefix := o.PathPrefix
	if prefix == "" {
		prefix = "/tenants/"
	}
	if !strings.HasPrefix(prefix, "/") || !strings.HasSuffix(prefix, "/") {
		return nil, fmt.Errorf("mountproxy: path prefix %q must start and end with /", prefix)
	}
	if o.Authorizer == nil {
		return nil, errors.New("mountproxy: an authorizer is required")
	}
	if err := o.Headers.Validate(); err != nil {
		return nil, fmt.Errorf("mountproxy: %w", err)
	}
	certs, err := newReloader(o.Files, o.ReloadEvery)
	if err != nil {
		return nil, fmt.Errorf("mountproxy: %w", err)
	}
	o.Headers = o.Headers.canonical()
	s := &Server{opts: o, certs: certs, prefix: prefix, log: o.Log}
	s.proxy = s.newProxy()
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "knotless_mountproxy_requests_total",
		Help: "Requests by outcome, each counted once: Forwarded (the tenant answered), or the reason the shim answered with (refusals, forwarding errors).",
	}, []string{"outcome"})
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "knotless_mountproxy_request_duration_seconds",
		Help:    "Seconds from a request's arrival to the tenant's response headers (outcome Forwarded) or to the shim's own answer (the reason), by the outcome of knotless_mountproxy_requests_total.",
		Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"outcome"})
	if reg := o.Registerer; reg != nil {
		var err error
		s.requests = promutil.Register(reg, s.requests, &err)
		s.latency = promutil.Register(reg, s.latency, &err)
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
func (s *Server) TLSConfig() *tls.Config { return serverTLS(s.certs) }

// Serve serves HTTPS on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	// HTTP/1.1 only: exec, attach and port-forward upgrade the connection,
	// which HTTP/2 cannot; kcp-front-proxy would otherwise negotiate h2.
	tlsConfig := s.TLSConfig()
	tlsConfig.NextProtos = []string{"http/1.1"}
	srv := &http.Server{Handler: s, TLSConfig: tlsConfig, ReadHeaderTimeout: s.opts.ReadHeaderTimeout, IdleTimeout: s.opts.IdleTimeout,
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
		<-errc //nolint:errcheck // waits for ServeTLS to return; it returns http.ErrServerClosed after Shutdown
		return nil
	}
}

// authenticate verifies the client certificate, then reads the identity
// headers. It returns a reason and an HTTP status on failure, and whether
// the certificate is a probe's. Messages never name a configured header,
// the CA or other configuration (R17).
func (s *Server) authenticate(r *http.Request) (c *Caller, probe bool, code int, reason, msg string) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return nil, false, http.StatusUnauthorized, ReasonNoClientCertificate, "the mount proxy accepts requests from kcp-front-proxy only"
	}
	_, pool := s.certs.Current()
	leaf := r.TLS.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range r.TLS.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	vk := verifiedKey{pool: pool, raw: string(leaf.Raw)}
	if until, ok := s.verified.Load(vk); !ok || time.Now().After(until.(time.Time)) {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			return nil, false, http.StatusUnauthorized, ReasonUntrustedClient, "the client certificate is not trusted by the mount proxy"
		}
		// Checked again after a minute (and whenever the CA file changes,
		// which makes a new pool).
		until := time.Now().Add(time.Minute)
		if leaf.NotAfter.Before(until) {
			until = leaf.NotAfter
		}
		s.verified.Store(vk, until)
	}
	cn := leaf.Subject.CommonName
	if len(s.opts.AllowedNames) > 0 && !slices.Contains(s.opts.AllowedNames, cn) {
		return nil, false, http.StatusForbidden, ReasonNameNotAllowed, "this client certificate may not assert identities"
	}
	hn := s.opts.Headers
	c = &Caller{User: r.Header.Get(hn.User), Groups: r.Header.Values(hn.Group), Extra: map[string][]string{}}
	if users := r.Header.Values(hn.User); len(users) != 1 || c.User == "" {
		return nil, false, http.StatusUnauthorized, ReasonNoIdentity, "the request carries no identity asserted by kcp-front-proxy"
	}
	for name, values := range r.Header {
		if k, ok := strings.CutPrefix(http.CanonicalHeaderKey(name), hn.ExtraPrefix); ok {
			if dec, err := url.PathUnescape(k); err == nil {
				k = dec
			}
			c.Extra[strings.ToLower(k)] = values
		}
	}
	return c, slices.Contains(s.opts.ProbeNames, cn), 0, "", ""
}

// authorize decides whether an authenticated caller may reach the tenant
// at rest in logical cluster lc: a probe only with its own identity and
// only for GET /version; anyone else only if kcp lets them enter lc, and
// never as a ServiceAccount or in system:masters.
func (s *Server) authorize(r *http.Request, c *Caller, probe bool, lc, rest string) (code int, reason, msg string) {
	switch {
	case probe:
		if c.User != mount.ProbeUser || r.Method != http.MethodGet || rest != "/version" {
			return http.StatusForbidden, ReasonProbeNotAllowed, "a probe certificate may only read /version as the probe user"
		}
		// The probe is impersonated as itself and nothing more.
		c.Groups, c.Extra = []string{"system:authenticated"}, nil
		return 0, "", ""
	case strings.HasPrefix(c.User, "system:serviceaccount:"):
		// A kcp ServiceAccount ns/x would become the tenant's own
		// ServiceAccount ns/x when impersonated (docs/mountproxy.md).
		return http.StatusForbidden, ReasonServiceAccount, "kcp ServiceAccounts cannot use mounted workspaces; use a user identity"
	case strings.HasPrefix(c.User, "system:"):
		// system: users (nodes, controllers) are the tenant's own.
		return http.StatusForbidden, ReasonSystemUser, "system users are not forwarded to tenants; use a user identity"
	case strings.HasPrefix(c.User, "did:"):
		// On a tenant the kcp user "did:plc:x" would have the rights
		// of the DID did:plc:x (its admin, or a tenantAccess role).
		return http.StatusForbidden, ReasonDIDUser, "users named like ATProto identities are not forwarded to tenants; a DID reaches a tenant with its own token"
	case slices.Contains(c.Groups, "system:masters"):
		return http.StatusForbidden, ReasonPrivilegedGroup, "members of system:masters are not forwarded to tenants"
	}
	ok, err := s.opts.Authorizer.Authorize(r.Context(), lc, c)
	// kcp decided on the whole identity; the tenant gets no system:
	// group but system:authenticated (system:nodes, system:bootstrappers,
	// ... mean the tenant's own machinery there).
	c.Groups = slices.DeleteFunc(slices.Clone(c.Groups), func(g string) bool {
		return strings.HasPrefix(g, "system:") && g != "system:authenticated"
	})
	switch {
	case err != nil:
		s.log.Error(err, "authorizing a caller", "logicalCluster", lc, "user", c.User)
		return http.StatusServiceUnavailable, ReasonAuthorizationUnavailable, "kcp could not be asked whether the caller may enter this workspace; try again"
	case !ok:
		return http.StatusForbidden, ReasonNotAuthorized, "the caller may not enter this workspace"
	}
	return 0, "", ""
}

// ServeHTTP authenticates, authorizes, routes and forwards one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if r.Header.Get(HopHeader) != "" {
		s.refuse(w, start, http.StatusLoopDetected, ReasonLoop, "the request has passed the mount proxy before")
		return
	}
	c, probe, code, reason, msg := s.authenticate(r)
	if c == nil {
		s.refuse(w, start, code, reason, msg)
		return
	}
	lc, name, rest, ok := ParsePath(s.prefix, r.URL.Path)
	if !ok {
		s.refuse(w, start, http.StatusNotFound, ReasonUnknownPath, "the path does not name a mounted workspace")
		return
	}
	if code, reason, msg := s.authorize(r, c, probe, lc, rest); code != 0 {
		s.refuse(w, start, code, reason, msg)
		return
	}
	e, ok, revoked := s.opts.Registry.find(lc, name)
	if revoked {
		s.refuse(w, start, http.StatusForbidden, ReasonRevoked, "the mounted workspace's tenant is revoked")
		return
	}
	if !ok {
		s.refuse(w, start, http.StatusNotFound, ReasonUnknownTenant, "the mounted workspace has no tenant (not registered, deleted or revoked)")
		return
	}
	if allow := e.tenant.Impersonate; allow != nil {
		if c = restrict(c, allow, probe); c == nil {
			s.refuse(w, start, http.StatusForbidden, ReasonNotTenantAdmin, "the caller is not one of the users this mounted workspace forwards to its tenant")
			return
		}
	}
	// The tenant's removal or replacement ends this request at once.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(e.ctx, cancel)
	defer stop()
	ctx = context.WithValue(ctx, forwardKey{}, &forward{entry: e, caller: c, rest: rest, probe: probe, start: start})
	s.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// restrict returns the caller as a tenant that lets its mount assert
// only the principals allow sees them: a named user, with only the named
// groups of theirs and no extra; the probe as its own user only. It
// returns nil for anyone else: a tenant lets an impersonator assert a
// user only by name, so a member of a named group who is not a named
// user could not be asserted there either.
func restrict(c *Caller, allow *mount.Principals, probe bool) *Caller {
	if probe {
		return &Caller{User: c.User}
	}
	if !slices.Contains(allow.Users, c.User) {
		return nil
	}
	return &Caller{User: c.User, Groups: slices.DeleteFunc(slices.Clone(c.Groups), func(g string) bool { return !slices.Contains(allow.Groups, g) })}
}

// forward is what the shared reverse proxy needs to know about one
// request; it travels in the request's context.
type forward struct {
	entry  *entry
	caller *Caller
	rest   string
	// probe: forwarding errors of the provider's probe are logged at info level.
	probe bool
	// start is when the shim received the request.
	start time.Time
	// counted: the request's outcome was counted (once: a tenant's
	// answer to an upgrade can still fail the forward after it).
	counted atomic.Bool
	// private: a connection to a loopback, private or shared address was
	// attempted for the request (see hidePrivate).
	private atomic.Bool
}

// traced returns r with a trace that marks f private when a connection to
// a private address is attempted.
func (f *forward) traced(r *http.Request) *http.Request {
	return r.WithContext(netpolicy.TracePrivate(r.Context(), &f.private))
}

// hidePrivate is the reason a caller reads for a forwarding error of a
// tenant at a private address (reachable only because the operator
// allowed its range) a refused connection, no answer, a certificate that
// does not verify and a handshake that fails are one reason,
// TenantUnreachable, so that TenantClusters cannot scan the operator's
// networks; the log keeps the real one (R17).
func hidePrivate(reason string) string {
	if reason == ReasonTenantCertificate || reason == ReasonTenantError {
		return ReasonTenantUnreachable
	}
	return reason
}

type forwardKey struct{}

func forwardOf(r *http.Request) *forward { return r.Context().Value(forwardKey{}).(*forward) }

// newProxy returns the reverse proxy every request goes through: it sends
// a request to its tenant's transport with the tenant's URL, credential
// and the caller's impersonation.
func (s *Server) newProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Transport: roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			f := forwardOf(r)
			return f.entry.transport.RoundTrip(f.traced(r))
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
			rewriteHeaders(pr.Out.Header, s.opts.Headers, f.caller, f.entry.tenant.Credential)
		},
		// The reason header is the shim's alone: a tenant cannot answer
		// with one. A redirect is never passed on: client-go would follow
		// it to another workspace with the caller's credential and body
		// (the class of CVE-2022-3172).
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del(ReasonHeader)
			if resp.StatusCode >= 300 && resp.StatusCode < 400 && resp.Header.Get("Location") != "" {
				return fmt.Errorf("%w (HTTP %d)", errTenantRedirect, resp.StatusCode)
			}
			if f := forwardOf(resp.Request); f.counted.CompareAndSwap(false, true) {
				s.count(f.start, OutcomeForwarded)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			f := forwardOf(r)
			reason, code := ClassifyForwardError(err)
			// The detail (addresses, certificate names) is the operator's:
			// it goes to the log, never to a caller or a status (R17).
			// Probe failures are logged at info level.
			log := s.log.V(1)
			if f.probe {
				log = s.log
			}
			log.Info("forwarding failed", "logicalCluster", f.entry.tenant.LogicalCluster, "name", f.entry.tenant.Name, "reason", reason, "error", err.Error())
			msg := forwardMessages[reason]
			if f.private.Load() {
				if reason = hidePrivate(reason); reason == ReasonTenantUnreachable {
					msg = privateUnreachable
				}
			}
			if f.counted.CompareAndSwap(false, true) {
				s.count(f.start, reason)
			}
			s.answer(w, code, reason, msg)
		},
	}
}

// forwardMessages are what callers read about a forwarding error: no
// address, certificate name or other detail of the tenant's setup.
var forwardMessages = map[string]string{
	ReasonTenantCertificate: "the tenant's serving certificate did not verify",
	ReasonTenantUnreachable: "the tenant could not be reached",
	ReasonTenantRedirect:    "the tenant answered with a redirect, which the mount proxy does not pass on",
	ReasonAddressNotAllowed: "the tenant's address is not allowed by the operator's address policy",
	ReasonUnknownTenant:     "the tenant was replaced or removed",
	ReasonTenantError:       "the tenant's answer could not be forwarded",
}

// privateUnreachable is the message of every TenantUnreachable of a
// tenant at a private address (see hidePrivate).
const privateUnreachable = "the tenant could not be reached over a verified TLS connection (the mount proxy's log says why)"

// bufferPool reuses the 32 KiB copy buffers of response bodies.
type bufferPool struct{ pool sync.Pool }

func (b *bufferPool) Get() []byte  { return b.pool.Get().([]byte) }
func (b *bufferPool) Put(v []byte) { b.pool.Put(v) } //nolint:staticcheck // a slice header per Put is cheaper than 32 KiB per request

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// rewriteHeaders removes every credential and identity header the caller
// sent and sets the tenant credential and the impersonation headers.
func rewriteHeaders(h http.Header, names Headers, c *Caller, cred mount.Credential) {
	for name := range h {
		c := http.CanonicalHeaderKey(name)
		if c == "Authorization" || c == "Proxy-Authorization" || strings.HasPrefix(c, "Impersonate-") || names.identityHeader(c) {
			delete(h, name)
		}
	}
	if cred.Token != "" {
		h.Set("Authorization", "Bearer "+cred.Token)
	}
	h.Set(HopHeader, "1")
	h.Set("Impersonate-User", c.User)
	for _, g := range c.Groups {
		h.Add("Impersonate-Group", g)
	}
	for k, vs := range c.Extra {
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
	case errors.Is(err, errTenantRedirect):
		return ReasonTenantRedirect, http.StatusBadGateway
	case errors.Is(err, netpolicy.ErrDenied):
		return ReasonAddressNotAllowed, http.StatusBadGateway
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
func (s *Server) refuse(w http.ResponseWriter, start time.Time, code int, reason, msg string) {
	s.count(start, reason)
	s.answer(w, code, reason, msg)
}

// count counts one request's outcome and observes its latency.
func (s *Server) count(start time.Time, outcome string) {
	s.requests.WithLabelValues(outcome).Inc()
	s.latency.WithLabelValues(outcome).Observe(time.Since(start).Seconds())
}

// answer is the shim's own answer: a Kubernetes Status body and the
// reason header.
func (s *Server) answer(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set(ReasonHeader, reason)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"kind": "Status", "apiVersion": "v1", "status": "Failure",
		"reason": reason, "message": msg, "code": code,
	})
}
