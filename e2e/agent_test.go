package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/driver/process"
	"github.com/knotless-dev/knotless/internal/mount"
)

// agent is a knotless-agent process for one bidder workspace.
type agent struct {
	bin, dir, root string
	args           []string
	proc           *framework.Process
}

// startAgent builds and starts knotless-agent with a kubeconfig for ws as
// the user of cfg and the flags extra; it kills every VM process the agent
// started when the test ends (they outlive the agent on purpose).
func startAgent(ctx context.Context, t *testing.T, ws string, kubeconfig string, extra ...string) *agent {
	t.Helper()
	repoRoot, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := framework.Build(ctx, repoRoot, env.dir, "knotless-agent")
	if err != nil {
		t.Fatal(err)
	}
	probe, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	webhook, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{bin: bin, dir: env.dir, root: filepath.Join(env.dir, "agent-"+ws)}
	a.args = []string{"--kubeconfig", kubeconfig, "--process-root", a.root, "--kcp", env.kcpBin,
		"--webhook-address", fmt.Sprintf("127.0.0.1:%d", webhook), "--webhook-dir", a.root + "-webhook",
		"--plc-url", env.plc.URL, "--allow-private-networks", framework.AllowedNetworks,
		"--metrics-bind-address", "0", "--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", probe)}
	a.args = append(a.args, extra...)
	// The agent stops first: one still running would start the VM of a
	// contract again after its process was killed here, and leave it.
	t.Cleanup(func() {
		if a.proc != nil {
			a.proc.Stop(5 * time.Second)
		}
		for _, pid := range process.PIDs(a.root) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	a.start(t)
	return a
}

func (a *agent) start(t *testing.T) {
	t.Helper()
	p, err := framework.Start(a.dir, "knotless-agent-"+filepath.Base(a.root), a.bin, a.args, nil)
	if err != nil {
		t.Fatal(err)
	}
	env.group.Add(p)
	a.proc = p
}

func waitVM(ctx context.Context, t *testing.T, c client.Client, name, what string, timeout time.Duration, ok func(*computev1alpha1.ComputeVM) bool) *computev1alpha1.ComputeVM {
	t.Helper()
	vm := &computev1alpha1.ComputeVM{}
	if err := framework.Eventually(ctx, timeout, what, func(ctx context.Context) (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, vm); err != nil {
			return false, err.Error(), nil
		}
		msg := string(vm.Status.Phase) + " " + vm.Status.Reason
		if cond := meta.FindStatusCondition(vm.Status.Conditions, computev1alpha1.ConditionRunning); cond != nil {
			msg += ": " + cond.Message
		}
		return ok(vm), msg, nil
	}); err != nil {
		t.Fatal(err)
	}
	return vm
}

// vmToken reads a VM's credential Secret.
func vmToken(ctx context.Context, t *testing.T, c client.Client, vm *computev1alpha1.ComputeVM) string {
	t.Helper()
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: vm.Namespace, Name: vm.Status.CredentialSecret}, sec); err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(sec); ref == nil || ref.Kind != "ComputeVM" || ref.UID != vm.UID {
		t.Errorf("credential Secret owner %+v, want the ComputeVM", ref)
	}
	return string(sec.Data["token"])
}

// tenantGet GETs path on a running VM's tenant apiserver with the mount
// credential, verified against the VM's CA, impersonating user (and group)
// when user is set; it returns the HTTP status.
func tenantGet(ctx context.Context, t *testing.T, vm *computev1alpha1.ComputeVM, token, path, user, group string) int {
	t.Helper()
	h := http.Header{}
	if user != "" {
		h.Set("Impersonate-User", user)
		if group != "" {
			h.Set("Impersonate-Group", group)
		}
	}
	return tenantDo(ctx, t, vm, token, path, h)
}

// tenantDo GETs path on a running VM's tenant apiserver with the mount
// credential and the headers h; it returns the HTTP status.
func tenantDo(ctx context.Context, t *testing.T, vm *computev1alpha1.ComputeVM, token, path string, h http.Header) int {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(vm.Status.CABundle)) {
		t.Fatal("the VM's CA bundle holds no certificate")
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, vm.Status.Endpoint+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h.Clone()
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// mountTokenIsNoSuperuser: the mount credential impersonates only the
// VM's named admins (and the shim's probe user), never system:masters, a
// user the tenant does not name or a warrant (kcp's second identity) that
// carries system:masters.
func mountTokenIsNoSuperuser(ctx context.Context, t *testing.T, vm *computev1alpha1.ComputeVM, token string) {
	t.Helper()
	warrant := `{"user":"e2e-warrant","groups":["system:masters"]}`
	for what, h := range map[string]http.Header{
		"alice in system:masters":         {"Impersonate-User": {"alice"}, "Impersonate-Group": {"system:masters"}},
		"carol, not an admin":             {"Impersonate-User": {"carol"}},
		"the tenant's controller manager": {"Impersonate-User": {"system:kube-controller-manager"}},
		"the probe user with a system:masters warrant": {"Impersonate-User": {mount.ProbeUser},
			"Impersonate-Extra-Authorization.kcp.io%2fwarrant": {warrant}},
		"alice with a system:masters warrant": {"Impersonate-User": {"alice"},
			"Impersonate-Extra-Authorization.kcp.io%2fwarrant": {warrant}},
	} {
		if code := tenantDo(ctx, t, vm, token, "/api/v1/secrets", h); code != http.StatusForbidden {
			t.Errorf("the mount credential impersonating %s lists the tenant's Secrets: %d, want 403", what, code)
		}
	}
}

// TestAgentRunsComputeVMs: knotless-agent, with a kubeconfig for its
// bidder workspace only and the identity it ships with (the
// ServiceAccount and ClusterRole of deploy/agent/rbac.yaml, applied by
// the workspace's owner alice), runs a ComputeVM
// as a tenant kcp process with its own CA: Running with its endpoint, CA
// and fingerprint, and a credential (owned by the VM) that may
// impersonate on the tenant and do nothing itself: only the VM's named
// admins (never system:masters, a user the VM does not name, or a kcp
// warrant carrying system:masters). A kill -9 of the agent
// leaves the VM running and the restarted agent adopts it (no second
// process). A kill -9 of the VM's process makes it Lost, never restarted.
// Deleting a ComputeVM stops its process. Figures: ComputeVM created ->
// Running; agent CPU and RSS per VM.
func TestAgentRunsComputeVMs(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	name := env.prefix + "-agent"
	c := marketWorkspace(ctx, t, name)
	// The agent runs with the identity it ships with (deploy/agent/rbac.yaml) only.
	a := startAgent(ctx, t, name, agentKubeconfig(ctx, t, c, name))

	start := time.Now()
	vm := &computev1alpha1.ComputeVM{ObjectMeta: metav1.ObjectMeta{Name: "vm-a", Namespace: "default"},
		Spec: computev1alpha1.ComputeVMSpec{ContractName: "manual", Driver: "process", CPUMillis: 1000, MemoryMiB: 1024,
			Admins: computev1alpha1.TenantAdmins{Users: []string{"alice"}}}}
	create(ctx, t, c, vm)
	vm = waitVM(ctx, t, c, "vm-a", "ComputeVM Running", 3*time.Minute, func(vm *computev1alpha1.ComputeVM) bool {
		return vm.Status.Phase == computev1alpha1.VMRunning && vm.Status.CredentialSecret != ""
	})
	t.Logf("FIGURE ComputeVM created -> Running (a tenant kcp process): %s", time.Since(start).Round(time.Millisecond))
	if vm.Status.CAFingerprint == "" || vm.Status.Endpoint == "" {
		t.Fatalf("status %+v", vm.Status)
	}
	pids := process.PIDs(a.root)
	if len(pids) != 1 {
		t.Fatalf("VM processes %v", pids)
	}
	token := vmToken(ctx, t, c, vm)
	if code := tenantGet(ctx, t, vm, token, "/api/v1/namespaces", "", ""); code != http.StatusForbidden {
		t.Errorf("the mount credential itself lists namespaces: %d (want 403: it may only impersonate)", code)
	}
	// The tenant lets alice list namespaces (its admin's RBAC); the mount
	// credential, impersonating alice, may.
	admin, err := clientcmd.BuildConfigFromFlags("", filepath.Join(a.root, string(vm.UID), "kcp", "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	tc, err := framework.ClientFor(admin, root)
	if err != nil {
		t.Fatal(err)
	}
	create(ctx, t, tc,
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e:alice"}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list"}}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e:alice"}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "e2e:alice"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "alice"}}})
	if code := tenantGet(ctx, t, vm, token, "/api/v1/namespaces", "alice", ""); code != http.StatusOK {
		t.Errorf("impersonating alice: %d, want 200", code)
	}
	mountTokenIsNoSuperuser(ctx, t, vm, token)
	// The workspace's owner (its admin) cannot make a StateSync of the VM,
	// which the agent would run as the tenant's admin: only the provider
	// creates them (the export's maximal permission policy).
	cannotMakeStateSync(ctx, t, c, vm, "the workspace's owner")
	if rss, err := a.proc.RSS(); err == nil {
		cpu, _ := a.proc.CPU()
		t.Logf("FIGURE agent with 1 VM: RSS %d MiB, CPU %s (the VM's own process not included)", rss>>20, cpu.Round(time.Millisecond))
	}

	// kill -9 of the agent: the VM runs on and is adopted.
	a.proc.Kill9()
	a.start(t)
	time.Sleep(3 * time.Second)
	waitVM(ctx, t, c, "vm-a", "ComputeVM still Running after the agent restarted", time.Minute, func(vm *computev1alpha1.ComputeVM) bool {
		return vm.Status.Phase == computev1alpha1.VMRunning
	})
	if got := process.PIDs(a.root); len(got) != 1 || got[0] != pids[0] {
		t.Errorf("VM processes after the agent restart %v, want %v", got, pids)
	}

	// kill -9 of the VM's process: Lost, not started again.
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitVM(ctx, t, c, "vm-a", "ComputeVM Lost", time.Minute, func(vm *computev1alpha1.ComputeVM) bool {
		return vm.Status.Phase == computev1alpha1.VMLost && vm.Status.Reason == computev1alpha1.ReasonProcessGone && vm.Status.Endpoint == ""
	})
	time.Sleep(3 * time.Second)
	if got := process.PIDs(a.root); len(got) != 1 || got[0] != pids[0] {
		t.Errorf("a lost VM was started again: %v", got)
	}

	// Deleting a ComputeVM stops its process and forgets it.
	if err := c.Delete(ctx, vm); err != nil {
		t.Fatal(err)
	}
	waitPDS(ctx, t, "the lost VM's ComputeVM gone", func() (bool, string) {
		err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "vm-a"}, &computev1alpha1.ComputeVM{})
		return err != nil, fmt.Sprint(err)
	})
	if got := process.PIDs(a.root); len(got) != 0 {
		t.Errorf("VM directories left after deletion: %v", got)
	}
	entries, _ := os.ReadDir(a.root)
	if len(entries) != 0 {
		t.Errorf("the process driver kept %d directories", len(entries))
	}
}

// cannotMakeStateSync checks that c (who) can make no StateSync of vm,
// neither by create nor by a server-side apply (a patch that creates: the
// apiserver authorizes create for it too, so the export's maximal
// permission policy, which leaves patch to everyone, still refuses it).
func cannotMakeStateSync(ctx context.Context, t *testing.T, c client.Client, vm *computev1alpha1.ComputeVM, who string) {
	t.Helper()
	ss := &computev1alpha1.StateSync{ObjectMeta: metav1.ObjectMeta{Name: "forged-export", Namespace: vm.Namespace,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: computev1alpha1.GroupVersion.String(), Kind: "ComputeVM", Name: vm.Name, UID: vm.UID, Controller: ptr.To(true)}}},
		Spec: computev1alpha1.StateSyncSpec{VMName: vm.Name, Direction: computev1alpha1.Export, Resources: []computev1alpha1.GroupResource{{Resource: "secrets"}}}}
	if err := c.Create(ctx, ss.DeepCopy()); !apierrors.IsForbidden(err) {
		t.Errorf("%s creating a StateSync of the VM: %v, want Forbidden", who, err)
	}
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ss)
	if err != nil {
		t.Fatal(err)
	}
	applied := &unstructured.Unstructured{Object: raw}
	applied.SetGroupVersionKind(computev1alpha1.GroupVersion.WithKind("StateSync"))
	delete(applied.Object, "status")
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(applied), client.FieldOwner("forger")); !apierrors.IsForbidden(err) {
		t.Errorf("%s applying a StateSync of the VM: %v, want Forbidden", who, err)
	}
}

// jwtClaims are the claims of a JWT, unverified (what a test checks of a
// token it holds).
func jwtClaims(t *testing.T, token string) map[string]any {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Errorf("not a JWT (%d parts)", len(parts))
		return nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Errorf("the JWT's claims: %v", err)
		return nil
	}
	claims := map[string]any{}
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Errorf("the JWT's claims: %v", err)
	}
	return claims
}
