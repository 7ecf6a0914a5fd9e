// Package pds is a client for one account's repo on an ATProto PDS, built on
// indigo's atproto/atclient and api/agnostic.
//
// Sessions: Connect resumes a stored session (checked with getSession) and
// logs in (createSession, which the PDS rate-limits) only when there is no
// usable one. Every token refresh, and every login that a dead refresh token
// forces, is saved through the SessionStore before the request that needed
// it is retried, so a restart never logs in again. An ExpiredToken answer in
// the middle of any call refreshes once and retries once.
//
// Egress (R18, R19): the credential goes only to https URLs, or over plain
// http to hosts the address policy allows (CheckURL); PDS clients dial only
// addresses the policy allows, use no proxy from the environment, and never
// follow a redirect (NewHTTPClient).
//
// Identity (R20): with Options.Directory, Connect resolves the account's DID
// document and requires it to name this PDS and the session's handle, so a
// PDS cannot answer a login with another account's DID.
//
// Bounds (R21): every answer is read up to a size per call
// (MaxSessionResponse, MaxRecordResponse, MaxWriteResponse; MaxDIDDocument
// for NewDirectory); a longer one is ErrResponseTooLarge.
//
// Errors are typed (ErrAuthentication, ErrUnreachable, *RateLimitedError,
// ErrInvalidSwap, ErrRecordNotFound, ErrInsecureURL, ErrRedirect,
// ErrResponseTooLarge, ErrDIDMismatch, ErrDIDUnresolvable,
// *InvalidRequestError, *StatusError, *SpecError; a dial the policy
// refused matches netpolicy.ErrDenied) and never contain the password or a
// token.
package pds

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// DefaultTimeout is the request timeout of the HTTP client used when
// Options.HTTPClient is nil.
const DefaultTimeout = 20 * time.Second

const defaultUserAgent = "knotless-pds-client"

// Options configures Connect.
type Options struct {
	// HTTPClient carries the TLS roots for the PDS, a timeout and the
	// address policy (see NewHTTPClient); Connect uses a copy that never
	// follows redirects. Default: NewHTTPClient(Policy, nil,
	// DefaultTimeout) (never http.DefaultClient, which has no timeout).
	HTTPClient *http.Client
	// Policy decides which hosts may be reached over plain http (CheckURL)
	// and, when HTTPClient is nil, which addresses may be dialled. Nil
	// allows https to public addresses only.
	Policy *netpolicy.Policy
	// Store persists the session (required).
	Store SessionStore
	// UserAgent is sent with every request. Default "knotless-pds-client".
	UserAgent string
	// Directory resolves the account's DID document; when it is set,
	// Connect requires the document to name this PDS and the session's
	// handle (ErrDIDMismatch otherwise; NewDirectory). Nil checks nothing.
	Directory identity.Directory
	// MaxBatch is the most writes Ensure puts in one applyWrites call
	// (1 disables batching). Zero or more than MaxWritesPerBatch means
	// MaxWritesPerBatch.
	MaxBatch int
	// WriteLatency, when set, observes every write call (NewWriteLatency).
	WriteLatency *prometheus.HistogramVec
}

// Client writes to the repo of one account. It is safe for concurrent use.
type Client struct {
	host, identifier, password string
	store                      SessionStore
	dir                        identity.Directory
	api                        *atclient.APIClient // authenticated through bearerAuth
	anon                       *atclient.APIClient // createSession, refreshSession

	renewMu sync.Mutex // serialises login, refresh and Store.Save

	mu    sync.RWMutex
	sess  Session
	dirty bool // sess has not been saved yet

	batch    batcher // Ensure calls waiting for the next applyWrites
	maxBatch int

	writeLatency *prometheus.HistogramVec
}

// Connect returns a Client for the account identifier (handle, DID or email)
// on the PDS at host (e.g. "https://pds.example.com"). It resumes the stored
// session if it belongs to the same host and account and the PDS accepts it
// (refreshing it if the access token expired); otherwise it logs in with
// appPassword and saves the new session. When the stored session cannot be
// checked because the PDS is unreachable or rate-limits, Connect returns that
// error instead of spending a login. A host that CheckURL refuses gets no
// request.
func Connect(ctx context.Context, host, identifier, appPassword string, opts Options) (*Client, error) {
	host = strings.TrimRight(host, "/")
	if err := CheckURL(host, opts.Policy); err != nil {
		return nil, err
	}
	if identifier == "" {
		return nil, &SpecError{Field: "identifier", Reason: "must not be empty"}
	}
	if appPassword == "" {
		return nil, &SpecError{Field: "password", Reason: "must not be empty"}
	}
	if opts.Store == nil {
		return nil, &SpecError{Field: "Options.Store", Reason: "a SessionStore is required"}
	}
	var hc *http.Client
	if opts.HTTPClient != nil {
		cp := *opts.HTTPClient
		cp.CheckRedirect = netpolicy.NoRedirects
		hc = &cp
	} else {
		hc = NewHTTPClient(opts.Policy, nil, DefaultTimeout)
	}
	ua := opts.UserAgent
	if ua == "" {
		ua = defaultUserAgent
	}
	c := &Client{host: host, identifier: identifier, password: appPassword, store: opts.Store, dir: opts.Directory, maxBatch: opts.MaxBatch, writeLatency: opts.WriteLatency}
	if c.maxBatch <= 0 || c.maxBatch > MaxWritesPerBatch {
		c.maxBatch = MaxWritesPerBatch
	}
	headers := http.Header{"User-Agent": []string{ua}}
	c.anon = &atclient.APIClient{Client: hc, Host: host, Headers: headers}
	c.api = &atclient.APIClient{Client: hc, Host: host, Headers: headers, Auth: bearerAuth{c}}

	stored, err := opts.Store.Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("pds: loading session: %w", err)
	}
	if stored.usableFor(host, identifier) {
		c.sess = *stored
		err := c.resume(ctx)
		if err == nil {
			return c.checked(ctx)
		}
		if !isAuth(err) {
			return nil, err
		}
		c.sess = Session{} // a new login may be another account
	}
	if err := c.firstLogin(ctx); err != nil {
		return nil, err
	}
	return c.checked(ctx)
}

// checked returns c once the account's DID document agrees (checkIdentity).
func (c *Client) checked(ctx context.Context) (*Client, error) {
	if err := c.checkIdentity(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Client) firstLogin(ctx context.Context) error {
	c.renewMu.Lock()
	defer c.renewMu.Unlock()
	return c.login(ctx)
}

// Info returns the account's DID and handle.
func (c *Client) Info() (did, handle string) {
	s := c.session()
	return s.DID, s.Handle
}

// resume checks the current session with getSession; an expired access
// token is refreshed (and saved) by bearerAuth on the way.
func (c *Client) resume(ctx context.Context) error {
	var out struct {
		DID    string `json:"did"`
		Handle string `json:"handle"`
	}
	if err := c.lex().LexDo(ctx, http.MethodGet, "", "com.atproto.server.getSession", nil, nil, &out); err != nil {
		return fmt.Errorf("pds: checking stored session: %w", err)
	}
	c.renewMu.Lock()
	defer c.renewMu.Unlock()
	s := c.session()
	if out.DID != s.DID {
		return fmt.Errorf("pds: checking stored session: %w: it belongs to another account", ErrAuthentication)
	}
	if out.Handle != s.Handle {
		s.Handle = out.Handle
		return c.setSession(ctx, s)
	}
	return c.persist(ctx)
}

// renew refreshes the session after the access token `used` was reported
// expired; if the refresh token is dead too it logs in. Concurrent callers
// that saw the same expired token cause one refresh.
func (c *Client) renew(ctx context.Context, used string) error {
	c.renewMu.Lock()
	defer c.renewMu.Unlock()
	if c.session().AccessJWT != used {
		return c.persist(ctx) // someone else renewed already
	}
	err := c.refresh(ctx)
	if isAuth(err) {
		err = c.login(ctx)
	}
	return err
}

type sessionOutput struct {
	AccessJwt  string `json:"accessJwt"`
	RefreshJwt string `json:"refreshJwt"`
	Did        string `json:"did"`
	Handle     string `json:"handle"`
}

// refresh calls refreshSession with the refresh token. Needs renewMu.
func (c *Client) refresh(ctx context.Context) error {
	s := c.session()
	var out sessionOutput
	lc := lexClient{c: c, api: c.anon, bearer: s.RefreshJWT}
	if err := lc.LexDo(ctx, http.MethodPost, "", "com.atproto.server.refreshSession", nil, nil, &out); err != nil {
		return fmt.Errorf("pds: refreshing session: %w", err)
	}
	if out.Did != s.DID {
		return fmt.Errorf("pds: refreshing session: %w: the PDS returned another account", ErrAuthentication)
	}
	s.AccessJWT, s.RefreshJWT, s.Handle = out.AccessJwt, out.RefreshJwt, out.Handle
	return c.setSession(ctx, s)
}

// login calls createSession and saves the session. Needs renewMu.
func (c *Client) login(ctx context.Context) error {
	in := struct {
		Identifier string `json:"identifier"`
		Password   string `json:"password"`
	}{c.identifier, c.password}
	var out sessionOutput
	if err := c.lexAnon().LexDo(ctx, http.MethodPost, "", "com.atproto.server.createSession", nil, in, &out); err != nil {
		var ire *InvalidRequestError
		if errors.As(err, &ire) { // a 400 at login: unusable credentials
			err = fmt.Errorf("%w: %w", ErrAuthentication, err)
		}
		return fmt.Errorf("pds: logging in as %s: %w", c.identifier, err)
	}
	if _, err := syntax.ParseDID(out.Did); err != nil {
		return fmt.Errorf("pds: logging in as %s: the PDS returned an invalid DID: %w", c.identifier, err)
	}
	if prev := c.session().DID; prev != "" && out.Did != prev {
		// A login in the middle of a call (the refresh token died): the
		// account whose DID document was checked must stay the one.
		return fmt.Errorf("pds: logging in as %s: %w: the PDS returned another account", c.identifier, ErrAuthentication)
	}
	return c.setSession(ctx, Session{
		Host: c.host, Identifier: c.identifier, DID: out.Did, Handle: out.Handle,
		AccessJWT: out.AccessJwt, RefreshJWT: out.RefreshJwt,
	})
}

// setSession replaces the session and saves it. Needs renewMu.
func (c *Client) setSession(ctx context.Context, s Session) error {
	c.mu.Lock()
	c.sess, c.dirty = s, true
	c.mu.Unlock()
	return c.persist(ctx)
}

// persist saves the session if it has not been saved yet. Needs renewMu.
func (c *Client) persist(ctx context.Context) error {
	c.mu.RLock()
	s, dirty := c.sess, c.dirty
	c.mu.RUnlock()
	if !dirty {
		return nil
	}
	if err := c.store.Save(ctx, &s); err != nil {
		return fmt.Errorf("pds: saving session: %w", err)
	}
	c.mu.Lock()
	if c.sess == s {
		c.dirty = false
	}
	c.mu.Unlock()
	return nil
}

// ready is called before every operation: a session that a failed Save left
// unpersisted is saved first, so no write happens with tokens a restart
// would not find.
func (c *Client) ready(ctx context.Context) error {
	c.mu.RLock()
	dirty := c.dirty
	c.mu.RUnlock()
	if !dirty {
		return nil
	}
	c.renewMu.Lock()
	defer c.renewMu.Unlock()
	return c.persist(ctx)
}

func (c *Client) session() Session {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.sess
}

func (c *Client) lex() lexClient     { return lexClient{c: c, api: c.api} }
func (c *Client) lexAnon() lexClient { return lexClient{c: c, api: c.anon} }

// redact removes this client's secrets from text that came from the PDS.
func (c *Client) redact(text string) string {
	s := c.session()
	for _, secret := range []string{c.password, s.AccessJWT, s.RefreshJWT} {
		if len(secret) >= 6 {
			text = strings.ReplaceAll(text, secret, "[redacted]")
		}
	}
	return text
}

func isAuth(err error) bool { return err != nil && errors.Is(err, ErrAuthentication) }

func validateHost(host string) error {
	u, err := url.Parse(host)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return &SpecError{Field: "host", Reason: fmt.Sprintf("%q is not an http(s) URL without path", host)}
	}
	return nil
}
