package vault

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	vault "github.com/hashicorp/vault-client-go"
)

// Option configures a Client.
type Option func(*Client)

// WithLogger sets the logger (default: discard). Tokens and secret values
// are never logged.
func WithLogger(l logr.Logger) Option { return func(c *Client) { c.log = l } }

// WithMetrics sets the metrics (default: none).
func WithMetrics(m *Metrics) Option { return func(c *Client) { c.metrics = m } }

// Client reads KV v2 secrets on behalf of workspaces. It is safe for
// concurrent use. A nil *Client is valid and means Vault is disabled: its
// ReadKV returns ErrDisabled and its Start returns at once.
type Client struct {
	vc        *vault.Client
	transport *http.Transport
	address   string
	prefix    string
	static    string // static token; empty with AppRole
	approle   AppRoleConfig
	log       logr.Logger
	metrics   *Metrics
	now       func() time.Time

	mu     sync.Mutex
	tok    *token
	flight *flight

	kick    chan struct{} // a new token was stored: Start re-plans
	logins  atomic.Int64
	running atomic.Bool
}

// token is immutable; changes replace the pointer.
type token struct {
	value     string
	static    bool
	renewable bool
	ttl       time.Duration // 0: does not expire
	issued    time.Time     // when ttl was measured (before the request)
	loginTTL  time.Duration // ttl at login, to notice a max_ttl cap
	noRenew   bool          // static token whose renewal is given up
}

func (t *token) usable(now time.Time) bool {
	if t == nil {
		return false
	}
	if t.ttl <= 0 {
		return true
	}
	skew := min(t.ttl/10, 10*time.Second)
	return now.Before(t.issued.Add(t.ttl - skew))
}

func (t *token) renewAt() time.Time { return t.issued.Add(t.ttl * 2 / 3) }

// flight is one token acquisition that concurrent callers share.
type flight struct {
	done      chan struct{}
	tok       *token
	err       error
	valid     string // the suspect token that lookup-self found still valid
	abandoned bool   // the leader's context ended; followers try again
}

// errPolicyDenied: a read was refused although the token is valid.
var errPolicyDenied = errors.New("policy denied")

// New returns a Client for cfg, or (nil, nil) when cfg.Address is empty
// (Vault disabled; see ErrDisabled). It reads the token and secret ID
// files and validates the configuration; it sends no request.
func New(cfg Config, opts ...Option) (*Client, error) {
	if !cfg.Enabled() {
		return nil, nil
	}
	cfg, err := cfg.complete()
	if err != nil {
		return nil, err
	}
	vcfg := vault.DefaultConfiguration()
	vcfg.Address = cfg.Address
	vcfg.RequestTimeout = cfg.Timeout
	// No client of knotless follows a redirect (R18): a Vault standby's
	// redirect is an error, not a second request with the token.
	vcfg.DisableRedirects = true
	tr, ok := vcfg.HTTPClient.Transport.(*http.Transport)
	if !ok {
		return nil, fmt.Errorf("vault: unexpected default transport %T", vcfg.HTTPClient.Transport)
	}
	if cfg.CAFile != "" {
		f := &caFile{path: cfg.CAFile}
		pool, err := f.get()
		if err != nil {
			return nil, fmt.Errorf("vault: %w", err)
		}
		tr.TLSClientConfig.RootCAs = pool // used only through an HTTPS proxy
		tr.DialTLSContext = dialTLS(tr.TLSClientConfig, f)
	}
	vc, err := vault.New(vault.WithConfiguration(vcfg))
	if err != nil {
		return nil, fmt.Errorf("vault: %w", err)
	}
	c := &Client{
		vc:        vc,
		transport: tr,
		address:   cfg.Address,
		prefix:    cfg.Prefix,
		static:    cfg.Token,
		approle:   cfg.AppRole,
		log:       logr.Discard(),
		now:       time.Now,
		kick:      make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Prefix returns the tenancy prefix.
func (c *Client) Prefix() string {
	if c == nil {
		return ""
	}
	return c.prefix
}

// CheckRef checks ref for namespace in workspace against the client's
// prefix without sending anything (see the package function CheckRef).
func (c *Client) CheckRef(workspace, namespace string, ref KVRef) error {
	if c == nil {
		return ErrDisabled
	}
	return CheckRef(c.prefix, workspace, namespace, ref)
}

// Logins returns the number of login attempts so far: AppRole logins, or
// for a static token the lookups that (re)validate it.
func (c *Client) Logins() int64 {
	if c == nil {
		return 0
	}
	return c.logins.Load()
}

// ReadKV returns the value of ref.Key in the KV v2 secret
// <ref.Mount>/data/<ref.Path>, on behalf of namespace in workspace (the
// logical cluster name of the workspace the reference comes from). The
// path must lie below <prefix>/<workspace>/<namespace>/, otherwise a
// *ForbiddenPathError is returned and nothing is sent. Other errors match ErrNotFound, ErrUnreachable,
// ErrUnauthorized, ErrInvalidValue or the caller's context error; none of
// them contains a secret value or a token.
func (c *Client) ReadKV(ctx context.Context, workspace, namespace string, ref KVRef) (string, error) {
	if c == nil {
		return "", ErrDisabled
	}
	v, err := c.readKV(ctx, workspace, namespace, ref)
	c.metrics.read(result(err))
	return v, err
}

func result(err error) string {
	switch {
	case err == nil:
		return ResultOK
	case errors.Is(err, ErrForbiddenPath):
		return ResultForbiddenPath
	case errors.Is(err, ErrNotFound):
		return ResultNotFound
	case errors.Is(err, ErrUnauthorized):
		return ResultUnauthorized
	case errors.Is(err, ErrUnreachable):
		return ResultUnreachable
	case errors.Is(err, ErrInvalidValue):
		return ResultInvalidValue
	default:
		return ResultError
	}
}

func (c *Client) readKV(ctx context.Context, workspace, namespace string, ref KVRef) (string, error) {
	if err := CheckRef(c.prefix, workspace, namespace, ref); err != nil {
		return "", err
	}
	tok, err := c.acquire(ctx, "")
	if err != nil {
		return "", fmt.Errorf("vault read %s: %w", ref, err)
	}
	data, err := c.readOnce(ctx, tok, ref)
	if isDenied(err) {
		// Either the token went bad (revoked, expired early) or the policy
		// does not cover the path: acquire tells them apart, logs in again
		// in the first case, and we retry exactly once.
		tok2, aerr := c.acquire(ctx, tok.value)
		switch {
		case errors.Is(aerr, errPolicyDenied):
			return "", err
		case aerr != nil:
			return "", fmt.Errorf("vault read %s: %w", ref, aerr)
		}
		data, err = c.readOnce(ctx, tok2, ref)
	}
	if err != nil {
		return "", err
	}
	notFound := func(detail string) error {
		return &Error{Op: "read", Target: ref.String(), Kind: ErrNotFound, Detail: detail}
	}
	if data == nil {
		return "", notFound("the secret has no current version")
	}
	raw, ok := data[ref.Key]
	if !ok {
		return "", notFound("the secret has no such key")
	}
	switch v := raw.(type) {
	case string:
		return v, nil
	case json.Number:
		return v.String(), nil
	case bool:
		return strconv.FormatBool(v), nil
	default:
		return "", &Error{Op: "read", Target: ref.String(), Kind: ErrInvalidValue, Detail: fmt.Sprintf("the key holds a %s", jsonKind(raw))}
	}
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "JSON object"
	case []any:
		return "JSON array"
	default:
		return fmt.Sprintf("%T", v)
	}
}

// readOnce reads the secret's data map with tok.
func (c *Client) readOnce(ctx context.Context, tok *token, ref KVRef) (map[string]any, error) {
	resp, err := c.vc.Read(ctx, ref.Mount+"/data/"+ref.Path, vault.WithToken(tok.value))
	if err != nil {
		return nil, classify(ctx, "read", ref.String(), err, tok.value)
	}
	if resp == nil {
		return nil, nil
	}
	data, _ := resp.Data["data"].(map[string]any)
	return data, nil
}

// acquire returns a usable token, logging in when there is none. When
// suspect is set, the caller's read with that token was refused: acquire
// checks it with lookup-self and returns errPolicyDenied when it is still
// valid, else forgets it and logs in again. Concurrent callers share one
// acquisition (R09); a follower whose leader gave up because its own
// context ended tries again with its own context.
func (c *Client) acquire(ctx context.Context, suspect string) (*token, error) {
	for {
		c.mu.Lock()
		cur := c.tok
		if cur.usable(c.now()) && (suspect == "" || cur.value != suspect) {
			c.mu.Unlock()
			return cur, nil
		}
		if f := c.flight; f != nil {
			c.mu.Unlock()
			tok, again, err := join(ctx, f, suspect)
			if again {
				continue
			}
			return tok, err
		}
		f := &flight{done: make(chan struct{})}
		c.flight = f
		c.mu.Unlock()
		return c.lead(ctx, f, cur, suspect)
	}
}

// join waits for another caller's acquisition f and returns its outcome
// for a caller whose read with suspect was refused (suspect empty: no
// read yet), or again when the caller must look again: the leader gave up
// because its own context ended, or brought no token this caller can use.
func join(ctx context.Context, f *flight, suspect string) (tok *token, again bool, err error) {
	select {
	case <-f.done:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	switch {
	case f.abandoned && ctx.Err() == nil:
		return nil, true, nil
	case f.err != nil:
		return nil, false, f.err
	case suspect != "" && f.valid == suspect:
		return nil, false, errPolicyDenied
	case f.tok != nil && f.tok.value != suspect:
		return f.tok, false, nil
	default:
		return nil, true, nil
	}
}

// lead runs the acquisition f that this caller started (c.flight is f):
// it checks suspect or logs in, keeps the new token, and tells the
// callers that joined f its outcome.
func (c *Client) lead(ctx context.Context, f *flight, cur *token, suspect string) (*token, error) {
	tok, verdict, err := c.obtain(ctx, cur, suspect)

	c.mu.Lock()
	c.flight = nil
	if verdict == suspectInvalid && c.tok != nil && c.tok.value == suspect {
		c.tok = nil
	}
	switch {
	case verdict == suspectValid:
		f.valid = suspect
	case err != nil:
		f.err = err
		f.abandoned = ctx.Err() != nil
	default:
		c.tok, f.tok = tok, tok
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	close(f.done)
	c.mu.Unlock()
	if verdict == suspectValid {
		return nil, errPolicyDenied
	}
	return tok, err
}

// What lookup-self said about a suspect token.
type verdict int

const (
	noVerdict verdict = iota
	suspectValid
	suspectInvalid
)

// obtain does the work of one acquisition: it checks the suspect token (if
// it is the current one) and logs in when needed.
func (c *Client) obtain(ctx context.Context, cur *token, suspect string) (*token, verdict, error) {
	v := noVerdict
	if suspect != "" && cur != nil && cur.value == suspect {
		_, err := c.lookup(ctx, suspect, cur.static)
		switch {
		case err == nil:
			return nil, suspectValid, nil
		case !isDenied(err):
			return nil, noVerdict, err
		}
		v = suspectInvalid
	}
	if c.static != "" {
		if suspect == c.static && v == suspectInvalid {
			c.log.Info("Vault rejected the static token")
			return nil, v, &Error{Op: "login", Target: "static token", Kind: ErrUnauthorized,
				Detail: "the static token was rejected (revoked or expired); replace it and restart"}
		}
		c.logins.Add(1)
		tok, err := c.lookup(ctx, c.static, true)
		c.metrics.login(err)
		if err != nil {
			var e *Error
			if errors.As(err, &e) && isDenied(e) {
				e.Detail = "the static token was rejected (invalid, expired, or without the default policy's lookup-self)"
			}
			return nil, v, err
		}
		c.log.Info("validated the static Vault token", "ttl", tok.ttl, "renewable", tok.renewable)
		return tok, v, nil
	}
	if v == suspectInvalid {
		c.log.Info("Vault rejected the token; logging in again")
	}
	tok, err := c.login(ctx)
	return tok, v, err
}

// lookup checks a token with auth/token/lookup-self and returns its TTL.
func (c *Client) lookup(ctx context.Context, value string, static bool) (*token, error) {
	issued := c.now()
	resp, err := c.vc.Read(ctx, "auth/token/lookup-self", vault.WithToken(value))
	if err != nil {
		return nil, classify(ctx, "lookup", "auth/token/lookup-self", err, value)
	}
	t := &token{value: value, static: static, issued: issued}
	if resp != nil {
		t.ttl = seconds(resp.Data["ttl"])
		t.renewable, _ = resp.Data["renewable"].(bool)
	}
	t.loginTTL = t.ttl
	return t, nil
}

// login logs in with AppRole.
func (c *Client) login(ctx context.Context) (*token, error) {
	path := "auth/" + c.approle.MountPath + "/login"
	secretID := c.approle.SecretID
	if secretID == "" {
		var err error
		if secretID, err = readSecretFile(c.approle.SecretIDFile); err != nil {
			c.logins.Add(1)
			e := &Error{Op: "login", Target: path, Kind: ErrUnauthorized, Detail: "reading the secret ID file: " + err.Error()}
			c.metrics.login(e)
			return nil, e
		}
	}
	c.logins.Add(1)
	issued := c.now()
	resp, err := c.vc.Write(ctx, path, map[string]any{"role_id": c.approle.RoleID, "secret_id": secretID})
	if err == nil && (resp == nil || resp.Auth == nil || resp.Auth.ClientToken == "") {
		err = &Error{Op: "login", Target: path, Kind: ErrUnauthorized, Detail: "the answer carries no token"}
	}
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			e = classify(ctx, "login", path, err, secretID)
		}
		c.metrics.login(e)
		c.log.Info("Vault login failed", "mount", c.approle.MountPath, "error", e.Error())
		return nil, e
	}
	c.metrics.login(nil)
	t := &token{
		value:     resp.Auth.ClientToken,
		renewable: resp.Auth.Renewable,
		ttl:       time.Duration(resp.Auth.LeaseDuration) * time.Second,
		issued:    issued,
	}
	t.loginTTL = t.ttl
	c.log.Info("logged in to Vault", "mount", c.approle.MountPath, "ttl", t.ttl, "renewable", t.renewable)
	return t, nil
}

// seconds reads a JSON number of seconds.
func seconds(v any) time.Duration {
	switch n := v.(type) {
	case json.Number:
		i, err := n.Int64()
		if err != nil {
			return 0
		}
		return time.Duration(i) * time.Second
	case float64:
		return time.Duration(n) * time.Second
	}
	return 0
}

// forget drops the current token if it is still value.
func (c *Client) forget(value string) {
	c.mu.Lock()
	if c.tok != nil && c.tok.value == value {
		c.tok = nil
	}
	c.mu.Unlock()
}

// replace swaps in t if the current token is still t.value.
func (c *Client) replace(t *token) {
	c.mu.Lock()
	if c.tok != nil && c.tok.value == t.value {
		c.tok = t
	}
	c.mu.Unlock()
}
