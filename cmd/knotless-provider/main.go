// Command knotless-provider bootstraps the provider workspace in kcp and
// runs the multicluster manager that reconciles every workspace bound to
// knotless's APIExports.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/go-logr/logr"
	"github.com/kcp-dev/logicalcluster/v3"
	apisv1alpha1 "github.com/kcp-dev/sdk/apis/apis/v1alpha1"
	kcpclientset "github.com/kcp-dev/sdk/client/clientset/versioned/cluster"
	"github.com/prometheus/client_golang/prometheus"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"

	"github.com/knotless-dev/knotless/apis"
	"github.com/knotless-dev/knotless/controllers/application"
	"github.com/knotless-dev/knotless/controllers/atprotorecord"
	"github.com/knotless-dev/knotless/controllers/atprotorecordwatch"
	"github.com/knotless-dev/knotless/controllers/atprotorepo"
	"github.com/knotless-dev/knotless/controllers/component"
	"github.com/knotless-dev/knotless/controllers/tenantcluster"
	"github.com/knotless-dev/knotless/exports"
	"github.com/knotless-dev/knotless/internal/bootstrap"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/repoconn"
	"github.com/knotless-dev/knotless/internal/vault"
	"github.com/knotless-dev/knotless/mountproxy"
	"github.com/knotless-dev/knotless/workspacetypes"
)

type options struct {
	kubeconfig      string
	kubecontext     string
	workspace       string
	metricsAddr     string
	probeAddr       string
	pprofAddr       string
	connectTimeout  time.Duration
	shutdownTimeout time.Duration
	bootstrapOnly   bool
	atprotoResync   time.Duration
	atprotoWorkers  int
	atprotoMaxBatch int
	plcURL          string
	watchFlush      time.Duration
	vault           vault.Config
	mount           mountOptions
	// allowedNetworks are the loopback/private ranges outbound
	// connections may reach (R18).
	allowedNetworks string
	// metricSources are the firehose sources whose host labels metrics.
	metricSources string
}

// mountOptions configure the TenantCluster controller's view of the shim.
type mountOptions struct {
	mountURL, shimURL         string
	caFile, certFile, keyFile string
	userHeader, groupHeader   string
	probeInterval             time.Duration
}

func main() {
	var o options
	fs := flag.NewFlagSet("knotless-provider", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of kcp (an admin of the provider workspace's parent)")
	fs.StringVar(&o.kubecontext, "context", "", "kubeconfig context (default: the current one)")
	fs.StringVar(&o.workspace, "workspace", "root:knotless", "path of the provider workspace, created if missing")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", "127.0.0.1:8080", "address of the metrics endpoint (0 disables it)")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", "127.0.0.1:8081", "address of /healthz and /readyz (0 disables them)")
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "0", "address of net/http/pprof (heap and goroutine profiles; 0 disables it)")
	fs.DurationVar(&o.connectTimeout, "connect-timeout", 20*time.Second, "how long to wait for kcp to answer at start-up")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long shutdown may take")
	fs.BoolVar(&o.bootstrapOnly, "bootstrap-only", false, "apply the provider workspace's objects and exit")
	fs.IntVar(&o.atprotoWorkers, "atproto-workers", 64, "concurrent AtprotoRecord reconciles; records of one repo that are reconciled at the same time share one applyWrites batch")
	fs.IntVar(&o.atprotoMaxBatch, "atproto-max-batch", pds.MaxWritesPerBatch, "most record writes per applyWrites batch (1 disables batching)")
	fs.DurationVar(&o.atprotoResync, "atproto-resync", 2*time.Minute, "how often a synced AtprotoRecord is read back from its PDS to catch changes made behind knotless's back")
	fs.StringVar(&o.plcURL, "plc-url", "https://plc.directory", "PLC directory that resolves did:plc identities (signing keys and PDS endpoints) for firehose verification")
	fs.DurationVar(&o.watchFlush, "watch-flush-interval", 2*time.Second, "how often an AtprotoRecordWatch's changed records and cursor are written to its status")
	fs.StringVar(&o.mount.shimURL, "mountproxy-url", "", "address of knotless-mountproxy (https://host:port) that TenantClusters are probed through; empty reports them MountProxyUnavailable")
	fs.StringVar(&o.mount.mountURL, "mount-url", "", "base of TenantCluster status.URL: where kcp's clients reach the shim's /tenants/ path (kcp-front-proxy's mapping for it); default: the kubeconfig's server")
	fs.StringVar(&o.mount.caFile, "mountproxy-ca-file", "", "CA bundle that verifies knotless-mountproxy's serving certificate (reloaded on change)")
	fs.StringVar(&o.mount.certFile, "mountproxy-client-cert-file", "", "client certificate of the probe, issued by the shim's requestheader CA (reloaded on change)")
	fs.StringVar(&o.mount.keyFile, "mountproxy-client-key-file", "", "key of --mountproxy-client-cert-file")
	fs.StringVar(&o.mount.userHeader, "mountproxy-user-header", "", "the shim's user header (its --requestheader-username-headers); required with --mountproxy-url")
	fs.StringVar(&o.mount.groupHeader, "mountproxy-group-header", "", "the shim's group header (its --requestheader-group-headers); required with --mountproxy-url")
	fs.DurationVar(&o.mount.probeInterval, "tenant-probe-interval", 30*time.Second, "how often a TenantCluster's tenant is probed through the shim")
	fs.StringVar(&o.allowedNetworks, "allow-private-networks", "", "comma-separated loopback/private CIDR ranges (or addresses) that PDS and firehose connections may reach, and where plain http may carry credentials; empty allows public addresses only (link-local and metadata addresses, kcp's and the mount proxy's are never reached)")
	fs.StringVar(&o.metricSources, "firehose-metric-sources", "", "comma-separated host or host:port of firehose sources whose metrics carry their own source label; every other source is labelled \"other\" (metric labels come from a bounded set)")
	vault.BindFlags(fs, &o.vault)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "knotless-provider: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	logger := ctrl.Log.WithName("knotless-provider")
	ws := logicalcluster.NewPath(o.workspace)
	if !ws.IsValid() {
		return fmt.Errorf("--workspace %q is not a valid workspace path", o.workspace)
	}
	if o.atprotoWorkers < 1 || o.atprotoMaxBatch < 1 || o.atprotoMaxBatch > pds.MaxWritesPerBatch || o.atprotoResync <= 0 {
		return fmt.Errorf("--atproto-workers must be at least 1, --atproto-max-batch between 1 and %d, --atproto-resync positive", pds.MaxWritesPerBatch)
	}
	if o.watchFlush <= 0 {
		return fmt.Errorf("--watch-flush-interval must be positive")
	}
	if _, err := firehose.NormalizeSource(o.plcURL); err != nil {
		return fmt.Errorf("--plc-url: %w", err)
	}
	prober, err := newProber(o.mount)
	if err != nil {
		return err
	}
	cfg, err := bootstrap.LoadConfig(o.kubeconfig, o.kubecontext)
	if err != nil {
		return err
	}
	policy, err := egressPolicy(ctx, o, cfg.Host)
	if err != nil {
		return err
	}
	// Per workspace: every engaged workspace gets its own client.
	cfg.QPS, cfg.Burst = 200, 400
	if err := bootstrap.WaitForKCP(ctx, cfg, o.connectTimeout); err != nil {
		return err
	}
	version := "devel"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	logger.Info("starting", "version", version, "kcp", cfg.Host, "workspace", ws.String())

	res, err := bootstrap.Run(ctx, bootstrap.Options{
		Config: cfg, Workspace: ws, Exports: exports.FS, WorkspaceTypes: workspacetypes.FS,
		Log: logger.WithName("bootstrap"),
	})
	if err != nil {
		return fmt.Errorf("bootstrap of %s: %w", ws, err)
	}
	if o.bootstrapOnly {
		return nil
	}

	wsCfg, err := bootstrap.ForWorkspace(cfg, ws)
	if err != nil {
		return err
	}
	scheme := apis.NewScheme()
	utilruntime.Must(apisv1alpha1.AddToScheme(scheme))
	if !slices.Equal(res.Exports, []string{apis.Export}) {
		return fmt.Errorf("the provider serves the one APIExport %s, but exports/ holds %v (run make generate)", apis.Export, res.Exports)
	}
	provider, err := engage.New(wsCfg, apis.Export, engage.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	mgr, err := mcmanager.New(wsCfg, provider, manager.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:  o.probeAddr,
		PprofBindAddress:        o.pprofAddr,
		GracefulShutdownTimeout: &o.shutdownTimeout,
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	vc, err := newVault(o.vault, logger)
	if err != nil {
		return err
	}
	if vc != nil {
		if err := mgr.GetLocalManager().Add(vc); err != nil {
			return err
		}
	}
	pool := &repoconn.Pool{Vault: vc, MaxBatch: o.atprotoMaxBatch, Policy: policy}
	if err := (&application.Reconciler{GetCluster: mgr.GetCluster}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the application controller: %w", err)
	}
	if err := (&component.Reconciler{GetCluster: mgr.GetCluster, Scheme: scheme}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the component controller: %w", err)
	}
	if err := (&atprotorepo.Reconciler{GetCluster: mgr.GetCluster, Pool: pool}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the atprotorepo controller: %w", err)
	}
	if err := (&atprotorecord.Reconciler{GetCluster: mgr.GetCluster, Pool: pool, Resync: o.atprotoResync, Workers: o.atprotoWorkers, Scheme: scheme}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the atprotorecord controller: %w", err)
	}
	hub, err := newHub(o.plcURL, policy, bootstrap.SplitList(o.metricSources), logger)
	if err != nil {
		return err
	}
	if err := mgr.GetLocalManager().Add(hub); err != nil {
		return err
	}
	if err := (&atprotorecordwatch.Reconciler{GetCluster: mgr.GetCluster, Hub: hub, FlushInterval: o.watchFlush}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the atprotorecordwatch controller: %w", err)
	}
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
	mountURL := o.mount.mountURL
	if mountURL == "" {
		mountURL = base
	}
	owner, err := bootstrap.OwnerAnnotation(ctx, cfg)
	if err != nil {
		return err
	}
	if err := (&tenantcluster.Reconciler{
		GetCluster: mgr.GetCluster, KCP: kcp, Prober: prober, MountURL: strings.TrimSuffix(mountURL, "/"), ProbeInterval: o.mount.probeInterval, Owner: owner,
	}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the tenantcluster controller: %w", err)
	}
	if err := registerMetrics(metrics.Registry, provider); err != nil {
		return err
	}
	if o.probeAddr != "0" {
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

// newProber returns the TenantCluster probe's client of the shim, or nil
// when no shim is configured.
func newProber(o mountOptions) (*tenantcluster.Prober, error) {
	if o.probeInterval <= 0 {
		return nil, errors.New("--tenant-probe-interval must be positive")
	}
	if o.shimURL == "" {
		if o.caFile != "" || o.certFile != "" || o.keyFile != "" {
			return nil, errors.New("--mountproxy-ca-file and --mountproxy-client-cert-file/-key-file need --mountproxy-url")
		}
		return nil, nil
	}
	u, err := url.Parse(o.shimURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("--mountproxy-url %q must be https://host:port", o.shimURL)
	}
	if o.caFile == "" || o.certFile == "" || o.keyFile == "" {
		return nil, errors.New("--mountproxy-url needs --mountproxy-ca-file, --mountproxy-client-cert-file and --mountproxy-client-key-file")
	}
	if err := mountproxy.ValidateHeaderName("--mountproxy-user-header", o.userHeader); err != nil {
		return nil, err
	}
	if err := mountproxy.ValidateHeaderName("--mountproxy-group-header", o.groupHeader); err != nil {
		return nil, err
	}
	tlsFiles, err := mountproxy.NewClientTLS(o.certFile, o.keyFile, o.caFile, 0)
	if err != nil {
		return nil, fmt.Errorf("mount proxy client TLS: %w", err)
	}
	return &tenantcluster.Prober{ShimURL: "https://" + u.Host, TLS: tlsFiles, UserHeader: o.userHeader, GroupHeader: o.groupHeader}, nil
}

// egressPolicy is the address policy of PDS and firehose connections: the
// operator's allowed ranges, and never kcp's own address or the mount
// proxy's (R18).
func egressPolicy(ctx context.Context, o options, kcpURL string) (*netpolicy.Policy, error) {
	allowed, err := netpolicy.ParsePrefixes(o.allowedNetworks)
	if err != nil {
		return nil, fmt.Errorf("--allow-private-networks: %w", err)
	}
	var reserved []netip.AddrPort
	for _, u := range []string{kcpURL, o.mount.shimURL, o.mount.mountURL} {
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
// resolve through plcURL, cached (1 h for found identities, 1 min for
// failures).
func newHub(plcURL string, policy *netpolicy.Policy, metricSources []string, logger logr.Logger) (*firehose.Hub, error) {
	base := &identity.BaseDirectory{
		PLCURL:                 plcURL,
		SkipHandleVerification: true,
		// did:web documents are fetched from hosts that firehose events
		// name, so DID resolution dials through the same policy and
		// follows no redirect (R18).
		HTTPClient: *pds.NewHTTPClient(policy, nil, 10*time.Second),
		UserAgent:  "knotless-provider",
	}
	dir := identity.NewCacheDirectory(base, 100_000, time.Hour, time.Minute, time.Minute)
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
