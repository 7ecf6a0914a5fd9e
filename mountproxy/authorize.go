package mountproxy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/singleflight"
	authorizationv1 "k8s.io/api/authorization/v1"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Caller is the identity kcp-front-proxy asserts for a request.
type Caller struct {
	User   string
	Groups []string
	Extra  map[string][]string
}

// Authorizer decides whether a caller may enter the workspace of a
// logical cluster (R17: the shim authorizes, routing does not).
type Authorizer interface {
	Authorize(ctx context.Context, logicalCluster string, c *Caller) (bool, error)
}

// AuthorizerFunc adapts a function to Authorizer.
type AuthorizerFunc func(ctx context.Context, logicalCluster string, c *Caller) (bool, error)

// Authorize calls f.
func (f AuthorizerFunc) Authorize(ctx context.Context, lc string, c *Caller) (bool, error) {
	return f(ctx, lc, c)
}

// EnterVerb and EnterPath are what kcp checks before it lets a user into a
// workspace (its workspace content authorizer): verb "access" on the
// non-resource path "/" of the workspace's logical cluster. A mount
// workspace has no logical cluster of its own; the shim checks its parent,
// the workspace that holds the TenantCluster.
const (
	EnterVerb = "access"
	EnterPath = "/"
)

// SARAuthorizer asks kcp with a SubjectAccessReview in the workspace's
// logical cluster, and caches answers briefly in a bounded LRU cache;
// concurrent checks of the same caller share one review.
type SARAuthorizer struct {
	review            func(ctx context.Context, lc string, sar *authorizationv1.SubjectAccessReview) (*authorizationv1.SubjectAccessReview, error)
	cache             *utilcache.LRUExpireCache
	flight            singleflight.Group
	allowTTL, denyTTL time.Duration
}

// SAROptions configure a SARAuthorizer; zero fields take defaults.
type SAROptions struct {
	// AllowTTL and DenyTTL are how long an answer is reused (default 10 s
	// and 5 s): a revoked permission takes effect within AllowTTL.
	AllowTTL, DenyTTL time.Duration
	// Size bounds the cache (default 10000 answers).
	Size int
	// Clock is for tests (default: the real clock).
	Clock utilcache.Clock
}

func (o SAROptions) withDefaults() SAROptions {
	if o.AllowTTL <= 0 {
		o.AllowTTL = 10 * time.Second
	}
	if o.DenyTTL <= 0 {
		o.DenyTTL = 5 * time.Second
	}
	if o.Size <= 0 {
		o.Size = 10000
	}
	return o
}

// NewSARAuthorizer returns an authorizer that creates SubjectAccessReviews
// through cfg, whose Host is kcp's base URL (without /clusters/...).
func NewSARAuthorizer(cfg *rest.Config, o SAROptions) (*SARAuthorizer, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	rc := cs.AuthorizationV1().RESTClient()
	return newSARAuthorizer(func(ctx context.Context, lc string, sar *authorizationv1.SubjectAccessReview) (*authorizationv1.SubjectAccessReview, error) {
		out := &authorizationv1.SubjectAccessReview{}
		err := rc.Post().AbsPath("/clusters", lc, "apis/authorization.k8s.io/v1/subjectaccessreviews").Body(sar).Do(ctx).Into(out)
		return out, err
	}, o), nil
}

func newSARAuthorizer(review func(context.Context, string, *authorizationv1.SubjectAccessReview) (*authorizationv1.SubjectAccessReview, error), o SAROptions) *SARAuthorizer {
	o = o.withDefaults()
	c := utilcache.NewLRUExpireCache(o.Size)
	if o.Clock != nil {
		c = utilcache.NewLRUExpireCacheWithClock(o.Size, o.Clock)
	}
	return &SARAuthorizer{review: review, cache: c, allowTTL: o.AllowTTL, denyTTL: o.DenyTTL}
}

// Authorize reports whether kcp lets the caller enter the workspace.
// Errors (kcp unreachable) are not cached.
func (a *SARAuthorizer) Authorize(ctx context.Context, lc string, c *Caller) (bool, error) {
	key := cacheKey(lc, c)
	if v, ok := a.cache.Get(key); ok {
		return v.(bool), nil
	}
	v, err, _ := a.flight.Do(key, func() (any, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:                  c.User,
			Groups:                c.Groups,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Verb: EnterVerb, Path: EnterPath},
		}}
		if len(c.Extra) > 0 {
			sar.Spec.Extra = map[string]authorizationv1.ExtraValue{}
			for k, vs := range c.Extra {
				sar.Spec.Extra[k] = vs
			}
		}
		out, err := a.review(context.WithoutCancel(ctx), lc, sar)
		if err != nil {
			return false, fmt.Errorf("SubjectAccessReview in %s: %w", lc, err)
		}
		allowed := out.Status.Allowed && !out.Status.Denied
		ttl := a.denyTTL
		if allowed {
			ttl = a.allowTTL
		}
		a.cache.Add(key, allowed, ttl)
		return allowed, nil
	})
	if err != nil {
		return false, err
	}
	return v.(bool), nil
}

// cacheKey identifies a caller in a workspace: user, sorted groups and
// sorted extras, separated by a byte no header value holds.
func cacheKey(lc string, c *Caller) string {
	var b strings.Builder
	b.WriteString(lc)
	b.WriteByte(0)
	b.WriteString(c.User)
	groups := slices.Sorted(slices.Values(c.Groups))
	for _, g := range groups {
		b.WriteByte(0)
		b.WriteString(g)
	}
	b.WriteByte(1)
	keys := make([]string, 0, len(c.Extra))
	for k := range c.Extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.WriteByte(0)
		b.WriteString(k)
		for _, v := range c.Extra[k] {
			b.WriteByte(2)
			b.WriteString(v)
		}
	}
	return b.String()
}
