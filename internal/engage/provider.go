// Package engage turns knotless's one APIExport into a multicluster-runtime
// provider: every workspace that binds the export is one engaged cluster,
// named by its logical cluster.
//
// multicluster-provider v0.8.0 starts an endpoint watcher once per URL of
// the export's APIExportEndpointSlice and never retries one that failed,
// for example because kcp published the virtual workspace URL before the
// virtual workspace served. This package therefore gates every URL on a
// probe of the virtual workspace, and restarts the export's provider with
// backoff when a URL it was handed did not serve, so engagement recovers
// without a restart of the process. The inner provider runs in an
// errgroup that Start waits for (R10).
package engage

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	"github.com/knotless-dev/knotless/internal/backoff"
)

// Options configure a Provider.
type Options struct {
	// Scheme must hold the kcp apis group and every kind a controller reads.
	Scheme *runtime.Scheme
	// Probe decides whether a virtual workspace URL serves. Defaults to
	// ProbeVirtualWorkspace.
	Probe ProbeFunc
	// Backoff bounds the restarts of the export's provider.
	Backoff backoff.Backoff
}

// Provider engages the workspaces bound to one APIExport.
type Provider struct {
	*exportProvider
}

var (
	_ multicluster.Provider         = &Provider{}
	_ multicluster.ProviderRunnable = &Provider{}
)

// New returns a Provider for the named APIExport (which is also the name
// of its APIExportEndpointSlice, as kcp creates it). cfg must point at the
// provider workspace.
func New(cfg *rest.Config, export string, opts Options) (*Provider, error) {
	if opts.Scheme == nil {
		return nil, fmt.Errorf("engage: a scheme is required")
	}
	if export == "" {
		return nil, fmt.Errorf("engage: an export name is required")
	}
	if opts.Probe == nil {
		opts.Probe = ProbeVirtualWorkspace
	}
	ep, err := newExportProvider(cfg, export, opts)
	if err != nil {
		return nil, err
	}
	return &Provider{exportProvider: ep}, nil
}

// Start runs the export's provider until ctx ends.
func (p *Provider) Start(ctx context.Context, aware multicluster.Aware) error {
	return p.exportProvider.Start(ctx, aware)
}
