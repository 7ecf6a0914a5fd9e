// Package serviceauth is how a tenant apiserver knows who calls it: by
// ATProto identity. A caller presents an inter-service JWT its own PDS
// issued (com.atproto.server.getServiceAuth), signed by the key of its
// DID document, for the tenant's service identity (the audience, which
// the bidder's lease record publishes) and the method Method. The agent
// next to the tenant checks it (Validator, with indigo's
// ServiceAuthValidator) for the tenant apiserver through Kubernetes
// webhook token authentication (Webhook): the user is the caller's DID,
// with no group. What the DID may do is the tenant's RBAC. No credential
// is handed from one side of a deal to the other (R20).
package serviceauth

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/golang-jwt/jwt/v5"
)

// Method is the lxm a token for a tenant must name: a token its holder
// asked for another method (a PDS's, an AppView's) is not one for a
// tenant, even when its audience matches. Its bearer is the issuer's
// DID on the tenant.
const Method = "dev.knotless.tenant.access"

// MountMethod is the lxm of the token a requester's mount presents: its
// bearer is not the issuer's DID but MountUser(did), which has only what
// the tenant's RBAC gives that name (the requester's side lets it
// impersonate the kcp users and groups of spec.tenantAdmins, and nothing
// else). A token kept for a mount is so worth less than the DID's own.
const MountMethod = "dev.knotless.tenant.mount"

// mountSuffix makes the mount's user name of a DID (MountUser). A DID
// has no '#' (syntax.ParseDID refuses it), so no DID is a mount's user.
const mountSuffix = "#mount"

// MountUser is the user on a tenant of a token of the DID did for
// MountMethod.
func MountUser(did string) string { return did + mountSuffix }

// User is the user on a tenant of a token of the DID did for the method
// lxm (Method or MountMethod).
func User(did, lxm string) string {
	if lxm == MountMethod {
		return MountUser(did)
	}
	return did
}

// Bounds of a token a tenant accepts.
const (
	// MaxToken bounds a token's length: a PDS's is about 400 bytes.
	MaxToken = 4096
	// MaxLifetime bounds how long a token may be valid from when it was
	// issued: a PDS issues tokens for at most an hour; a tenant takes
	// only short ones, so a token that leaked is worth little.
	MaxLifetime = 10 * time.Minute
	// Leeway is the clock skew allowed between the PDS and the agent.
	Leeway = 10 * time.Second
	// PurgeInterval is how often at most a token that fails its
	// signature makes the issuer's DID document be resolved again (it
	// may have rotated its key): forged tokens cannot make the agent
	// resolve a DID more than once per interval.
	PurgeInterval = time.Minute
	// DocumentTTL is how long a tenant's validator keeps an issuer's DID
	// document: a key the issuer rotated out is refused at most this long
	// after the PLC says so (at once when a token signed with the new key
	// came first, which purges the old document).
	DocumentTTL = 2 * time.Minute
)

// audiencePrefix starts the fragment of a tenant's service identity.
const audiencePrefix = "#knotless_tenant_"

// Audience is the service identity of the VM vmID of the bidder
// bidderDID: the bidder's DID with a fragment naming the VM, so that a
// token for one tenant is refused by every other, the same bidder's
// included. A PDS issues tokens for such a DID reference.
func Audience(bidderDID, vmID string) string {
	sum := sha256.Sum256([]byte(vmID))
	return bidderDID + audiencePrefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:15]))
}

// IsAudienceOf says whether aud is a tenant's service identity of the
// DID did (as Audience makes them): did, then the fragment prefix, then
// lowercase base32 only.
func IsAudienceOf(aud, did string) bool {
	rest, ok := strings.CutPrefix(aud, did+audiencePrefix)
	if !ok || did == "" || rest == "" {
		return false
	}
	for _, r := range rest {
		if (r < 'a' || r > 'z') && (r < '2' || r > '7') {
			return false
		}
	}
	return true
}

// ErrInvalid is wrapped by every refusal of a token.
var ErrInvalid = errors.New("invalid service-auth token")

// Validator checks tokens for tenants. It is safe for concurrent use.
type Validator struct {
	dir identity.Directory
	now func() time.Time
}

// NewValidator returns a validator that resolves issuers through dir
// (bounded and cached: pds.NewDirectory). A failed signature purges an
// issuer's cached document at most once per PurgeInterval.
func NewValidator(dir identity.Directory) *Validator {
	return &Validator{dir: &purgeLimited{Directory: dir, last: map[syntax.AtIdentifier]time.Time{}, now: time.Now}, now: time.Now}
}

// Validate returns the DID a token was issued by and its method, when it
// is a valid service-auth token for audience and Method or MountMethod,
// issued by one of the DIDs
// allowed, signed by the key of the issuer's DID document, issued at
// most MaxLifetime before it expires and not expired. Everything but the
// signature is checked before the issuer's DID is resolved, so a token
// from anyone but an allowed DID costs no resolution. The error wraps
// ErrInvalid and says why, for the agent's log only: a caller is told
// nothing more than 401.
func (v *Validator) Validate(ctx context.Context, token, audience string, allowed []string) (syntax.DID, string, error) {
	if audience == "" {
		return "", "", fmt.Errorf("%w: the tenant has no service identity", ErrInvalid)
	}
	if len(token) > MaxToken {
		return "", "", fmt.Errorf("%w: longer than %d bytes", ErrInvalid, MaxToken)
	}
	lxm, err := precheck(token, audience, allowed, v.now())
	if err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	method := syntax.NSID(lxm)
	sv := auth.ServiceAuthValidator{Audience: audience, Dir: v.dir, TimestampLeeway: Leeway}
	did, err := sv.Validate(ctx, token, &method)
	if err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return did, lxm, nil
}

// claims are a service-auth token's claims, as read before its
// signature is checked.
type claims struct {
	jwt.RegisteredClaims
	LexMethod string `json:"lxm,omitempty"`
}

// precheck checks, without the signature, what a token says: an ES256 or
// ES256K signature (the only ones a DID key makes), one of the allowed
// issuers, the audience, the method (Method or MountMethod, which it
// returns), and a lifetime of at most MaxLifetime that has not ended.
func precheck(token, audience string, allowed []string, now time.Time) (string, error) {
	var c claims
	t, _, err := jwt.NewParser().ParseUnverified(token, &c)
	if err != nil {
		return "", err
	}
	// The claims as a map, as indigo reads the issuer it purges: JSON
	// keys match a struct field whatever their case, so a token could
	// carry an allowed "ISS" beside another "iss".
	var m jwt.MapClaims
	if _, _, err := jwt.NewParser().ParseUnverified(token, &m); err != nil {
		return "", err
	}
	if iss, _ := m["iss"].(string); iss != c.Issuer {
		return "", errors.New("the issuer is named twice")
	}
	if alg := t.Method.Alg(); alg != "ES256" && alg != "ES256K" {
		return "", fmt.Errorf("signature algorithm %q", alg)
	}
	if !slices.Contains(allowed, c.Issuer) {
		return "", errors.New("the issuer is not one the tenant lets in")
	}
	if len(c.Audience) != 1 || c.Audience[0] != audience {
		return "", errors.New("another audience")
	}
	if c.LexMethod != Method && c.LexMethod != MountMethod {
		return "", errors.New("another method")
	}
	if c.ExpiresAt == nil || c.IssuedAt == nil {
		return "", errors.New("no exp or iat")
	}
	if life := c.ExpiresAt.Sub(c.IssuedAt.Time); life > MaxLifetime || life <= 0 {
		return "", fmt.Errorf("valid for %s (at most %s)", life, MaxLifetime)
	}
	if c.ExpiresAt.Add(Leeway).Before(now) {
		return "", errors.New("expired")
	}
	return c.LexMethod, nil
}

// purgeLimited lets Purge through at most once per PurgeInterval for each
// identifier: ServiceAuthValidator purges the issuer's document after
// every failed signature.
type purgeLimited struct {
	identity.Directory
	mu   sync.Mutex
	last map[syntax.AtIdentifier]time.Time
	now  func() time.Time
}

// maxPurgeEntries bounds what purgeLimited remembers; past it, entries
// older than PurgeInterval are dropped, and if none is, nothing is purged
// until one is.
const maxPurgeEntries = 10_000

func (p *purgeLimited) Purge(ctx context.Context, atid syntax.AtIdentifier) error {
	now := p.now()
	p.mu.Lock()
	if t, ok := p.last[atid]; ok && now.Sub(t) < PurgeInterval {
		p.mu.Unlock()
		return nil
	}
	if len(p.last) >= maxPurgeEntries {
		for k, t := range p.last {
			if now.Sub(t) >= PurgeInterval {
				delete(p.last, k)
			}
		}
		if len(p.last) >= maxPurgeEntries {
			p.mu.Unlock()
			return nil
		}
	}
	p.last[atid] = now
	p.mu.Unlock()
	return p.Directory.Purge(ctx, atid)
}
