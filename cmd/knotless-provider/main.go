// Command knotless-provider bootstraps the provider workspace in kcp and
// runs the multicluster manager that reconciles every workspace bound to
// knotless's APIExports.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/go-logr/logr"
	"github.com/kcp-dev/logicalcluster/v3"
	"github.com/kcp-dev/multicluster-provider/initializingworkspaces"
	apisv1alpha1 "github.com/kcp-dev/sdk/apis/apis/v1alpha1"
	kcpcorev1alpha1 "github.com/kcp-dev/sdk/apis/core/v1alpha1"
	"github.com/kcp-dev/sdk/apis/tenancy/initialization"
	tenancyv1alpha1 "github.com/kcp-dev/sdk/apis/tenancy/v1alpha1"
	kcpclientset "github.com/kcp-dev/sdk/client/clientset/versioned/cluster"
	"github.com/prometheus/client_golang/prometheus"
	authorizationv1 "k8s.io/api/authorization/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"

	"github.com/knotless-dev/knotless/apis"
	"github.com/knotless-dev/knotless/cmd/internal/buildinfo"
	"github.com/knotless-dev/knotless/cmd/internal/flagcheck"
	"github.com/knotless-dev/knotless/cmd/knotless-provider/options"
	"github.com/knotless-dev/knotless/controllers/application"
	"github.com/knotless-dev/knotless/controllers/atprotorecord"
	"github.com/knotless-dev/knotless/controllers/atprotorecordwatch"
	"github.com/knotless-dev/knotless/controllers/atprotorepo"
	"github.com/knotless-dev/knotless/controllers/bidderworkspace"
	"github.com/knotless-dev/knotless/controllers/clientcertificate"
	"github.com/knotless-dev/knotless/controllers/component"
	"github.com/knotless-dev/knotless/controllers/marketbidder"
	"github.com/knotless-dev/knotless/controllers/marketidentity"
	"github.com/knotless-dev/knotless/controllers/marketnetwork"
	"github.com/knotless-dev/knotless/controllers/marketpresence"
	"github.com/knotless-dev/knotless/controllers/marketrequester"
	"github.com/knotless-dev/knotless/controllers/tenantcluster"
	"github.com/knotless-dev/knotless/deploy/agent"
	"github.com/knotless-dev/knotless/exports"
	"github.com/knotless-dev/knotless/internal/bootstrap"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/repoconn"
	"github.com/knotless-dev/knotless/internal/tenant"
	"github.com/knotless-dev/knotless/internal/tenantreach"
	"github.com/knotless-dev/knotless/internal/vault"
	"github.com/knotless-dev/knotless/mountproxy"
	"github.com/knotless-dev/knotless/workspacetypes"
)

func main() {
	o := options.NewOptions()
	fs := flag.NewFlagSet("knotless-provider", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	var args error
	if fs.NArg() > 0 {
		args = fmt.Errorf("unexpected argument %q (flags start with --)", fs.Arg(0))
	}
	if err := flagcheck.Join(args, o.Validate()); err != nil {
		fmt.Fprintf(os.Stderr, "knotless-provider: %v\n", err)
		os.Exit(1)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.Logs)))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop() // before os.Exit, which runs no deferred call
	if err != nil {
		fmt.Fprintf(os.Stderr, "knotless-provider: %v\n", err)
		os.Exit(1)
	}
}

// run starts the provider with validated options.
func run(ctx context.Context, o *options.Options) error {
	logger := ctrl.Log.WithName("knotless-provider")
	ws := logicalcluster.NewPath(o.Workspace)
	prober, err := newProber(o.Mount)
	if err != nil {
		return err
	}
	cfg, err := bootstrap.LoadConfig(o.Kubeconfig, o.Context)
	if err != nil {
		return err
	}
	policy, err := egressPolicy(ctx, o, cfg.Host)
	if err != nil {
		return err
	}
	// Per workspace: every engaged workspace gets its own client.
	cfg.QPS, cfg.Burst = 200, 400
	if err := bootstrap.WaitForKCP(ctx, cfg, o.ConnectTimeout); err != nil {
		return err
	}
	version, commit := buildinfo.Get()
	logger.Info("starting", "version", version, "commit", commit, "kcp", cfg.Host, "workspace", ws.String())

	res, err := bootstrap.Run(ctx, bootstrap.Options{
		Config: cfg, Workspace: ws, Exports: exports.FS, WorkspaceTypes: workspacetypes.FS,
		Log: logger.WithName("bootstrap"),
	})
	if err != nil {
		return fmt.Errorf("bootstrap of %s: %w", ws, err)
	}
	if o.BootstrapOnly {
		return nil
	}
	if !slices.Equal(res.Exports, []string{apis.Export}) {
		return fmt.Errorf("the provider serves the one APIExport %s, but exports/ holds %v (run make generate)", apis.Export, res.Exports)
	}

	scheme := apis.NewScheme()
	utilruntime.Must(apisv1alpha1.AddToScheme(scheme))
	mgr, provider, err := newManager(ctx, o, cfg, ws, scheme, logger)
	if err != nil {
		return err
	}
	mounts, err := marketMounts(ctx, mgr, scheme)
	if err != nil {
		return err
	}
	if err := setupControllers(ctx, mgr, o, scheme, policy, mounts, logger); err != nil {
		return err
	}
	if err := setupTenantCluster(ctx, mgr, o, cfg, prober, mounts); err != nil {
		return err
	}
	if err := setupBidderWorkspaces(ctx, mgr, o.ShutdownTimeout); err != nil {
		return err
	}
	if err := registerMetrics(metrics.Registry, provider); err != nil {
		return err
	}
	if o.HealthProbeBindAddress != "0" {
		if err := mgr.GetLocalManager().AddHealthzCheck("ping", func(*http.Request) error { return nil }); err != nil {
			return err
		}
		if err := mgr.GetLocalManager().AddReadyzCheck("ping", func(*http.Request) error { return nil }); err != nil {
			return err
		}
	}
	logger.Info("engaging workspaces", "exports", res.Exports)
	if err := mgr.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	logger.Info("stopped")
	return nil
}

// newManager returns the multicluster manager of the workspaces bound to
// the provider's APIExport (the provider workspace ws holds the export
// and, with leader election, the Lease).
func newManager(ctx context.Context, o *options.Options, cfg *rest.Config, ws logicalcluster.Path, scheme *k8sruntime.Scheme, logger logr.Logger) (mcmanager.Manager, *engage.Provider, error) {
	wsCfg, err := bootstrap.ForWorkspace(cfg, ws)
	if err != nil {
		return nil, nil, err
	}
	provider, err := engage.New(wsCfg, apis.Export, engage.Options{Scheme: scheme})
	if err != nil {
		return nil, nil, err
	}
	if o.PprofBindAddress != "" && o.PprofBindAddress != "0" {
		// Heap profiles fine enough to attribute a few KiB per workspace
		// (make bench-engage); the default samples every 512 KiB.
		runtime.MemProfileRate = 4096
	}
	le := o.LeaderElection
	if le.Enabled {
		if err := bootstrap.EnsureNamespace(ctx, wsCfg, le.Namespace); err != nil {
			return nil, nil, fmt.Errorf("the leader election Lease's namespace %s in %s: %w", le.Namespace, ws, err)
		}
		logger.Info("leader election: only the holder of the Lease reconciles", "lease", le.Namespace+"/"+le.ID, "workspace", ws.String())
	}
	mgr, err := mcmanager.New(wsCfg, provider, manager.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: o.MetricsBindAddress},
		HealthProbeBindAddress:  o.HealthProbeBindAddress,
		PprofBindAddress:        o.PprofBindAddress,
		GracefulShutdownTimeout: &o.ShutdownTimeout,
		LeaderElection:          le.Enabled,
		LeaderElectionID:        le.ID,
		LeaderElectionNamespace: le.Namespace,
		// A replica that stops gracefully hands the Lease over at once.
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &le.LeaseDuration,
		RenewDeadline:                 &le.RenewDeadline,
		RetryPeriod:                   &le.RetryPeriod,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("creating the manager: %w", err)
	}
	return mgr, provider, nil
}

// marketMounts is the client of the provider workspace's
// tenant.MarketNamespace (made here when missing), where the market
// keeps its mounts' credentials: uncached, it reads only what it is
// asked for.
func marketMounts(ctx context.Context, mgr mcmanager.Manager, scheme *k8sruntime.Scheme) (client.Client, error) {
	cfg := mgr.GetLocalManager().GetConfig()
	if err := bootstrap.EnsureNamespace(ctx, cfg, tenant.MarketNamespace); err != nil {
		return nil, fmt.Errorf("the namespace %s of the market's mount credentials: %w", tenant.MarketNamespace, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	// Credentials a contract or workspace left behind, going without the
	// market ending its mount, are deleted once their token has expired
	// (by the leader: a runnable of the manager).
	logger := mgr.GetLogger().WithName("mount-credentials")
	return c, mgr.GetLocalManager().Add(manager.RunnableFunc(func(ctx context.Context) error {
		for {
			if n, err := tenant.SweepMarket(ctx, c, time.Now(), mountSweepGrace); err != nil {
				logger.Error(err, "sweeping expired mount credentials")
			} else if n > 0 {
				logger.Info("expired mount credentials deleted", "count", n)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(mountSweepEvery):
			}
		}
	}))
}

// setupBidderWorkspaces runs the initializer of the market-bidder
// WorkspaceType (controllers/bidderworkspace: the agent's identity in
// every new bidder workspace) in a manager of its own, on kcp's
// initializingworkspaces virtual workspace of that type; the main
// manager runs it on the leader only.
func setupBidderWorkspaces(ctx context.Context, mgr mcmanager.Manager, shutdown time.Duration) error {
	cfg := mgr.GetLocalManager().GetConfig()
	scheme := k8sruntime.NewScheme()
	utilruntime.Must(kcpcorev1alpha1.AddToScheme(scheme))
	utilruntime.Must(tenancyv1alpha1.AddToScheme(scheme))
	utilruntime.Must(authorizationv1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	wst := &tenancyv1alpha1.WorkspaceType{}
	if err := c.Get(ctx, client.ObjectKey{Name: bidderworkspace.WorkspaceType}, wst); err != nil {
		return fmt.Errorf("the WorkspaceType %s: %w", bidderworkspace.WorkspaceType, err)
	}
	// Without it the virtual workspace refuses every watch, and new bidder
	// workspaces would stay Initializing with no word of why.
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
		Group: tenancyv1alpha1.SchemeGroupVersion.Group, Resource: "workspacetypes", Name: wst.Name, Verb: "initialize"}}}
	if err := c.Create(ctx, review); err != nil {
		return fmt.Errorf("checking that the provider may initialize the WorkspaceType %s: %w", wst.Name, err)
	}
	if !review.Status.Allowed {
		return fmt.Errorf("the provider may not initialize the WorkspaceType %s: give its identity the verb initialize on workspacetypes %s in the provider workspace (docs/install.md)", wst.Name, wst.Name)
	}
	objs, err := bootstrap.Decode(bytes.NewReader(agent.RBAC))
	if err != nil {
		return fmt.Errorf("deploy/agent/rbac.yaml: %w", err)
	}
	// The provider's own log of each LogicalCluster carries its owner:
	// debug level only.
	providerLog := mgr.GetLogger().WithName("bidderworkspace-provider").V(1)
	p, err := initializingworkspaces.New(cfg, wst.Name, initializingworkspaces.Options{Scheme: scheme, Log: &providerLog})
	if err != nil {
		return err
	}
	im, err := mcmanager.New(cfg, p, manager.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		GracefulShutdownTimeout: &shutdown})
	if err != nil {
		return err
	}
	if err := (&bidderworkspace.Reconciler{GetCluster: im.GetCluster, Initializer: initialization.InitializerForType(wst), Objects: objs}).SetupWithManager(im); err != nil {
		return fmt.Errorf("setting up the bidderworkspace controller: %w", err)
	}
	// A function, not the manager itself: a runnable with a cache would
	// run on every replica.
	return mgr.GetLocalManager().Add(manager.RunnableFunc(im.Start))
}

// A mount's credential whose token expired mountSweepGrace ago is
// deleted, looked for every mountSweepEvery: a live contract's is
// renewed 4 minutes before its token ends (and minted anew if it goes).
const (
	mountSweepEvery = 10 * time.Minute
	mountSweepGrace = 10 * time.Minute
)

// setupControllers registers the provider's controllers but tenantcluster
// (docs/controllers.md), with what they share: the Vault client, the DID
// directory, the pool of repo clients and the firehose hub.
func setupControllers(ctx context.Context, mgr mcmanager.Manager, o *options.Options, scheme *k8sruntime.Scheme, policy *netpolicy.Policy, mounts client.Client, logger logr.Logger) error {
	vc, err := newVault(o.Vault, logger)
	if err != nil {
		return err
	}
	if vc != nil {
		if err := mgr.GetLocalManager().Add(vc); err != nil {
			return err
		}
	}
	// One DID directory for repos (R20) and firehose verification, through
	// the dial policy, bounded (pds.MaxDIDDocument) and cached.
	dir := pds.NewDirectory(o.PLCURL, policy, 10*time.Second, time.Hour)
	writeLatency := pds.NewWriteLatency()
	if err := metrics.Registry.Register(writeLatency); err != nil {
		return fmt.Errorf("registering the PDS write metrics: %w", err)
	}
	pool := &repoconn.Pool{Vault: vc, MaxBatch: o.AtprotoMaxBatch, Policy: policy, Directory: dir, WriteLatency: writeLatency}
	if err := (&application.Reconciler{GetCluster: mgr.GetCluster}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the application controller: %w", err)
	}
	if err := (&component.Reconciler{GetCluster: mgr.GetCluster, Scheme: scheme}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the component controller: %w", err)
	}
	if err := (&atprotorepo.Reconciler{GetCluster: mgr.GetCluster, Pool: pool, Scheme: scheme}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the atprotorepo controller: %w", err)
	}
	if err := (&atprotorecord.Reconciler{GetCluster: mgr.GetCluster, Pool: pool, Resync: o.AtprotoResync, Workers: o.AtprotoWorkers, Scheme: scheme}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the atprotorecord controller: %w", err)
	}
	hub, err := newHub(dir, policy, bootstrap.SplitList(o.FirehoseMetricSources), logger)
	if err != nil {
		return err
	}
	if err := mgr.GetLocalManager().Add(hub); err != nil {
		return err
	}
	if err := (&atprotorecordwatch.Reconciler{GetCluster: mgr.GetCluster, Hub: hub, FlushInterval: o.WatchFlushInterval}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the atprotorecordwatch controller: %w", err)
	}
	reaches, err := setupMarket(ctx, mgr, scheme, pool, hub, policy, mounts, o.AtprotoResync)
	if err != nil {
		return err
	}
	if err := setupGateways(ctx, mgr, o.GatewayCAFile, pool, policy, reaches); err != nil {
		return err
	}
	return setupGuests(ctx, mgr, o.Guest, mounts, reaches)
}

// setupTenantCluster registers the tenantcluster controller: its kcp
// client creates the mounted workspaces, its prober asks the mount proxy
// about each tenant.
func setupTenantCluster(ctx context.Context, mgr mcmanager.Manager, o *options.Options, cfg *rest.Config, prober *tenantcluster.Prober, mounts client.Reader) error {
	// The cluster-aware client adds /clusters/<workspace> to the server's
	// base URL.
	base, err := bootstrap.BaseURL(cfg.Host)
	if err != nil {
		return err
	}
	baseCfg := rest.CopyConfig(cfg)
	baseCfg.Host = base
	kcp, err := kcpclientset.NewForConfig(baseCfg)
	if err != nil {
		return err
	}
	mountURL := o.Mount.MountURL
	if mountURL == "" {
		mountURL = base
	}
	owner, err := bootstrap.OwnerAnnotation(ctx, cfg)
	if err != nil {
		return err
	}
	if err := (&tenantcluster.Reconciler{
		GetCluster: mgr.GetCluster, KCP: kcp, Prober: prober, MountURL: strings.TrimSuffix(mountURL, "/"), ProbeInterval: o.Mount.ProbeInterval, Owner: owner, Market: mounts,
	}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the tenantcluster controller: %w", err)
	}
	return nil
}

// newProber returns the TenantCluster probe's client of the shim, or nil
// when no shim is configured. o is validated.
func newProber(o options.MountOptions) (*tenantcluster.Prober, error) {
	if o.ProxyURL == "" {
		return nil, nil
	}
	u, err := url.Parse(o.ProxyURL)
	if err != nil {
		return nil, errors.New("--mountproxy-url is not a URL")
	}
	tlsFiles, err := mountproxy.NewClientTLS(o.ClientCertFile, o.ClientKeyFile, o.CAFile, 0)
	if err != nil {
		return nil, fmt.Errorf("mount proxy client TLS: %w", err)
	}
	return &tenantcluster.Prober{ShimURL: "https://" + u.Host, TLS: tlsFiles, UserHeader: o.UserHeader, GroupHeader: o.GroupHeader}, nil
}

// egressPolicy is the address policy of PDS and firehose connections: the
// operator's allowed ranges, and never kcp's own address or the mount
// proxy's (R18).
func egressPolicy(ctx context.Context, o *options.Options, kcpURL string) (*netpolicy.Policy, error) {
	allowed, err := netpolicy.ParsePrefixes(o.AllowPrivateNetworks)
	if err != nil {
		return nil, fmt.Errorf("--allow-private-networks: %w", err)
	}
	var reserved []netip.AddrPort
	for _, u := range []string{kcpURL, o.Mount.ProxyURL, o.Mount.MountURL} {
		if u == "" {
			continue
		}
		addrs, err := netpolicy.Resolve(ctx, u)
		if err != nil {
			return nil, fmt.Errorf("reserving kcp's and the mount proxy's addresses: %w", err)
		}
		reserved = append(reserved, addrs...)
	}
	return netpolicy.New(allowed, reserved), nil
}

// newHub returns the firehose hub shared by every AtprotoRecordWatch. DIDs
// resolve through dir (pds.NewDirectory: did:web documents are fetched
// from hosts that firehose events name, so DID resolution dials through
// the same policy and follows no redirect, R18).
func newHub(dir identity.Directory, policy *netpolicy.Policy, metricSources []string, logger logr.Logger) (*firehose.Hub, error) {
	m, err := firehose.NewMetrics(metrics.Registry)
	if err != nil {
		return nil, err
	}
	return firehose.NewHub(firehose.Options{Directory: dir, Metrics: m, Log: logger.WithName("firehose"), Policy: policy, MetricSources: metricSources})
}

// newVault connects to Vault when --vault-address is set.
func newVault(cfg vault.Config, logger logr.Logger) (*vault.Client, error) {
	if !cfg.Enabled() {
		logger.Info("no Vault connection: credentials that reference Vault are reported as VaultUnavailable")
		return nil, nil
	}
	m, err := vault.NewMetrics(metrics.Registry)
	if err != nil {
		return nil, err
	}
	vc, err := vault.New(cfg, vault.WithLogger(logger.WithName("vault")), vault.WithMetrics(m))
	if err != nil {
		return nil, fmt.Errorf("vault: %w", err)
	}
	logger.Info("Vault connection configured", "address", cfg.Address, "prefix", vc.Prefix())
	return vc, nil
}

// setupMarket registers the market controllers and their metric.
func setupMarket(ctx context.Context, mgr mcmanager.Manager, scheme *k8sruntime.Scheme, pool *repoconn.Pool, hub *firehose.Hub, policy *netpolicy.Policy, mounts client.Client, resync time.Duration) (*tenantreach.Registry, error) {
	invalid := prometheus.NewCounter(prometheus.CounterOpts{
		Name:        "knotless_market_invalid_records_total",
		Help:        "Market records read from firehoses that did not match their lexicon and were ignored.",
		ConstLabels: prometheus.Labels{"collection": lexicon.Association},
	})
	if err := metrics.Registry.Register(invalid); err != nil {
		return nil, err
	}
	steps := market.NewStepSeconds()
	if err := metrics.Registry.Register(steps); err != nil {
		return nil, fmt.Errorf("registering the market step metrics: %w", err)
	}
	if err := (&marketnetwork.Reconciler{GetCluster: mgr.GetCluster}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the marketnetwork controller: %w", err)
	}
	if err := (&marketidentity.Reconciler{GetCluster: mgr.GetCluster, Pool: pool, Hub: hub, Resync: resync, Invalid: invalid}).SetupWithManager(ctx, mgr); err != nil {
		return nil, fmt.Errorf("setting up the marketidentity controller: %w", err)
	}
	feeds, err := market.NewFeeds(hub, market.FeedsOptions{Registry: metrics.Registry, Log: mgr.GetLogger().WithName("market-feeds")})
	if err != nil {
		return nil, err
	}
	if err := mgr.GetLocalManager().Add(feeds); err != nil {
		return nil, err
	}
	if err := (&marketbidder.Reconciler{
		GetCluster: mgr.GetCluster, Pool: pool, Market: feeds, Source: feeds.Source(market.RoleBidder),
		Inventories: &market.Inventories{TTL: resync}, Resync: resync, StepSeconds: steps,
	}).SetupWithManager(ctx, mgr); err != nil {
		return nil, fmt.Errorf("setting up the marketbidder controller: %w", err)
	}
	// The requester's side publishes how it reaches each mounted tenant for
	// the controllers that act on that tenant as the requester.
	reaches := &tenantreach.Registry{}
	if err := (&marketrequester.Reconciler{
		GetCluster: mgr.GetCluster, Pool: pool, Market: feeds, Source: feeds.Source(market.RoleRequester), Scheme: scheme,
		Inventories: &market.Inventories{TTL: resync}, Resync: resync, StepSeconds: steps, Policy: policy, Mounts: mounts, Reaches: reaches,
	}).SetupWithManager(ctx, mgr); err != nil {
		return nil, fmt.Errorf("setting up the marketrequester controller: %w", err)
	}
	if err := (&clientcertificate.Reconciler{GetCluster: mgr.GetCluster, Scheme: scheme, Reaches: reaches}).SetupWithManager(ctx, mgr); err != nil {
		return nil, fmt.Errorf("setting up the clientcertificate controller: %w", err)
	}
	if err := (&marketpresence.Reconciler{GetCluster: mgr.GetCluster, Pool: pool, Resync: resync}).SetupWithManager(ctx, mgr); err != nil {
		return nil, fmt.Errorf("setting up the marketpresence controller: %w", err)
	}
	return reaches, nil
}

// registerMetrics adds the engaged-workspace gauge and the provider
// restart counter.
func registerMetrics(reg prometheus.Registerer, p *engage.Provider) error {
	labels := prometheus.Labels{"export": apis.Export}
	if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "knotless_engaged_workspaces", Help: "Workspaces engaged through the APIExport.", ConstLabels: labels,
	}, func() float64 { return float64(p.Engaged()) })); err != nil {
		return err
	}
	return reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "knotless_engage_restarts_total", Help: "Restarts of the APIExport's provider after an endpoint that did not serve.", ConstLabels: labels,
	}, func() float64 { return float64(p.Restarts()) }))
}
