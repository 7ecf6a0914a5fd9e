package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apisv1alpha1 "github.com/kcp-dev/sdk/apis/apis/v1alpha1"
	apisv1alpha2 "github.com/kcp-dev/sdk/apis/apis/v1alpha2"
	tenancyv1alpha1 "github.com/kcp-dev/sdk/apis/tenancy/v1alpha1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/apis"
	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/bootstrap"
	"github.com/knotless-dev/knotless/internal/engage"

	"github.com/knotless-dev/knotless/internal/backoff"
)

// resourceVersions returns name -> resourceVersion of everything the
// bootstrap writes into the provider workspace.
func resourceVersions(ctx context.Context, t *testing.T) map[string]string {
	t.Helper()
	c, err := framework.ClientFor(env.admin, env.providerWS)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	lists := map[string]client.ObjectList{
		"APIResourceSchema":  &apisv1alpha1.APIResourceSchemaList{},
		"APIExport":          &apisv1alpha2.APIExportList{},
		"WorkspaceType":      &tenancyv1alpha1.WorkspaceTypeList{},
		"ClusterRole":        &rbacv1.ClusterRoleList{},
		"ClusterRoleBinding": &rbacv1.ClusterRoleBindingList{},
	}
	for kind, l := range lists {
		if err := c.List(ctx, l); err != nil {
			t.Fatal(err)
		}
		items, err := metaItems(l)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range items {
			out[kind+"/"+o.GetName()] = o.GetResourceVersion()
		}
	}
	if len(out) == 0 {
		t.Fatal("nothing found in the provider workspace")
	}
	return out
}

// TestBootstrapIsIdempotent: a second bootstrap run changes nothing, and
// leaves alone an operator's change of who may use the WorkspaceTypes.
func TestBootstrapIsIdempotent(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	pc, err := framework.ClientFor(env.admin, env.providerWS)
	if err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{}
	if err := pc.Get(ctx, client.ObjectKey{Name: "knotless:consumer"}, crb); err != nil {
		t.Fatal(err)
	}
	original := slices.Clone(crb.Subjects)
	crb.Subjects = append(crb.Subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: "Group", Name: "operators-choice"})
	if err := pc.Update(ctx, crb); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := pc.Get(context.WithoutCancel(ctx), client.ObjectKey{Name: "knotless:consumer"}, crb); err == nil {
			crb.Subjects = original
			if err := pc.Update(context.WithoutCancel(ctx), crb); err != nil {
				t.Errorf("restoring the ClusterRoleBinding: %v", err)
			}
		}
	}()
	before := resourceVersions(ctx, t)
	out, err := exec.CommandContext(ctx, env.provider.Bin, "--kubeconfig", env.kcp.Kubeconfig,
		"--workspace", env.providerWS.String(), "--bootstrap-only").CombinedOutput()
	if err != nil {
		t.Fatalf("bootstrap-only run failed: %v\n%s", err, out)
	}
	after := resourceVersions(ctx, t)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s changed: resourceVersion %s -> %s", k, v, after[k])
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			t.Errorf("%s appeared on the second run", k)
		}
	}
	if err := pc.Get(ctx, client.ObjectKey{Name: "knotless:consumer"}, crb); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(crb.Subjects, func(s rbacv1.Subject) bool { return s.Name == "operators-choice" }) {
		t.Errorf("bootstrap reverted the operator's subjects: %+v", crb.Subjects)
	}
	t.Logf("%d objects unchanged by a second bootstrap", len(before))
}

// TestProviderRejectsBadFlags: an unreachable kcp, a malformed or missing
// kubeconfig and an invalid workspace path end the provider with exit code
// 1 and one line naming the problem.
func TestProviderRejectsBadFlags(t *testing.T) {
	dir := t.TempDir()
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	malformed := filepath.Join(dir, "malformed.kubeconfig")
	unreachable := filepath.Join(dir, "unreachable.kubeconfig")
	if err := os.WriteFile(malformed, []byte("apiVersion: v1\nclusters: [this is: not yaml\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(unreachable, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:%d", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, port)), 0o600); err != nil {
		t.Fatal(err)
	}
	probeFiles := []string{"--kubeconfig", env.kcp.Kubeconfig, "--mountproxy-url", "https://127.0.0.1:9443",
		"--mountproxy-ca-file", filepath.Join(dir, "nope.crt"), "--mountproxy-client-cert-file", filepath.Join(dir, "nope.crt"), "--mountproxy-client-key-file", filepath.Join(dir, "nope.key")}
	user, group := "X-Knotless-0123456789abcdef-User", "X-Knotless-fedcba9876543210-Group"
	expectBadFlags(t, env.provider.Bin, nil, []badFlags{
		{"malformed kubeconfig", []string{"--kubeconfig", malformed}, "is malformed"},
		{"missing kubeconfig", []string{"--kubeconfig", filepath.Join(dir, "nope")}, "no such file"},
		{"unreachable kcp", []string{"--kubeconfig", unreachable, "--connect-timeout", "2s"}, "unreachable"},
		{"invalid workspace path", []string{"--kubeconfig", env.kcp.Kubeconfig, "--workspace", "root:Not_Valid"}, "not a valid workspace path"},
		{"no record workers", []string{"--kubeconfig", env.kcp.Kubeconfig, "--atproto-workers", "0"}, "--atproto-workers must be at least 1"},
		{"batch above the PDS limit", []string{"--kubeconfig", env.kcp.Kubeconfig, "--atproto-max-batch", "201"}, "--atproto-max-batch between 1 and 200"},
		{"PLC URL with a path", []string{"--kubeconfig", env.kcp.Kubeconfig, "--plc-url", "https://plc.example/x"}, "--plc-url"},
		{"no watch flush interval", []string{"--kubeconfig", env.kcp.Kubeconfig, "--watch-flush-interval", "0s"}, "--watch-flush-interval must be positive"},
		{"mount proxy over http", []string{"--kubeconfig", env.kcp.Kubeconfig, "--mountproxy-url", "http://127.0.0.1:9443"}, "must be https://host:port"},
		{"mount proxy without the probe's TLS files", []string{"--kubeconfig", env.kcp.Kubeconfig, "--mountproxy-url", "https://127.0.0.1:9443"}, "needs --mountproxy-ca-file"},
		{"mount proxy CA file missing", append(probeFiles, "--mountproxy-user-header", user, "--mountproxy-group-header", group), "mount proxy client TLS"},
		{"mount proxy headers missing", probeFiles, "--mountproxy-user-header is required"},
		{"standard mount proxy user header", append(probeFiles, "--mountproxy-user-header", "X-Remote-User", "--mountproxy-group-header", group), "standard name"},
		{"guessable mount proxy group header", append(probeFiles, "--mountproxy-user-header", user, "--mountproxy-group-header", "X-Group"), "shorter than"},
		{"public range allowed as private", []string{"--kubeconfig", env.kcp.Kubeconfig, "--allow-private-networks", "0.0.0.0/0"}, "--allow-private-networks"},
		{"metadata range allowed", []string{"--kubeconfig", env.kcp.Kubeconfig, "--allow-private-networks", "169.254.0.0/16"}, "only loopback, private and shared ranges"},
		{"no probe interval", []string{"--kubeconfig", env.kcp.Kubeconfig, "--tenant-probe-interval", "0s"}, "--tenant-probe-interval must be positive"},
	})
}

// badFlags is a command line that must end the process with exit code 1
// and one line on stderr containing want.
type badFlags struct {
	name string
	args []string
	want string
}

// expectBadFlags runs bin with each case's args and extra.
func expectBadFlags(t *testing.T, bin string, extra []string, cases []badFlags) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, append(tc.args, extra...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("want exit code 1, got %v; stderr:\n%s", err, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
				t.Fatalf("want one line containing %q, got:\n%s", tc.want, stderr.String())
			}
			t.Logf("stderr: %s", lines[0])
		})
	}
}

// TestEngagementRecoversFromUnservedEndpoint: the virtual workspace URL is
// published before it serves (simulated by a probe that fails twice);
// engagement restarts with backoff and engages the bound workspaces
// without a process restart.
func TestEngagementRecoversFromUnservedEndpoint(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	name := env.prefix + "-recover"
	if _, err := newApplicationWorkspace(ctx, env.admin, name); err != nil {
		t.Fatal(err)
	}
	wsCfg, err := bootstrap.ForWorkspace(env.admin, env.providerWS)
	if err != nil {
		t.Fatal(err)
	}
	var probes atomic.Int32
	flaky := func(ctx context.Context, cfg *rest.Config, url string) error {
		if probes.Add(1) <= 2 {
			return fmt.Errorf("simulated: %s not served yet", url)
		}
		return engage.ProbeVirtualWorkspace(ctx, cfg, url)
	}
	scheme := framework.Scheme()
	p, err := engage.New(wsCfg, apis.Export, engage.Options{
		Scheme: scheme, Probe: flaky, Backoff: backoff.Backoff{Initial: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := mcmanager.New(wsCfg, p, manager.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 100)
	err = engage.ControllerManagedBy(mgr).Named("e2e-recover").
		For(&appsv1alpha1.Application{}).
		Complete(mcreconcile.Func(func(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
			select {
			case seen <- string(req.ClusterName):
			default:
			}
			return reconcile.Result{}, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	select {
	case cluster := <-seen:
		t.Logf("engaged %s after %d probes, %d restarts", cluster, probes.Load(), p.Restarts())
	case <-time.After(2 * time.Minute):
		t.Fatalf("no workspace engaged after %d probes", probes.Load())
	}
	if r := p.Restarts(); r < 1 {
		t.Errorf("want at least one restart of the export's provider, got %d", r)
	}
}

func metaItems(l client.ObjectList) ([]client.Object, error) {
	items, err := apimeta.ExtractList(l)
	if err != nil {
		return nil, err
	}
	out := make([]client.Object, 0, len(items))
	for _, o := range items {
		co, ok := o.(client.Object)
		if !ok {
			return nil, fmt.Errorf("%T is not a client.Object", o)
		}
		out = append(out, co)
	}
	return out, nil
}

// TestProviderReportsBindingsToExportsItNoLongerServes: a workspace bound
// to a per-group export of an earlier knotless (here apps.knotless.dev,
// made again for the test) is named in one start-up line.
func TestProviderReportsBindingsToExportsItNoLongerServes(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	pc, err := framework.ClientFor(env.admin, env.providerWS)
	if err != nil {
		t.Fatal(err)
	}
	served := &apisv1alpha2.APIExport{}
	if err := pc.Get(ctx, client.ObjectKey{Name: apis.Export}, served); err != nil {
		t.Fatal(err)
	}
	legacy := &apisv1alpha2.APIExport{ObjectMeta: metav1.ObjectMeta{Name: "apps.knotless.dev"}}
	for _, r := range served.Spec.Resources {
		if r.Group == appsv1alpha1.GroupVersion.Group {
			legacy.Spec.Resources = append(legacy.Spec.Resources, r)
		}
	}
	if err := pc.Create(ctx, legacy); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pc.Delete(context.WithoutCancel(ctx), legacy) }()

	name := env.prefix + "-legacy"
	if err := framework.CreateWorkspace(ctx, env.admin, root, name, root.Join("universal")); err != nil {
		t.Fatal(err)
	}
	wc, err := framework.ClientFor(env.admin, root.Join(name))
	if err != nil {
		t.Fatal(err)
	}
	newBinding := func() *apisv1alpha2.APIBinding {
		return &apisv1alpha2.APIBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "legacy"},
			Spec: apisv1alpha2.APIBindingSpec{Reference: apisv1alpha2.BindingReference{
				Export: &apisv1alpha2.ExportBindingReference{Path: env.providerWS.String(), Name: legacy.Name},
			}},
		}
	}
	binding := newBinding()
	if err := framework.Eventually(ctx, 2*time.Minute, "the legacy binding to be Bound", func(ctx context.Context) (bool, string, error) {
		if err := wc.Create(ctx, newBinding()); err != nil && !apierrors.IsAlreadyExists(err) {
			return false, err.Error(), nil
		}
		if err := wc.Get(ctx, client.ObjectKeyFromObject(binding), binding); err != nil {
			return false, err.Error(), nil
		}
		return binding.Status.Phase == apisv1alpha2.APIBindingPhaseBound, string(binding.Status.Phase), nil
	}); err != nil {
		t.Fatal(err)
	}
	lc := binding.Annotations["kcp.io/cluster"]
	var out []byte
	if err := framework.Eventually(ctx, time.Minute, "bootstrap to name the legacy binding", func(ctx context.Context) (bool, string, error) {
		out, err = exec.CommandContext(ctx, env.provider.Bin, "--kubeconfig", env.kcp.Kubeconfig,
			"--workspace", env.providerWS.String(), "--bootstrap-only").CombinedOutput()
		if err != nil {
			return false, "", fmt.Errorf("bootstrap-only run failed: %w\n%s", err, out)
		}
		return strings.Contains(string(out), "no longer serves") && strings.Contains(string(out), lc), string(out), nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "no longer serves") {
			t.Logf("start-up line: %s", line)
		}
	}
	_ = wc.Delete(ctx, binding)
}

// TestStartupLineNamesTheCommit: the provider's start-up line names the
// version and the commit it was built from.
func TestStartupLineNamesTheCommit(t *testing.T) {
	raw, err := os.ReadFile(env.provider.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.Contains(line, `"msg":"starting"`) {
			if !strings.Contains(line, `"version":`) || !strings.Contains(line, `"commit":`) || strings.Contains(line, `"commit":"unknown"`) {
				t.Errorf("start-up line without version and commit: %s", line)
			}
			return
		}
	}
	t.Error("no start-up line in the provider's log")
}
