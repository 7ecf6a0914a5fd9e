// Command knotless-agent is what a bidder runs next to its machines. With
// a kubeconfig for its bidder workspace only (never the provider's), it
// runs that workspace's ComputeVMs, and the StateSyncs that export and
// import their tenants' objects, through a driver (the process driver:
// each VM a tenant apiserver process on this machine; with --node-image
// also the kind driver: each VM a single-node Kubernetes cluster in a
// docker container) and nothing else; with --gateway-address it also
// serves the requesters' Gateway hostnames to their tenants' Services,
// and with --ssh-address SSH sessions into their pods.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/go-logr/logr"
	"golang.org/x/crypto/ssh"
	"golang.org/x/net/netutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/knotless-dev/knotless/apis"
	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/cmd/internal/buildinfo"
	"github.com/knotless-dev/knotless/cmd/internal/flagcheck"
	"github.com/knotless-dev/knotless/cmd/knotless-agent/options"
	"github.com/knotless-dev/knotless/controllers/computevm"
	"github.com/knotless-dev/knotless/controllers/statesync"
	"github.com/knotless-dev/knotless/internal/bootstrap"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/driver/kind"
	"github.com/knotless-dev/knotless/internal/driver/process"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/serviceauth"
)

func main() {
	o := options.NewOptions()
	fs := flag.NewFlagSet("knotless-agent", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	var args error
	if fs.NArg() > 0 {
		args = fmt.Errorf("unexpected argument %q (flags start with --)", fs.Arg(0))
	}
	if err := flagcheck.Join(args, o.Validate()); err != nil {
		fmt.Fprintf(os.Stderr, "knotless-agent: %v\n", err)
		os.Exit(1)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.Logs)))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop() // before os.Exit, which runs no deferred call
	if err != nil {
		fmt.Fprintf(os.Stderr, "knotless-agent: %v\n", err)
		os.Exit(1)
	}
}

// cacheOptions cache only the Secrets the agent reads or writes (the VMs'
// credentials, the snapshots' chunks: computev1alpha1.LabelAgent), not
// every Secret of the workspace.
func cacheOptions() cache.Options {
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Label: labels.SelectorFromSet(labels.Set{computev1alpha1.LabelAgent: "true"})},
	}}
}

func run(ctx context.Context, o *options.Options) error {
	logger := ctrl.Log.WithName("knotless-agent")
	cfg, err := bootstrap.LoadConfig(o.Kubeconfig, o.Context)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.ProcessRoot, 0o700); err != nil {
		return fmt.Errorf("--process-root: %w", err)
	}
	version, commit := buildinfo.Get()
	logger.Info("starting", "version", version, "commit", commit, "workspace", cfg.Host, "processRoot", o.ProcessRoot, "kcp", o.KCPPath())
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Scheme:                 apis.NewScheme(),
		Cache:                  cacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: o.MetricsBindAddress},
		HealthProbeBindAddress: o.HealthProbeBindAddress,
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	grants := &serviceauth.Grants{}
	allowed, _ := netpolicy.ParsePrefixes(o.AllowPrivateNetworks) // Validate checked it
	policy := netpolicy.New(allowed, nil)
	dir := pds.NewDirectory(o.PLCURL, policy, 10*time.Second, serviceauth.DocumentTTL)
	webhook, err := serveWebhook(ctx, mgr, o, grants, dir)
	if err != nil {
		return err
	}
	drivers := map[string]driver.Driver{
		"process": &process.Driver{Root: o.ProcessRoot, KCP: o.KCPPath(), Host: o.TenantHost, Webhook: webhook},
	}
	if o.NodeImage != "" {
		if err := os.MkdirAll(o.KindRoot, 0o700); err != nil {
			return fmt.Errorf("--kind-root: %w", err)
		}
		drivers["kind"] = &kind.Driver{Root: o.KindRoot, Kind: o.KindPath(), Image: o.NodeImage, Host: o.TenantHost,
			PathPrefix: o.KindPathPrefix, Preload: o.PreloadImages, Webhook: webhook}
		logger.Info("kind driver", "image", o.NodeImage, "kind", o.KindPath(), "kindRoot", o.KindRoot, "preload", o.PreloadImages)
	}
	var sshKey ssh.Signer
	sshFingerprint := ""
	if o.SSHAddress != "" {
		if sshKey, err = sshHostKey(o.SSHDir); err != nil {
			return err
		}
		sshFingerprint = ssh.FingerprintSHA256(sshKey.PublicKey())
	}
	if err := (&computevm.Reconciler{Client: mgr.GetClient(), Drivers: drivers, Grants: grants, Events: mgr.GetEventRecorder(computevm.Name),
		Gateway: o.GatewayPublic(), SSHAddress: o.SSHPublic(), SSHHostKey: sshFingerprint}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the computevm controller: %w", err)
	}
	if err := (&statesync.Reconciler{Client: mgr.GetClient(), Drivers: drivers, Events: mgr.GetEventRecorder(statesync.Name)}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the statesync controller: %w", err)
	}
	if o.GatewayAddress != "" {
		if err := serveGateway(ctx, mgr, o, drivers, dir, policy, sshKey); err != nil {
			return err
		}
	}
	if o.HealthProbeBindAddress != "0" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return err
		}
		// Ready once the ComputeVMs were read.
		if err := mgr.AddReadyzCheck("vms", func(r *http.Request) error {
			if !mgr.GetCache().WaitForCacheSync(r.Context()) {
				return errors.New("the ComputeVMs are not read yet")
			}
			return nil
		}); err != nil {
			return err
		}
	}
	if err := mgr.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	logger.Info("stopped")
	return nil
}

// vmWebhookConns bounds the connections to the webhook's listener of one
// kind VM (on its docker network, which its pods reach).
const vmWebhookConns = 32

// closer is an io.Closer of a function.
type closer func() error

func (c closer) Close() error { return c() }

// uidIndex indexes ComputeVMs by UID: the webhook's path names a VM by
// its ID (its UID).
const uidIndex = "metadata.uid"

// serveWebhook adds the service-auth webhook (serviceauth.Webhook) to mgr
// on --webhook-address, over TLS with the certificate kept in
// --webhook-dir, and returns how the tenants reach it. A token is
// checked against the service identity of the ComputeVM the path names
// and the DIDs it lets in (spec.adminDIDs, and those its tenant's RBAC
// names: grants), as the agent's cache has it; DIDs resolve through --plc-url, within
// the address policy of --allow-private-networks.
func serveWebhook(ctx context.Context, mgr manager.Manager, o *options.Options, grants *serviceauth.Grants, dir identity.Directory) (*driver.Webhook, error) {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &computev1alpha1.ComputeVM{}, uidIndex, func(obj client.Object) []string {
		return []string{string(obj.GetUID())}
	}); err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(o.WebhookAddress) // Validate checked it
	pair, ca, err := serviceauth.ServingCert(o.WebhookDir, host)
	if err != nil {
		return nil, fmt.Errorf("--webhook-dir: %w", err)
	}
	hook := &serviceauth.Webhook{
		Validator: serviceauth.NewValidator(dir),
		Log:       ctrl.Log.WithName("webhook"),
		Tenant: func(ctx context.Context, id string) (string, []string, error) {
			var vms computev1alpha1.ComputeVMList
			if err := mgr.GetClient().List(ctx, &vms, client.MatchingFields{uidIndex: id}); err != nil || len(vms.Items) != 1 {
				return "", nil, err
			}
			vm := &vms.Items[0]
			return driver.ServiceID(vm), append(slices.Clone(vm.Spec.AdminDIDs), grants.Get(id)...), nil
		},
	}
	srv := &http.Server{
		Addr:              o.WebhookAddress,
		Handler:           hook,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
	ln, err := net.Listen("tcp", o.WebhookAddress)
	if err != nil {
		return nil, fmt.Errorf("--webhook-address: %w", err)
	}
	vms := &vmServers{log: ctrl.Log.WithName("webhook")}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
		defer stop()
		err := srv.ServeTLS(ln, "", "")
		vms.closeAll()
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})); err != nil {
		return nil, err
	}
	listenFor := func(id, addr string) (io.Closer, error) {
		return vms.serve(id, addr, srv)
	}
	return &driver.Webhook{URL: "https://" + o.WebhookAddress, CA: ca, ListenFor: listenFor}, nil
}

// vmServers are the webhook's servers of single VMs (on a kind VM's
// docker network gateway): each serves one VM's path only, and all are
// closed and joined when the webhook stops.
type vmServers struct {
	log     logr.Logger
	mu      sync.Mutex
	wg      sync.WaitGroup
	servers map[*http.Server]bool
	stopped bool
}

// serve serves the webhook of main for the VM id alone on addr, until the
// returned Closer is closed or the webhook stops.
func (v *vmServers) serve(id, addr string, main *http.Server) (io.Closer, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.stopped {
		return nil, errors.New("the webhook has stopped")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	// The VM's pods reach this address too: they get at most
	// vmWebhookConns connections at once.
	ln = netutil.LimitListener(ln, vmWebhookConns)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != serviceauth.WebhookPath+id {
				http.NotFound(w, r)
				return
			}
			main.Handler.ServeHTTP(w, r)
		}),
		TLSConfig: main.TLSConfig, ReadHeaderTimeout: main.ReadHeaderTimeout, ReadTimeout: main.ReadTimeout, MaxHeaderBytes: main.MaxHeaderBytes,
	}
	if v.servers == nil {
		v.servers = map[*http.Server]bool{}
	}
	v.servers[srv] = true
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		if err := srv.ServeTLS(ln, "", ""); !errors.Is(err, http.ErrServerClosed) {
			v.log.Error(err, "serving the webhook for a VM stopped", "vm", id, "address", addr)
		}
	}()
	return closer(func() error {
		v.mu.Lock()
		delete(v.servers, srv)
		v.mu.Unlock()
		return srv.Close()
	}), nil
}

// closeAll closes every VM's server, waits for them to end, and serves no
// more.
func (v *vmServers) closeAll() {
	v.mu.Lock()
	v.stopped = true
	for srv := range v.servers {
		_ = srv.Close()
	}
	v.servers = nil
	v.mu.Unlock()
	v.wg.Wait()
}
