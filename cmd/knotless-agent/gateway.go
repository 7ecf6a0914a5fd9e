package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"golang.org/x/crypto/ssh"
	"golang.org/x/net/netutil"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/cmd/knotless-agent/options"
	"github.com/knotless-dev/knotless/controllers/gatewayroute"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/gateway"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/sshgateway"
	"github.com/knotless-dev/knotless/internal/tlsfiles"
)

// Bounds of the gateway's clients: connections at once, from one
// address, and HTTP/2 streams at once on one connection.
const (
	gatewayConns      = 1024
	gatewayConnsPerIP = 32
	gatewayStreams    = 32
)

// holdersFile keeps the hostnames' holders in --gateway-dir.
const holdersFile = "holders.json"

// holdersIn is a route table whose holders are kept in dir: read now,
// written (atomically) whenever they change.
func holdersIn(dir string) (*gateway.Routes, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--gateway-dir: %w", err)
	}
	path := filepath.Join(dir, holdersFile)
	routes := &gateway.Routes{}
	if b, err := os.ReadFile(path); err == nil {
		var h map[string]string
		if err := json.Unmarshal(b, &h); err != nil {
			return nil, fmt.Errorf("--gateway-dir: %s: %w", path, err)
		}
		routes.Restore(h)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("--gateway-dir: %w", err)
	}
	log := ctrl.Log.WithName("gateway")
	routes.Saved = func(h map[string]string) {
		b, _ := json.Marshal(h)
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			log.Error(err, "keeping the hostnames' holders")
			return
		}
		if err := os.Rename(tmp, path); err != nil {
			log.Error(err, "keeping the hostnames' holders")
		}
	}
	return routes, nil
}

// serveGateway adds the gateway to mgr: the server on --gateway-address
// with the certificate of --gateway-cert-file, the firehose hub that
// follows the requesters' association records, and the gatewayroute
// controller that turns them into routes.
func serveGateway(ctx context.Context, mgr manager.Manager, o *options.Options, drivers map[string]driver.Driver, dir identity.Directory, policy *netpolicy.Policy, sshKey ssh.Signer) error {
	certs, err := tlsfiles.New(o.GatewayCertFile, o.GatewayKeyFile, "", 10*time.Second)
	if err != nil {
		return fmt.Errorf("--gateway-cert-file: %w", err)
	}
	hub, err := firehose.NewHub(firehose.Options{Directory: dir, Policy: policy, Log: ctrl.Log.WithName("gateway-records")})
	if err != nil {
		return err
	}
	records := gatewayroute.NewHubRecords(hub, dir)
	if err := mgr.Add(hub); err != nil {
		return err
	}
	if err := mgr.Add(records); err != nil {
		return err
	}
	routes, err := holdersIn(o.GatewayDir)
	if err != nil {
		return err
	}
	var targets *sshgateway.Targets
	if sshKey != nil {
		targets = &sshgateway.Targets{}
	}
	if err := (&gatewayroute.Reconciler{Client: mgr.GetClient(), Drivers: drivers, Records: records, Routes: routes, SSH: targets,
		Covers: func(host string) bool { return covers(certs, host) }, Wake: records.Wake()}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the gatewayroute controller: %w", err)
	}
	tenants := &tenantBackends{client: mgr.GetClient(), drivers: drivers}
	if sshKey != nil {
		if err := serveSSH(mgr, o, sshKey, targets, tenants, dir, policy); err != nil {
			return err
		}
	}
	srv := &http.Server{
		Handler: &gateway.Server{Routes: routes, Tenant: tenants.get},
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate,
			NextProtos: []string{"h2", "http/1.1"}},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		// A client's streams at once on one connection (each may hold an
		// upstream connection).
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: gatewayStreams},
	}
	ln, err := net.Listen("tcp", o.GatewayAddress)
	if err != nil {
		return fmt.Errorf("--gateway-address: %w", err)
	}
	ln = gateway.LimitPerIP(netutil.LimitListener(ln, gatewayConns), gatewayConnsPerIP)
	log := ctrl.Log.WithName("gateway")
	log.Info("serving Gateway hostnames", "address", ln.Addr().String())
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		stop := context.AfterFunc(ctx, func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if srv.Shutdown(sctx) != nil {
				_ = srv.Close()
			}
		})
		defer stop()
		err := srv.ServeTLS(ln, "", "")
		tenants.closeAll()
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}))
}

// covers says whether the gateway's current certificate is valid for
// host.
func covers(certs *tlsfiles.Reloader, host string) bool {
	c, _ := certs.Current()
	if c == nil || len(c.Certificate) == 0 {
		return false
	}
	leaf := c.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return false
		}
	}
	return leaf.VerifyHostname(host) == nil
}

// maxBackends bounds the tenants whose connections are kept.
const maxBackends = 256

// tenantBackends are the backends of the VMs the gateway routes to, by
// VM UID (a route's tenant), made from the VM's tenant admin.
type tenantBackends struct {
	client  client.Client
	drivers map[string]driver.Driver

	mu    sync.Mutex
	byUID map[types.UID]*gateway.KubeBackend
	// letGo waits for the backends let go (over maxBackends) to end.
	letGo sync.WaitGroup
}

func (t *tenantBackends) get(ctx context.Context, tenant string) (gateway.Backend, error) {
	uid := types.UID(tenant)
	t.mu.Lock()
	b := t.byUID[uid]
	t.mu.Unlock()
	if b != nil {
		return b, nil
	}
	cfg, err := t.admin(ctx, tenant)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 10 * time.Second
	nb, err := gateway.NewKubeBackend(cfg)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if b := t.byUID[uid]; b != nil {
		_ = nb.Close()
		return b, nil
	}
	if t.byUID == nil || len(t.byUID) >= maxBackends {
		for _, old := range t.byUID {
			_ = old.Close()
			t.letGo.Go(old.Wait)
		}
		t.byUID = map[types.UID]*gateway.KubeBackend{}
	}
	t.byUID[uid] = nb
	return nb, nil
}

// admin is the tenant admin configuration of the VM whose UID is
// tenant.
func (t *tenantBackends) admin(ctx context.Context, tenant string) (*rest.Config, error) {
	var vms computev1alpha1.ComputeVMList
	if err := t.client.List(ctx, &vms, client.MatchingFields{uidIndex: tenant}); err != nil || len(vms.Items) != 1 {
		return nil, fmt.Errorf("no VM %s", tenant)
	}
	w, ok := t.drivers[vms.Items[0].Spec.Driver].(driver.Workloads)
	if !ok {
		return nil, errors.New("the VM's driver runs no pods")
	}
	return w.TenantAdmin(ctx, driver.VMOf(&vms.Items[0]))
}

// closeAll closes every backend and joins their goroutines, and those of
// the backends let go before (R10).
func (t *tenantBackends) closeAll() {
	t.mu.Lock()
	all := slices.Collect(maps.Values(t.byUID))
	t.byUID = nil
	t.mu.Unlock()
	for _, b := range all {
		_ = b.Close()
	}
	for _, b := range all {
		b.Wait()
	}
	t.letGo.Wait()
}
