// Command knotless-mountproxy is the shim between kcp and tenant
// apiservers (rule R16): it serves the mount paths kcp-front-proxy forwards
// mounted workspaces' requests to, and keeps its tenants equal to the
// TenantClusters it reads through the provider's APIExport.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/kcp-dev/logicalcluster/v3"
	apisv1alpha1 "github.com/kcp-dev/sdk/apis/apis/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"

	"github.com/knotless-dev/knotless/apis"
	"github.com/knotless-dev/knotless/cmd/internal/buildinfo"
	"github.com/knotless-dev/knotless/cmd/internal/flagcheck"
	"github.com/knotless-dev/knotless/cmd/knotless-mountproxy/options"
	"github.com/knotless-dev/knotless/controllers/mountregistry"
	"github.com/knotless-dev/knotless/internal/bootstrap"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/tenant"
	"github.com/knotless-dev/knotless/mountproxy"
)

func main() {
	o := options.NewOptions()
	fs := flag.NewFlagSet("knotless-mountproxy", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	var args error
	if fs.NArg() > 0 {
		args = fmt.Errorf("unexpected argument %q (flags start with --)", fs.Arg(0))
	}
	if err := flagcheck.Join(args, o.Validate()); err != nil {
		fmt.Fprintf(os.Stderr, "knotless-mountproxy: %v\n", err)
		os.Exit(1)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.Logs)))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop() // before os.Exit, which runs no deferred call
	if err != nil {
		fmt.Fprintf(os.Stderr, "knotless-mountproxy: %v\n", err)
		os.Exit(1)
	}
}

// run starts the shim with validated options.
func run(ctx context.Context, o *options.Options) error {
	logger := ctrl.Log.WithName("knotless-mountproxy")
	ws := logicalcluster.NewPath(o.Workspace)
	allowed, err := netpolicy.ParsePrefixes(o.AllowPrivateNetworks)
	if err != nil {
		return fmt.Errorf("--allow-private-networks: %w", err)
	}
	cfg, err := bootstrap.LoadConfig(o.Kubeconfig, o.Context)
	if err != nil {
		return err
	}
	policy, reserved, err := addressPolicy(ctx, o, cfg, allowed)
	if err != nil {
		return err
	}
	registry := mountproxy.NewRegistry(ctx, mountproxy.RegistryOptions{Policy: policy, ResponseHeaderTimeout: o.TenantResponseHeaderTimeout})
	shim, err := newShim(o, cfg, registry, logger)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.BindAddress)
	if err != nil {
		return fmt.Errorf("--bind-address: %w", err)
	}
	defer ln.Close()

	if err := bootstrap.WaitForKCP(ctx, cfg, o.ConnectTimeout); err != nil {
		return err
	}
	wsCfg, err := bootstrap.ForWorkspace(cfg, ws)
	if err != nil {
		return err
	}
	scheme := apis.NewScheme()
	utilruntime.Must(apisv1alpha1.AddToScheme(scheme))
	provider, err := engage.New(wsCfg, apis.Export, engage.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	mgr, err := mcmanager.New(wsCfg, provider, manager.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: o.MetricsBindAddress},
		HealthProbeBindAddress:  o.HealthProbeBindAddress,
		GracefulShutdownTimeout: &o.ShutdownTimeout,
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	// Ready only once the registry has read every TenantCluster, so a
	// replica never refuses tenants it has not read yet.
	readiness := mountregistry.NewReadiness()
	market, err := marketCache(ctx, mgr, wsCfg, scheme)
	if err != nil {
		return err
	}
	if err := (&mountregistry.Reconciler{GetCluster: mgr.GetCluster, Registry: registry, Readiness: readiness, Market: market, MarketSource: mountregistry.MarketSource(market)}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the registry controller: %w", err)
	}
	if err := mgr.GetLocalManager().Add(&mountregistry.InitialList{
		Config: wsCfg, Client: mgr.GetLocalManager().GetAPIReader(), Export: apis.Export, Readiness: readiness, Log: logger.WithName("initial-list"),
	}); err != nil {
		return err
	}
	// The shim's listener is a runnable of the manager: it starts and is
	// joined with it (R10).
	if err := mgr.GetLocalManager().Add(manager.RunnableFunc(func(ctx context.Context) error {
		logger.Info("serving", "address", ln.Addr().String(), "prefix", o.PathPrefix, "allowedNames", bootstrap.SplitList(o.RequestHeaderAllowedNames))
		return shim.Serve(ctx, ln)
	})); err != nil {
		return err
	}
	if o.HealthProbeBindAddress != "0" {
		ok := func(*http.Request) error { return nil }
		if err := mgr.GetLocalManager().AddHealthzCheck("ping", ok); err != nil {
			return err
		}
		if err := mgr.GetLocalManager().AddReadyzCheck("tenantclusters", readiness.Check); err != nil {
			return err
		}
	}
	version, commit := buildinfo.Get()
	logger.Info("reading TenantClusters", "version", version, "commit", commit, "workspace", ws.String(), "export", apis.Export, "allowedNetworks", o.AllowPrivateNetworks, "reservedAddresses", reserved)
	if err := mgr.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	logger.Info("stopped")
	return nil
}

// addressPolicy is the tenants' address policy: private networks only as
// allowed (--allow-private-networks), and never kcp itself, kcp-front-proxy
// or the shim (R18). It returns how many addresses it reserves.
func addressPolicy(ctx context.Context, o *options.Options, cfg *rest.Config, allowed []netip.Prefix) (*netpolicy.Policy, int, error) {
	var reserved []netip.AddrPort
	for _, target := range append([]string{cfg.Host, o.BindAddress}, bootstrap.SplitList(o.ReservedAddresses)...) {
		addrs, err := netpolicy.Resolve(ctx, target)
		if err != nil {
			return nil, 0, fmt.Errorf("--reserved-addresses: %w", err)
		}
		reserved = append(reserved, addrs...)
	}
	return netpolicy.New(allowed, reserved), len(reserved), nil
}

// newShim returns the shim over registry, authorizing callers with
// SubjectAccessReviews in kcp.
func newShim(o *options.Options, cfg *rest.Config, registry *mountproxy.Registry, logger logr.Logger) (*mountproxy.Server, error) {
	base, err := bootstrap.BaseURL(cfg.Host)
	if err != nil {
		return nil, err
	}
	baseCfg := rest.CopyConfig(cfg)
	baseCfg.Host = base
	authz, err := mountproxy.NewSARAuthorizer(baseCfg, o.Authorization)
	if err != nil {
		return nil, err
	}
	return mountproxy.New(mountproxy.Options{
		Files: o.Files, AllowedNames: bootstrap.SplitList(o.RequestHeaderAllowedNames), ProbeNames: bootstrap.SplitList(o.ProbeClientNames),
		PathPrefix: o.PathPrefix, Registry: registry, Authorizer: authz,
		Headers: o.Headers, Registerer: metrics.Registry, Log: logger.WithName("shim"),
	})
}

// marketCache is the cache of the market contracts' mount credentials,
// which the provider keeps in its own workspace (cfg): the Secrets of
// tenant.MarketNamespace, read and watched, started with mgr. An identity
// that may not read them is told so at once, not after the cache's sync
// times out.
func marketCache(ctx context.Context, mgr mcmanager.Manager, cfg *rest.Config, scheme *k8sruntime.Scheme) (cache.Cache, error) {
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	if err := c.List(ctx, &corev1.SecretList{}, client.InNamespace(tenant.MarketNamespace), client.Limit(1)); err != nil {
		return nil, fmt.Errorf("listing the Secrets of namespace %s of the provider workspace, where the market mounts' credentials are kept (docs/install.md, identities and permissions): %w", tenant.MarketNamespace, err)
	}
	market, err := cache.New(cfg, cache.Options{Scheme: scheme, DefaultNamespaces: map[string]cache.Config{tenant.MarketNamespace: {}}})
	if err != nil {
		return nil, fmt.Errorf("the market credentials' cache: %w", err)
	}
	return market, mgr.GetLocalManager().Add(market)
}
