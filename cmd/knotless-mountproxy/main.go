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
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
	apisv1alpha1 "github.com/kcp-dev/sdk/apis/apis/v1alpha1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"

	"github.com/knotless-dev/knotless/apis"
	"github.com/knotless-dev/knotless/controllers/mountregistry"
	"github.com/knotless-dev/knotless/internal/bootstrap"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/mountproxy"
)

type options struct {
	kubeconfig, kubecontext, workspace string
	bindAddress                        string
	files                              mountproxy.Files
	allowedNames, probeNames           string
	headers                            mountproxy.Headers
	allowedNetworks, reserved          string
	authz                              mountproxy.SAROptions
	responseHeaderTimeout              time.Duration
	pathPrefix                         string
	metricsAddr, probeAddr             string
	connectTimeout, shutdownTimeout    time.Duration
}

func main() {
	var o options
	fs := flag.NewFlagSet("knotless-mountproxy", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of kcp (an admin of the provider workspace)")
	fs.StringVar(&o.kubecontext, "context", "", "kubeconfig context (default: the current one)")
	fs.StringVar(&o.workspace, "workspace", "root:knotless", "path of the provider workspace that holds the "+apis.Export+" APIExport")
	fs.StringVar(&o.bindAddress, "bind-address", "127.0.0.1:9443", "address the shim serves HTTPS on")
	fs.StringVar(&o.files.ServingCert, "tls-cert-file", "", "serving certificate, issued by the CA kcp-front-proxy's mapping names as backend_server_ca (reloaded on change)")
	fs.StringVar(&o.files.ServingKey, "tls-private-key-file", "", "key of --tls-cert-file")
	fs.StringVar(&o.files.RequestHeaderCA, "requestheader-client-ca-file", "", "CA that issued kcp-front-proxy's proxy client certificate and the provider's probe certificate (reloaded on change)")
	fs.StringVar(&o.allowedNames, "requestheader-allowed-names", "kcp-front-proxy,knotless-probe", "comma-separated common names of client certificates that may assert identities (empty: any the CA issued)")
	fs.StringVar(&o.probeNames, "probe-client-names", "knotless-probe", "comma-separated common names of the provider's probe certificates: they may only read /version as "+mountproxy.ProbeUser)
	fs.StringVar(&o.headers.User, "requestheader-username-headers", "", "header with the caller's user name (kcp-front-proxy's mapping user_header); required, a name callers cannot guess (docs/mountproxy.md)")
	fs.StringVar(&o.headers.Group, "requestheader-group-headers", "", "header with the caller's groups (the mapping's group_header); required, unguessable")
	fs.StringVar(&o.headers.ExtraPrefix, "requestheader-extra-headers-prefix", "", "prefix of headers with the caller's extra attributes (the mapping's extra_header_prefix); required, unguessable")
	fs.StringVar(&o.allowedNetworks, "allow-private-networks", "", "comma-separated loopback/private CIDR ranges (or addresses) tenants may be reached at; empty allows public addresses only (link-local and metadata addresses are never reached)")
	fs.StringVar(&o.reserved, "reserved-addresses", "", "comma-separated URLs or host:port that tenants may never be (kcp-front-proxy's, other kcp endpoints); kcp's kubeconfig server and the shim's own address are always reserved")
	fs.DurationVar(&o.authz.AllowTTL, "authorization-cache-ttl", 10*time.Second, "how long kcp's answer that a caller may enter a workspace is reused")
	fs.DurationVar(&o.authz.DenyTTL, "authorization-cache-denied-ttl", 5*time.Second, "how long kcp's refusal is reused")
	fs.IntVar(&o.authz.Size, "authorization-cache-size", 10000, "most authorization answers kept")
	fs.DurationVar(&o.responseHeaderTimeout, "tenant-response-header-timeout", 60*time.Second, "how long a tenant may take to send response headers")
	fs.StringVar(&o.pathPrefix, "path-prefix", "/tenants/", "path prefix of tenant routes: <prefix><logical cluster>/<name>/...")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", "127.0.0.1:8090", "address of the metrics endpoint (0 disables it)")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", "127.0.0.1:8091", "address of /healthz and /readyz (0 disables them)")
	fs.DurationVar(&o.connectTimeout, "connect-timeout", 20*time.Second, "how long to wait for kcp to answer at start-up")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long shutdown may take")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "knotless-mountproxy: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	logger := ctrl.Log.WithName("knotless-mountproxy")
	ws := logicalcluster.NewPath(o.workspace)
	if !ws.IsValid() {
		return fmt.Errorf("--workspace %q is not a valid workspace path", o.workspace)
	}
	if o.files.ServingCert == "" || o.files.ServingKey == "" || o.files.RequestHeaderCA == "" {
		return errors.New("--tls-cert-file, --tls-private-key-file and --requestheader-client-ca-file are required")
	}
	if err := o.headers.Validate(); err != nil {
		return fmt.Errorf("--requestheader-*-headers: %w", err)
	}
	if o.authz.AllowTTL <= 0 || o.authz.DenyTTL <= 0 || o.authz.Size <= 0 || o.responseHeaderTimeout <= 0 {
		return errors.New("--authorization-cache-ttl, --authorization-cache-denied-ttl, --authorization-cache-size and --tenant-response-header-timeout must be positive")
	}
	names, probes := bootstrap.SplitList(o.allowedNames), bootstrap.SplitList(o.probeNames)
	allowed, err := netpolicy.ParsePrefixes(o.allowedNetworks)
	if err != nil {
		return fmt.Errorf("--allow-private-networks: %w", err)
	}
	cfg, err := bootstrap.LoadConfig(o.kubeconfig, o.kubecontext)
	if err != nil {
		return err
	}
	// Tenants are never kcp itself, kcp-front-proxy or the shim (R18).
	var reserved []netip.AddrPort
	for _, target := range append([]string{cfg.Host, o.bindAddress}, bootstrap.SplitList(o.reserved)...) {
		addrs, err := netpolicy.Resolve(ctx, target)
		if err != nil {
			return fmt.Errorf("--reserved-addresses: %w", err)
		}
		reserved = append(reserved, addrs...)
	}
	registry := mountproxy.NewRegistry(ctx, mountproxy.RegistryOptions{Policy: netpolicy.New(allowed, reserved), ResponseHeaderTimeout: o.responseHeaderTimeout})
	base, err := bootstrap.BaseURL(cfg.Host)
	if err != nil {
		return err
	}
	baseCfg := rest.CopyConfig(cfg)
	baseCfg.Host = base
	authz, err := mountproxy.NewSARAuthorizer(baseCfg, o.authz)
	if err != nil {
		return err
	}
	shim, err := mountproxy.New(mountproxy.Options{
		Files: o.files, AllowedNames: names, ProbeNames: probes, PathPrefix: o.pathPrefix, Registry: registry, Authorizer: authz,
		Headers: o.headers, Registerer: metrics.Registry, Log: logger.WithName("shim"),
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.bindAddress)
	if err != nil {
		return fmt.Errorf("--bind-address: %w", err)
	}
	defer ln.Close()

	if err := bootstrap.WaitForKCP(ctx, cfg, o.connectTimeout); err != nil {
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
		Metrics:                 metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:  o.probeAddr,
		GracefulShutdownTimeout: &o.shutdownTimeout,
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	if err := (&mountregistry.Reconciler{GetCluster: mgr.GetCluster, Registry: registry}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the registry controller: %w", err)
	}
	// The shim's listener is a runnable of the manager: it starts and is
	// joined with it (R10).
	if err := mgr.GetLocalManager().Add(manager.RunnableFunc(func(ctx context.Context) error {
		logger.Info("serving", "address", ln.Addr().String(), "prefix", o.pathPrefix, "allowedNames", names)
		return shim.Serve(ctx, ln)
	})); err != nil {
		return err
	}
	if o.probeAddr != "0" {
		ok := func(*http.Request) error { return nil }
		if err := mgr.GetLocalManager().AddHealthzCheck("ping", ok); err != nil {
			return err
		}
		if err := mgr.GetLocalManager().AddReadyzCheck("ping", ok); err != nil {
			return err
		}
	}
	logger.Info("reading TenantClusters", "workspace", ws.String(), "export", apis.Export, "allowedNetworks", o.allowedNetworks, "reservedAddresses", len(reserved))
	if err := mgr.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	logger.Info("stopped")
	return nil
}
