// Package e2e runs knotless against real processes: a kcp it starts (or
// the one KNOTLESS_E2E_KUBECONFIG names, with the kcp-front-proxy and
// shim framework.External reads from the environment) and the
// knotless-provider binary.
package e2e

import (
	"context"
	"encoding/pem"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/knotless-dev/knotless/e2e/framework"
)

// suite is what TestMain set up for every test.
type suite struct {
	group    *framework.Group
	dir      string
	kcp      *framework.KCP
	admin    *rest.Config
	provider *framework.Provider
	plc      *framework.PLC
	pds      *framework.PDS
	vault    *framework.Vault
	// vaultAudit is the file Vault's audit device writes.
	vaultAudit string
	// prefix makes names unique when an existing kcp is reused.
	prefix string
	// providerWS is deliberately not root:knotless (R15).
	providerWS logicalcluster.Path
	appType    logicalcluster.Path
	// The mount topology: certificates, kcp-front-proxy in front of kcp,
	// knotless-mountproxy (nil when an existing kcp is used).
	certs      *framework.MountCerts
	frontProxy *framework.FrontProxy
	mountProxy *framework.MountProxy
	kcpBin     string
	// gatewayCA issues the bidders' gateway certificates; every provider
	// of the suite trusts it (--gateway-ca-file) to probe Gateways.
	gatewayCA     *framework.CA
	gatewayCAFile string
}

var env *suite

// runLast defers a test that needs the node image or the release
// (TestKindTenant, TestBidderGuide, TestContainerImages) until every
// other test of the suite has run: it calls t.Parallel, and the suite
// runs its parallel tests one at a time (run sets -test.parallel 1).
// CI builds the node image and the release in the background, at the
// lowest priority, while the rest of the suite runs (.ci/run); a test
// that needs one waits for its build (hack/node-image/build.sh's lock,
// awaitRelease).
func runLast(t *testing.T) {
	t.Helper()
	t.Parallel()
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) (code int) {
	flag.Parse()
	// The tests that runLast defers run one at a time, as every other.
	if err := flag.Set("test.parallel", "1"); err != nil {
		panic(err)
	}
	if testing.Short() {
		fmt.Println("e2e: skipped in -short mode")
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	root, err := filepath.Abs("..")
	if err != nil {
		panic(err)
	}
	dir := os.Getenv("KNOTLESS_E2E_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(root, "e2e", "_artifacts", time.Now().Format("20060102-150405"))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		panic(err)
	}
	s := &suite{group: &framework.Group{}, dir: dir, prefix: fmt.Sprintf("e2e%04d", rand.IntN(10000))}
	env = s
	defer func() {
		if r := recover(); r != nil {
			fmt.Printf("e2e: setup panicked: %v\n", r)
			code = 1
		}
		if code != 0 {
			fmt.Println(s.group.Tails(60))
		}
		s.group.StopAll()
		fmt.Printf("e2e: logs in %s\n", dir)
	}()

	// In-process controllers (engage tests) log to a file of their own.
	if f, err := os.Create(filepath.Join(dir, "in-process.log")); err == nil {
		defer f.Close()
		ctrllog.SetLogger(zap.New(zap.WriteTo(f)))
	}
	fail := func(err error) int {
		fmt.Printf("e2e: setup failed: %v\n", err)
		return 1
	}
	kcpBin := os.Getenv("KCP_BIN")
	if kcpBin == "" {
		kcpBin = filepath.Join(root, "bin", "kcp")
	}
	s.kcpBin = kcpBin
	if s.certs, err = framework.NewMountCerts(filepath.Join(dir, "certs")); err != nil {
		return fail(err)
	}
	start := time.Now()
	if s.kcp, err = framework.StartKCP(ctx, s.group, kcpBin, dir, s.certs.ShardArgs()...); err != nil {
		return fail(err)
	}
	fmt.Printf("e2e: kcp ready in %s at %s\n", time.Since(start).Round(time.Millisecond), s.kcp.BaseURL)
	var mountArgs []string
	shimPort, err := framework.FreePort()
	if err != nil {
		return fail(err)
	}
	shimAddr := fmt.Sprintf("127.0.0.1:%d", shimPort)
	// An existing kcp's kcp-front-proxy and shim (framework.External).
	ext, err := framework.ExternalFromEnv()
	if err != nil {
		return fail(err)
	}
	if s.kcp.Process == nil && ext != nil {
		if s.certs, err = ext.MountCerts(filepath.Join(dir, "external-certs")); err != nil {
			return fail(err)
		}
		s.frontProxy = ext.FrontProxy(s.certs)
		s.kcp.Users = s.frontProxy
		mountArgs = append(s.certs.MountProxyArgs(ext.ShimAddr(), s.frontProxy.URL), "--tenant-probe-interval", "2s")
		fmt.Printf("e2e: the existing kcp's kcp-front-proxy %s and shim %s\n", ext.FrontProxyURL, ext.ShimURL)
	}
	if s.kcp.Process != nil {
		start = time.Now()
		if s.frontProxy, err = framework.StartFrontProxy(ctx, s.group, filepath.Join(filepath.Dir(kcpBin), "kcp-front-proxy"), dir, s.kcp, s.certs, shimAddr); err != nil {
			return fail(err)
		}
		fmt.Printf("e2e: kcp-front-proxy ready in %s at %s\n", time.Since(start).Round(time.Millisecond), s.frontProxy.URL)
		mountArgs = append(s.certs.MountProxyArgs(shimAddr, s.frontProxy.URL), "--tenant-probe-interval", "2s")
		// GuestIdentityGrants: the webhook, and kcp-front-proxy as pods
		// of kind tenants reach it.
		guestServer, err := framework.GuestServer(ctx, s.frontProxy.URL)
		if err != nil {
			return fail(err)
		}
		guestArgs, err := s.certs.GuestArgs(guestServer)
		if err != nil {
			return fail(err)
		}
		mountArgs = append(mountArgs, guestArgs...)
	}
	if s.admin, err = s.kcp.Config(); err != nil {
		return fail(err)
	}
	if err := grantWorkspaceCreators(ctx, s.admin); err != nil {
		return fail(err)
	}
	bin, err := framework.Build(ctx, root, dir, "knotless-provider")
	if err != nil {
		return fail(err)
	}
	start = time.Now()
	if s.plc, err = framework.StartPLC(ctx, s.group, root, dir); err != nil {
		return fail(err)
	}
	if s.pds, err = framework.StartPDS(ctx, s.group, root, dir, s.plc.URL); err != nil {
		return fail(err)
	}
	var vaultArgs []string
	if os.Getenv("KNOTLESS_E2E_SKIP_VAULT") == "" {
		if s.vault, err = framework.StartVault(ctx, s.group, filepath.Join(root, "bin", "vault"), dir); err != nil {
			return fail(err)
		}
		if vaultArgs, err = setupVault(ctx, s, dir); err != nil {
			return fail(err)
		}
	}
	fmt.Printf("e2e: PLC, PDS and Vault ready in %s (pds %s)\n", time.Since(start).Round(time.Millisecond), s.pds.URL)
	s.providerWS = logicalcluster.NewPath("root:" + s.prefix + "-org:knotless")
	if ws := os.Getenv("KNOTLESS_E2E_PROVIDER_WORKSPACE"); ws != "" {
		// The workspace an existing shim serves.
		s.providerWS = logicalcluster.NewPath(ws)
	}
	s.appType = s.providerWS.Join("socialweb-application")
	if err := s.newGatewayCA(); err != nil {
		return fail(err)
	}
	start = time.Now()
	args := append(s.providerArgs(), vaultArgs...)
	args = append(args, mountArgs...)
	if s.provider, err = framework.StartProvider(ctx, s.group, bin, dir, s.kcp.Kubeconfig, s.providerWS.String(), args...); err != nil {
		return fail(err)
	}
	fmt.Printf("e2e: provider ready in %s for %s\n", time.Since(start).Round(time.Millisecond), s.providerWS)
	if ext != nil && s.kcp.Process == nil {
		s.mountProxy = ext.MountProxy()
	}
	if s.frontProxy != nil && s.kcp.Process != nil {
		start = time.Now()
		shimBin, err := framework.Build(ctx, root, dir, "knotless-mountproxy")
		if err != nil {
			return fail(err)
		}
		if s.mountProxy, err = framework.StartMountProxy(ctx, s.group, shimBin, dir, s.kcp.Kubeconfig, s.providerWS.String(), shimAddr, s.frontProxy.URL, s.certs); err != nil {
			return fail(err)
		}
		fmt.Printf("e2e: knotless-mountproxy ready in %s at %s\n", time.Since(start).Round(time.Millisecond), shimAddr)
	}
	return m.Run()
}

// providerArgs are the provider's flags every installation of the suite
// shares (the ATProto network, the address policy, short resyncs).
func (s *suite) providerArgs() []string {
	return []string{"--atproto-resync", "3s", "--plc-url", s.plc.URL, "--watch-flush-interval", "1s", "--allow-private-networks", framework.AllowedNetworks,
		"--firehose-metric-sources", strings.TrimPrefix(s.pds.URL, "http://"), "--gateway-ca-file", s.gatewayCAFile}
}

// newGatewayCA makes the suite's gateway CA and writes its certificate
// for the providers.
func (s *suite) newGatewayCA() error {
	ca, err := framework.NewCA("gateway-ca")
	if err != nil {
		return err
	}
	s.gatewayCA, s.gatewayCAFile = ca, filepath.Join(s.dir, "gateway-ca.crt")
	return os.WriteFile(s.gatewayCAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}), 0o600)
}

// installation is one kcp with knotless on it, as its users reach it:
// the suite's own (home), or another operator's (startInstallation).
type installation struct {
	kcp        *framework.KCP
	admin      *rest.Config
	frontProxy *framework.FrontProxy
	providerWS logicalcluster.Path
}

// home is the suite's installation.
func (s *suite) home() *installation {
	return &installation{kcp: s.kcp, admin: s.admin, frontProxy: s.frontProxy, providerWS: s.providerWS}
}

// startInstallation starts another installation of knotless beside the
// suite's, as a second operator would run it: its own kcp (name's
// directory under the suite's, its own certificates and token users),
// kcp-front-proxy, provider and mount proxy. It shares only the ATProto
// network (the PLC and the PDS) with the suite's installation. Its
// processes stop when the test ends, and their logs' tails are printed
// when it failed. It skips unless the suite started kcp itself.
func startInstallation(ctx context.Context, t *testing.T, name string) *installation {
	t.Helper()
	if env.kcp.Process == nil || env.frontProxy == nil {
		t.Skip("a second installation needs the kcp and the mount topology the suite starts itself")
	}
	dir := filepath.Join(env.dir, name)
	g := &framework.Group{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(g.Tails(60))
		}
		g.StopAll()
	})
	fail := func(err error) *installation {
		t.Fatalf("installation %s: %v", name, err)
		return nil
	}
	certs, err := framework.NewMountCerts(filepath.Join(dir, "certs"))
	if err != nil {
		return fail(err)
	}
	in := &installation{providerWS: logicalcluster.NewPath("root:" + name + "-org:knotless")}
	if in.kcp, err = framework.StartKCP(ctx, g, env.kcpBin, dir, certs.ShardArgs()...); err != nil {
		return fail(err)
	}
	shimPort, err := framework.FreePort()
	if err != nil {
		return fail(err)
	}
	shimAddr := fmt.Sprintf("127.0.0.1:%d", shimPort)
	if in.frontProxy, err = framework.StartFrontProxy(ctx, g, filepath.Join(filepath.Dir(env.kcpBin), "kcp-front-proxy"), dir, in.kcp, certs, shimAddr); err != nil {
		return fail(err)
	}
	if in.admin, err = in.kcp.Config(); err != nil {
		return fail(err)
	}
	if err := grantWorkspaceCreators(ctx, in.admin); err != nil {
		return fail(err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		return fail(err)
	}
	bin, err := framework.Build(ctx, root, env.dir, "knotless-provider")
	if err != nil {
		return fail(err)
	}
	args := append(env.providerArgs(), certs.MountProxyArgs(shimAddr, in.frontProxy.URL)...)
	if _, err := framework.StartProvider(ctx, g, bin, dir, in.kcp.Kubeconfig, in.providerWS.String(), append(args, "--tenant-probe-interval", "2s")...); err != nil {
		return fail(err)
	}
	shimBin, err := framework.Build(ctx, root, env.dir, "knotless-mountproxy")
	if err != nil {
		return fail(err)
	}
	if _, err := framework.StartMountProxy(ctx, g, shimBin, dir, in.kcp.Kubeconfig, in.providerWS.String(), shimAddr, in.frontProxy.URL, certs); err != nil {
		return fail(err)
	}
	return in
}

// setupVault gives the provider an AppRole whose policy may read the KV v2
// paths under secret/knotless/, turns on a file audit device, and returns
// the provider's --vault-* flags.
func setupVault(ctx context.Context, s *suite, dir string) ([]string, error) {
	v := s.vault
	s.vaultAudit = filepath.Join(dir, "vault-audit.log")
	if err := v.EnableAudit(ctx, s.vaultAudit); err != nil {
		return nil, err
	}
	steps := []struct {
		path string
		data map[string]any
	}{
		{"sys/auth/approle", map[string]any{"type": "approle"}},
		{"sys/policies/acl/knotless-provider", map[string]any{"policy": `path "secret/data/knotless/*" { capabilities = ["read"] }`}},
		{"auth/approle/role/knotless-provider", map[string]any{"token_policies": "knotless-provider", "token_ttl": "10m", "token_max_ttl": "1h"}},
	}
	for _, st := range steps {
		if _, err := v.Write(ctx, st.path, st.data); err != nil {
			return nil, err
		}
	}
	role, err := v.Read(ctx, "auth/approle/role/knotless-provider/role-id")
	if err != nil {
		return nil, err
	}
	secret, err := v.Write(ctx, "auth/approle/role/knotless-provider/secret-id", map[string]any{})
	if err != nil {
		return nil, err
	}
	secretFile := filepath.Join(dir, "vault-secret-id")
	if err := os.WriteFile(secretFile, []byte(fmt.Sprint(secret["secret_id"])), 0o600); err != nil {
		return nil, err
	}
	return []string{
		"--vault-address", v.Addr,
		"--vault-approle-role-id", fmt.Sprint(role["role_id"]),
		"--vault-approle-secret-id-file", secretFile,
		"--vault-prefix", "knotless",
	}, nil
}

// grantWorkspaceCreators lets the token users create workspaces in root
// and nothing else. The types' `use` and the exports' `bind` come from the
// RBAC knotless applies to its provider workspace.
func grantWorkspaceCreators(ctx context.Context, admin *rest.Config) error {
	c, err := framework.ClientFor(admin, logicalcluster.NewPath("root"))
	if err != nil {
		return err
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e:workspace-creator"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"tenancy.kcp.io"}, Resources: []string{"workspaces"}, Verbs: []string{"create", "get", "list", "watch"}},
			{NonResourceURLs: []string{"/"}, Verbs: []string{"access"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e:workspace-creator"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{
			{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "alice"},
			{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "bob"},
			{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "carol"},
		},
	}
	for _, o := range []client.Object{role, binding} {
		if err := c.Create(ctx, o); client.IgnoreAlreadyExists(err) != nil {
			return err
		}
	}
	return nil
}

// failWithLogs is called by tests on failure to show the processes' logs.
func failWithLogs(t *testing.T) {
	t.Helper()
	if t.Failed() {
		t.Log(env.group.Tails(40))
	}
}
