// Package engage turns the APIExports knotless serves into one
// multicluster-runtime provider.
//
// Each export gets its own kcp apiexport provider (multicluster-provider
// v0.8.0). Engaged clusters are named "<export>#<logical cluster>", so a
// controller engages only the workspaces of the export that serves its
// kind (see ForExport).
//
// v0.8.0 starts an endpoint watcher once per URL of the export's
// APIExportEndpointSlice and never retries one that failed, for example
// because kcp published the virtual workspace URL before the virtual
// workspace served. This package therefore gates every URL on a probe of
// the virtual workspace, and restarts an export's provider with backoff
// when a URL it was handed did not serve, so engagement recovers without a
// restart of the process.
//
// The library's multi provider is not used because it starts its child
// providers in goroutines it never joins (R10); here every child runs in
// an errgroup that Start waits for.
package engage

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	"github.com/knotless-dev/knotless/internal/backoff"
)

// Separator joins an export name and a logical cluster name.
const Separator = "#"

// Options configure a Provider.
type Options struct {
	// Scheme must hold the kcp apis group and every kind a controller reads.
	Scheme *runtime.Scheme
	// Probe decides whether a virtual workspace URL serves. Defaults to
	// ProbeVirtualWorkspace.
	Probe ProbeFunc
	// Backoff bounds the restarts of an export's provider.
	Backoff backoff.Backoff
}

// Provider engages the workspaces bound to any of a set of APIExports.
type Provider struct {
	exports map[string]*exportProvider
	scheme  *runtime.Scheme
}

var (
	_ multicluster.Provider         = &Provider{}
	_ multicluster.ProviderRunnable = &Provider{}
)

// New returns a Provider for the named APIExports (which are also the names
// of their APIExportEndpointSlices, as kcp creates them). cfg must point at
// the provider workspace.
func New(cfg *rest.Config, exports []string, opts Options) (*Provider, error) {
	if opts.Scheme == nil {
		return nil, fmt.Errorf("engage: a scheme is required")
	}
	if opts.Probe == nil {
		opts.Probe = ProbeVirtualWorkspace
	}
	p := &Provider{exports: map[string]*exportProvider{}, scheme: opts.Scheme}
	for _, name := range exports {
		if name == "" || strings.Contains(name, Separator) {
			return nil, fmt.Errorf("engage: invalid export name %q", name)
		}
		ep, err := newExportProvider(cfg, name, opts)
		if err != nil {
			return nil, err
		}
		p.exports[name] = ep
	}
	return p, nil
}

// ClusterName returns the engaged cluster name of a logical cluster bound
// to an export.
func ClusterName(export, logicalCluster string) multicluster.ClusterName {
	return multicluster.ClusterName(export + Separator + logicalCluster)
}

// SplitClusterName returns the export and the logical cluster of an engaged
// cluster name.
func SplitClusterName(name multicluster.ClusterName) (export, logicalCluster string, ok bool) {
	return strings.Cut(string(name), Separator)
}

// ForExport is a controller option that engages only the workspaces bound
// to the named export.
func ForExport(export string) mcbuilder.EngageOptions {
	return mcbuilder.WithClusterFilter(func(name multicluster.ClusterName, _ cluster.Cluster) bool {
		e, _, ok := SplitClusterName(name)
		return ok && e == export
	})
}

// Get returns an engaged cluster.
func (p *Provider) Get(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error) {
	export, lc, ok := SplitClusterName(name)
	if !ok {
		return nil, multicluster.ErrClusterNotFound
	}
	ep, found := p.exports[export]
	if !found {
		return nil, multicluster.ErrClusterNotFound
	}
	return ep.Get(ctx, multicluster.ClusterName(lc))
}

// IndexField adds an index to the clusters of the exports that serve obj:
// a knotless kind is served by the export named after its API group (as
// apigen names exports); other kinds (Secrets, ConfigMaps) by every export.
func (p *Provider) IndexField(ctx context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	gvk, err := apiutil.GVKForObject(obj, p.scheme)
	if err != nil {
		return err
	}
	for _, name := range p.exportNames() {
		if _, own := p.exports[gvk.Group]; own && name != gvk.Group {
			continue
		}
		if err := p.exports[name].IndexField(ctx, obj, field, extract); err != nil {
			return fmt.Errorf("export %s: %w", name, err)
		}
	}
	return nil
}

// Start runs every export's provider until ctx ends and returns after all
// of them returned.
func (p *Provider) Start(ctx context.Context, aware multicluster.Aware) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, name := range p.exportNames() {
		ep := p.exports[name]
		g.Go(func() error {
			return ep.Start(ctx, prefixedAware{Aware: aware, export: name})
		})
	}
	return g.Wait()
}

// Engaged returns, per export, the number of engaged logical clusters.
func (p *Provider) Engaged() map[string]int {
	out := make(map[string]int, len(p.exports))
	for name, ep := range p.exports {
		out[name] = ep.Engaged()
	}
	return out
}

// Restarts returns, per export, how often its provider was restarted.
func (p *Provider) Restarts() map[string]int {
	out := make(map[string]int, len(p.exports))
	for name, ep := range p.exports {
		out[name] = ep.Restarts()
	}
	return out
}

func (p *Provider) exportNames() []string {
	names := make([]string, 0, len(p.exports))
	for n := range p.exports {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

type prefixedAware struct {
	multicluster.Aware
	export string
}

func (a prefixedAware) Engage(ctx context.Context, name multicluster.ClusterName, cl cluster.Cluster) error {
	return a.Aware.Engage(ctx, ClusterName(a.export, string(name)), cl)
}

// Sibling returns the cluster of logical cluster lc for another export than
// the one being reconciled (a Component's children are served by the
// atproto export). A workspace is engaged for each export separately, so
// after a restart one may come before the other: the error then does not
// wrap multicluster.ErrClusterNotFound, because multicluster-runtime's
// ClusterNotFoundWrapper turns that error into a success without requeue
// and the object would not be reconciled again until it changes. This
// error is retried with the controller's backoff.
func Sibling(ctx context.Context, get func(context.Context, multicluster.ClusterName) (cluster.Cluster, error), export, lc string) (cluster.Cluster, error) {
	cl, err := get(ctx, ClusterName(export, lc))
	if err != nil {
		return nil, fmt.Errorf("workspace %s is not engaged for %s yet: %v", lc, export, err)
	}
	return cl, nil
}
