/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package engage

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/kcp-dev/logicalcluster/v3"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	mcpcache "github.com/kcp-dev/multicluster-provider/pkg/cache"
)

// shared is what every workspace behind one virtual workspace URL uses:
// one cache, one client and one REST mapper. multicluster-provider gives
// each workspace a client and two REST mappers of its own, each with its
// own discovery of the export's groups and a REST client per kind: about
// 40 KiB per workspace once used. All workspaces bound to the export serve
// the same resources, so the mapper discovers them once, across all
// clusters (the /clusters/* path the wildcard informers list from). The
// cache is a wildcard cache like the library's, but it drops
// managedFields from the objects it holds (nothing in knotless reads
// them from a cache; they are a third of a small object).
type shared struct {
	cache  mcpcache.WildcardCache
	client client.Client
	mapper meta.RESTMapper
}

// scope is the workspace a request is for; workspaceClient puts it in
// the request's context.
type scope struct {
	cluster logicalcluster.Name
	cache   client.Reader
}

type scopeKey struct{}

var errNoWorkspace = errors.New("engage: a request without a workspace")

func scopeFrom(ctx context.Context) (*scope, error) {
	s, ok := ctx.Value(scopeKey{}).(*scope)
	if !ok {
		return nil, errNoWorkspace
	}
	return s, nil
}

// newShared builds the client and mapper of the virtual workspace at
// cfg.Host. The client's requests go to the workspace named in their
// context (a request without one fails), and its cached reads to that
// workspace's cache.
func newShared(cfg *rest.Config, scheme *runtime.Scheme) (*shared, error) {
	base, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	wildcard := rest.CopyConfig(cfg)
	wildcard.Host = strings.TrimSuffix(cfg.Host, "/") + "/clusters/*"
	hc, err := rest.HTTPClientFor(wildcard)
	if err != nil {
		return nil, err
	}
	mapper, err := apiutil.NewDynamicRESTMapper(wildcard, hc)
	if err != nil {
		return nil, err
	}
	wc, err := mcpcache.NewWildcardCache(cfg, cache.Options{
		Scheme:           scheme,
		HTTPClient:       hc,
		Mapper:           mapper,
		DefaultTransform: cache.TransformStripManagedFields(),
	})
	if err != nil {
		return nil, err
	}
	scoped := rest.CopyConfig(cfg)
	prefix := strings.TrimSuffix(base.Path, "/")
	scoped.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &clusterRoundTripper{next: rt, prefix: prefix}
	})
	shc, err := rest.HTTPClientFor(scoped)
	if err != nil {
		return nil, err
	}
	c, err := client.New(scoped, client.Options{
		HTTPClient: shc,
		Scheme:     scheme,
		Mapper:     mapper,
		Cache:      &client.CacheOptions{Reader: scopedReader{}},
	})
	if err != nil {
		return nil, err
	}
	return &shared{cache: wc, client: c, mapper: mapper}, nil
}

// clusterRoundTripper sends a request to its workspace: the path
// <prefix>/api… becomes <prefix>/clusters/<cluster>/api….
type clusterRoundTripper struct {
	next   http.RoundTripper
	prefix string
}

func (rt *clusterRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	s, err := scopeFrom(req.Context())
	if err != nil {
		return nil, err
	}
	tail, ok := strings.CutPrefix(req.URL.Path, rt.prefix)
	if !ok {
		return nil, errors.New("engage: request path outside the virtual workspace")
	}
	r := req.Clone(req.Context())
	r.URL.Path = rt.prefix + s.cluster.Path().RequestPath() + tail
	r.URL.RawPath = ""
	return rt.next.RoundTrip(r)
}

// scopedReader reads from the cache of the workspace in the context.
type scopedReader struct{}

func (scopedReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	s, err := scopeFrom(ctx)
	if err != nil {
		return err
	}
	return s.cache.Get(ctx, key, obj, opts...)
}

func (scopedReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	s, err := scopeFrom(ctx)
	if err != nil {
		return err
	}
	return s.cache.List(ctx, list, opts...)
}

// workspaceClient is the shared client bound to one workspace.
type workspaceClient struct {
	shared client.Client
	scope  *scope
}

var _ client.Client = &workspaceClient{}

func (c *workspaceClient) in(ctx context.Context) context.Context {
	return context.WithValue(ctx, scopeKey{}, c.scope)
}

func (c *workspaceClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return c.shared.Get(c.in(ctx), key, obj, opts...)
}

func (c *workspaceClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return c.shared.List(c.in(ctx), list, opts...)
}

func (c *workspaceClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	return c.shared.Apply(c.in(ctx), obj, opts...)
}

func (c *workspaceClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	return c.shared.Create(c.in(ctx), obj, opts...)
}

func (c *workspaceClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	return c.shared.Delete(c.in(ctx), obj, opts...)
}

func (c *workspaceClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	return c.shared.Update(c.in(ctx), obj, opts...)
}

func (c *workspaceClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return c.shared.Patch(c.in(ctx), obj, patch, opts...)
}

func (c *workspaceClient) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	return c.shared.DeleteAllOf(c.in(ctx), obj, opts...)
}

func (c *workspaceClient) Status() client.SubResourceWriter {
	return c.SubResource("status")
}

func (c *workspaceClient) SubResource(subResource string) client.SubResourceClient {
	return &subResourceClient{c: c, sub: c.shared.SubResource(subResource)}
}

func (c *workspaceClient) Scheme() *runtime.Scheme     { return c.shared.Scheme() }
func (c *workspaceClient) RESTMapper() meta.RESTMapper { return c.shared.RESTMapper() }
func (c *workspaceClient) GroupVersionKindFor(obj runtime.Object) (schema.GroupVersionKind, error) {
	return c.shared.GroupVersionKindFor(obj)
}

func (c *workspaceClient) IsObjectNamespaced(obj runtime.Object) (bool, error) {
	return c.shared.IsObjectNamespaced(obj)
}

// subResourceClient is a subresource client bound to one workspace.
type subResourceClient struct {
	c   *workspaceClient
	sub client.SubResourceClient
}

func (s *subResourceClient) Get(ctx context.Context, obj, subResource client.Object, opts ...client.SubResourceGetOption) error {
	return s.sub.Get(s.c.in(ctx), obj, subResource, opts...)
}

func (s *subResourceClient) Create(ctx context.Context, obj, subResource client.Object, opts ...client.SubResourceCreateOption) error {
	return s.sub.Create(s.c.in(ctx), obj, subResource, opts...)
}

func (s *subResourceClient) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	return s.sub.Update(s.c.in(ctx), obj, opts...)
}

func (s *subResourceClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	return s.sub.Patch(s.c.in(ctx), obj, patch, opts...)
}

func (s *subResourceClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	return s.sub.Apply(s.c.in(ctx), obj, opts...)
}
