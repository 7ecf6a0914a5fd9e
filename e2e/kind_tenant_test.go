package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/driver/kind"
	mdeal "github.com/knotless-dev/knotless/internal/market/deal"
)

// kindParts are what the kind driver needs on this machine.
type kindParts struct {
	kind, shim, nodeImage, testImage string
}

// script runs one of the repository's scripts and returns the last line
// it printed.
func script(t *testing.T, repoRoot string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), filepath.Join(repoRoot, name), args...)
	cmd.Dir = repoRoot
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// kindSetup skips the test when docker is unavailable; otherwise it
// builds (or takes from the tools cache) the node image, the pinned kind
// and the test image, and registers the docker runtime kind's nodes need
// here.
func kindSetup(t *testing.T) kindParts {
	t.Helper()
	if out, err := exec.CommandContext(t.Context(), "docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Skipf("docker is unavailable, so no kind VM can run: %v: %s", err, strings.TrimSpace(string(out)))
	}
	repoRoot, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var p kindParts
	p.nodeImage = script(t, repoRoot, "hack/node-image/build.sh")
	script(t, repoRoot, "hack/tool.sh", "kind", "sigs.k8s.io/kind")
	p.kind = filepath.Join(repoRoot, "bin", "kind")
	cmd := exec.CommandContext(t.Context(), filepath.Join(repoRoot, "hack/node-image/docker-runtime.sh"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/node-image/docker-runtime.sh: %v", err)
	}
	p.shim = strings.TrimSpace(string(out))
	p.testImage = script(t, repoRoot, "hack/testimage/build.sh")
	return p
}

// mustRead is the content of a file.
func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// kindAgent returns the agent flags of a kind driver made of k, whose VMs
// are kept in the returned folder, and removes every VM left there when
// the test ends (the VMs outlive the agent on purpose).
func kindAgent(t *testing.T, k kindParts) ([]string, string) {
	t.Helper()
	kroot := filepath.Join(t.TempDir(), "kind")
	kd := &kind.Driver{Root: kroot, Kind: k.kind, PathPrefix: k.shim}
	t.Cleanup(func() {
		for _, id := range kind.VMs(kroot) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			if err := kd.Terminate(ctx, driver.VM{ID: id}); err != nil {
				t.Logf("removing kind VM %s: %v", id, err)
			}
			cancel()
		}
	})
	args := []string{"--node-image", k.nodeImage, "--kind", k.kind, "--kind-root", kroot, "--preload-image", k.testImage}
	if k.shim != "" {
		args = append(args, "--kind-path-prefix", k.shim)
	}
	return args, kroot
}

// docker runs docker and returns its output.
func docker(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// nodeRSS is the RSS of a kind node container's processes, from its
// cgroup (cgroup v1; 0 when it cannot be read).
func nodeRSS(ctx context.Context, node string) int64 {
	id, err := docker(ctx, "inspect", "-f", "{{.Id}}", node)
	if err != nil {
		return 0
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/docker", id, "memory.stat"))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "total_rss "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// TestKindTenant: a requester's first tenant, from beta (the process
// driver), is released with an export; wanted again, it is restored into a
// VM from acme, whose driver is kind (StateSync from a process tenant to a
// Kubernetes one: the namespace and ConfigMap alice made are there). As
// the requester's kcp user alice, through the mount
// (kcp-front-proxy and the mount proxy), runs a Deployment of the test
// image (preloaded by the agent: the node cannot pull) whose pod Runs and
// logs its cgroup limits, and a pod asking more CPU than the shape stays
// Pending with the scheduler's reason; a pod allocating past the shape is
// killed while the node and the API stay up; kubectl exec, attach and port-forward work
// through the mount; a hostname the requester associates in its repo with
// a Service of the Deployment is served by the bidder's gateway
// (gateway_test.go). The ComputeVM shows the shape the node container is
// held to (docker) and the node's allocatable. A kill -9 of the agent
// while the VM provisions, and again while it runs, leaves the cluster
// as it is and the agent adopts it (one cluster, provisioned once, the
// same container); a docker kill of the node makes the VM
// Lost; releasing the VM removes the node container, its volumes and its
// network. One kind VM serves every step. Figures: setup, VM created ->
// Running, node RSS idle and with one pod, the test's cost.
func TestKindTenant(t *testing.T) {
	runLast(t)
	defer failWithLogs(t)
	ctx := t.Context()
	begin := time.Now()
	k := kindSetup(t)
	t.Logf("FIGURE kind setup (node image, kind, test image, from the cache when warm): %s", time.Since(begin).Round(time.Millisecond))

	args, kroot := kindAgent(t, k)
	gwArgs, gw := gatewayAgent(t)
	d, a, _ := tenantDealWith(ctx, t, "kind", append(args, gwArgs...), "beta", "acme")
	d.bidderWith(ctx, t, "acme", marketv1alpha1.DriverKind, offerOf("small", 1000, 1024, 30, 1))
	first := processTenantReleased(ctx, t, d)

	// Wanted again, restored from the process tenant's snapshot: only acme
	// (kind) has capacity left.
	start := time.Now()
	mergePatch(ctx, t, d.app, getMR(ctx, t, d.app, "vms"), map[string]any{"replicas": 1, "restoreFrom": first})
	bc := contractOf(ctx, t, d.bid, "acme", "the bidder's contract", func(*marketv1alpha1.ComputeContract) bool { return true })
	vmMade := time.Since(start)
	// kill -9 of the agent while the VM provisions: the restarted agent
	// adopts the provisioning, no second cluster is made.
	waitVM(ctx, t, d.bid, bc.Name, "the kind VM provisioning", 2*time.Minute, func(vm *computev1alpha1.ComputeVM) bool {
		return vm.Status.Phase == computev1alpha1.VMProvisioning && len(kind.VMs(kroot)) == 1
	})
	a.proc.Kill9()
	a.start(t)
	vm := waitVM(ctx, t, d.bid, bc.Name, "the kind VM Running", 6*time.Minute, func(vm *computev1alpha1.ComputeVM) bool {
		return vm.Status.Phase == computev1alpha1.VMRunning
	})
	running := time.Since(start)
	rc := contractOf(ctx, t, d.app, "vms", "the requester's contract Active (the tenant mounted)", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractActive
	})
	// The mount reaches the kind tenant as the buyer's DID: its API server
	// asks the agent's webhook (on the VM network's gateway).
	if claims := jwtClaims(t, mountTokenOf(ctx, t, env.home(), d.app, rc.Name)); vm.Status.ServiceID == "" || claims["aud"] != vm.Status.ServiceID || claims["iss"] != d.accounts["buyer"].DID {
		t.Errorf("the kind tenant's mount token has claims %v, want the buyer's for the VM's service identity %q", claims, vm.Status.ServiceID)
	}
	if nodes, err := docker(ctx, "ps", "-a", "-q", "--filter", "label=io.x-k8s.kind.cluster="+kind.ClusterName(string(vm.UID))); err != nil || len(strings.Fields(nodes)) != 1 {
		t.Errorf("the VM's kind node containers after the agent was killed while provisioning: %q (%v), want one", nodes, err)
	}
	if strings.Count(mustRead(t, filepath.Join(kroot, string(vm.UID), "create.log")), "Creating cluster") != 1 {
		t.Error("the VM was provisioned more than once")
	}
	t.Logf("FIGURE MarketRequester created -> kind VM Running: %s (ComputeVM made after %s; VM created -> Running %s); -> mounted %s",
		running.Round(time.Millisecond), vmMade.Round(time.Millisecond), (running - vmMade).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	// The shape: the node container's docker limits and the node's
	// allocatable, in the status and in docker.
	cluster := kind.ClusterName(string(vm.UID))
	node := kind.NodeName(cluster)
	e := vm.Status.Enforced
	if e == nil || e.LimitCPUMillis != 1000 || e.LimitMemoryMiB != 1024 || e.AllocatableCPUMillis != 1000 || e.AllocatableMemoryMiB > 1024 || e.AllocatableMemoryMiB < 900 {
		t.Errorf("enforced shape %+v, want limits 1000m/1024 MiB and allocatable 1000m and about 1024 MiB", e)
	}
	if got, err := docker(ctx, "inspect", "-f", "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}} {{.HostConfig.MemorySwap}}", node); err != nil || got != "1000000000 1073741824 1073741824" {
		t.Errorf("the node container's limits: %q, %v", got, err)
	}
	volumes, err := docker(ctx, "inspect", "-f", `{{range .Mounts}}{{if eq .Type "volume"}}{{.Name}} {{end}}{{end}}`, node)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(vm.Status.Endpoint, "https://127.0.0.1:") {
		t.Errorf("endpoint %q, want the tenant host", vm.Status.Endpoint)
	}

	// alice, through kcp-front-proxy, in the mounted workspace.
	cs := mountClient(t, "alice", d.appWS, rc.Name)
	if err := framework.Eventually(ctx, 2*time.Minute, "nodes through the mount as alice", func(ctx context.Context) (bool, string, error) {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return len(nodes.Items) == 1, fmt.Sprintf("%d nodes", len(nodes.Items)), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := settingsRestored(ctx, cs, "the process tenant's ConfigMap in the kind tenant as alice"); err != nil {
		t.Error(err)
	}
	t.Logf("FIGURE process tenant released with its export -> restored into a kind tenant, read through the mount: %s", time.Since(start).Round(time.Millisecond))
	// A client certificate of the kind tenant; its renewal is checked
	// after the subtests below, a minute later.
	carol := certificateOnKindTenant(ctx, t, d.app, rc.Name)
	// A pod of the kind tenant reads the requester's workspace with its
	// GuestIdentityGrant's kubeconfig, through kcp-front-proxy.
	ga := guestIdentity(ctx, t, d, rc.Name, cs)
	guestPod(ctx, t, d, cs, k.testImage)
	guestGone(ctx, t, d, cs, ga)
	idle := nodeRSS(ctx, node)
	t.Logf("FIGURE kind node RSS idle: %d MiB (%d idle VMs in 24 GiB)", idle>>20, (int64(24)<<30)/max(idle, 1))

	t.Run("a Deployment of the preloaded image runs and logs its limits", func(t *testing.T) {
		pod := runTestImage(ctx, t, cs, k.testImage)
		// A pod is Running before its first line is written: the log is
		// read until it shows the limits.
		if err := framework.Eventually(ctx, 30*time.Second, "the pod's log shows its limits (64Mi, 100m)", func(ctx context.Context) (bool, string, error) {
			logs, err := cs.CoreV1().Pods("default").GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
			if err != nil {
				return false, err.Error(), nil
			}
			return strings.Contains(string(logs), "memory limit 67108864, cpu quota 10000/100000"), fmt.Sprintf("log %q", logs), nil
		}); err != nil {
			t.Error(err)
		}
		t.Logf("FIGURE kind node RSS with one pod: %d MiB", nodeRSS(ctx, node)>>20)
	})

	t.Run("a Gateway puts a Service of the tenant on a hostname the bidder's gateway serves", func(t *testing.T) {
		gatewayOnKindTenant(ctx, t, d, rc, cs, node, gw)
	})

	t.Run("an SshGateway lets a session of the buyer's DID, with the key its repo publishes, into a pod", func(t *testing.T) {
		sshOnKindTenant(ctx, t, d, rc, cs, gw)
	})

	t.Run("kubectl exec, attach and port-forward through the mount", func(t *testing.T) {
		cfg, err := env.frontProxy.UserConfig("alice", root.Join(d.appWS).Join(rc.Name).String())
		if err != nil {
			t.Fatal(err)
		}
		streams(ctx, t, cfg, cs)
	})

	t.Run("a pod asking more CPU than the shape stays Pending", func(t *testing.T) {
		big := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "too-big", Namespace: "default"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "s", Image: k.testImage, ImagePullPolicy: corev1.PullNever,
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1001m")}}}}}}
		if _, err := cs.CoreV1().Pods("default").Create(ctx, big, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var msg string
		if err := framework.Eventually(ctx, time.Minute, "the big pod unschedulable", func(ctx context.Context) (bool, string, error) {
			p, err := cs.CoreV1().Pods("default").Get(ctx, "too-big", metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					msg = c.Message
					return strings.Contains(c.Message, "Insufficient cpu"), c.Message, nil
				}
			}
			return false, string(p.Status.Phase), nil
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("the scheduler: %s", msg)
		time.Sleep(3 * time.Second)
		if p, err := cs.CoreV1().Pods("default").Get(ctx, "too-big", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending {
			t.Errorf("the big pod: %v, %v", p.Status.Phase, err)
		}
	})

	t.Run("a pod allocating past the shape is killed, the node and the API stay up", func(t *testing.T) {
		// Opt-in: on a quiet machine the hog is OOMKilled after about 100 s
		// of memory pressure while the node and its API stay up (three
		// runs), but in a full CI run on 2 cores the same pressure once
		// left the tenant's API server unanswering for over 3 minutes and
		// the VM Provisioning after it: the claim holds, the timing does
		// not, and every later step of this test would pay for it.
		if os.Getenv("KNOTLESS_E2E_KIND_OOM") == "" {
			t.Skip("set KNOTLESS_E2E_KIND_OOM=1 to run the OOM step (about 100 s of memory pressure in the VM)")
		}
		hog := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hog", Namespace: "default"},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "hog", Image: k.testImage,
				ImagePullPolicy: corev1.PullNever, Command: []string{"/testimage", "alloc", "1536"}}}}}
		if _, err := cs.CoreV1().Pods("default").Create(ctx, hog, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var term *corev1.ContainerStateTerminated
		if err := framework.Eventually(ctx, 3*time.Minute, "the hog killed", func(ctx context.Context) (bool, string, error) {
			p, err := cs.CoreV1().Pods("default").Get(ctx, "hog", metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			for _, c := range p.Status.ContainerStatuses {
				if c.State.Terminated != nil {
					term = c.State.Terminated
					return true, "", nil
				}
			}
			return false, string(p.Status.Phase), nil
		}); err != nil {
			t.Fatal(err)
		}
		// Killed by the kernel (the node container's memory or the
		// pods' cgroup), not ended by itself: it never holds 1536 MiB.
		if term.ExitCode != 137 {
			t.Errorf("the hog ended %+v, want killed (137)", term)
		}
		t.Logf("the hog: %s, exit code %d", term.Reason, term.ExitCode)
		if logs, err := cs.CoreV1().Pods("default").GetLogs("hog", &corev1.PodLogOptions{}).DoRaw(ctx); err == nil && strings.Contains(string(logs), "holding") {
			t.Errorf("the hog held all it asked for: %q", logs)
		}
		if err := framework.Eventually(ctx, 2*time.Minute, "the node Ready and the Deployment's pod Running", func(ctx context.Context) (bool, string, error) {
			n, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil || len(n.Items) != 1 {
				return false, fmt.Sprint(err), nil
			}
			for _, c := range n.Items[0].Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
					return false, "node not Ready: " + c.Message, nil
				}
			}
			dep, err := cs.AppsV1().Deployments("default").Get(ctx, "limits", metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			return dep.Status.ReadyReplicas == 1, fmt.Sprintf("%d ready", dep.Status.ReadyReplicas), nil
		}); err != nil {
			t.Fatal(err)
		}
		if st, err := docker(ctx, "inspect", "-f", "{{.State.Running}} {{.RestartCount}}", node); err != nil || st != "true 0" {
			t.Errorf("the node container: %q (%v), want running, never restarted", st, err)
		}
	})

	t.Run("a kill -9 of the agent: the cluster is adopted", func(t *testing.T) {
		before, err := docker(ctx, "inspect", "-f", "{{.Id}}", node)
		if err != nil {
			t.Fatal(err)
		}
		a.proc.Kill9()
		a.start(t)
		time.Sleep(3 * time.Second)
		waitVM(ctx, t, d.bid, bc.Name, "the kind VM Running after the agent restarted", 2*time.Minute, func(vm *computev1alpha1.ComputeVM) bool {
			return vm.Status.Phase == computev1alpha1.VMRunning
		})
		after, err := docker(ctx, "inspect", "-f", "{{.Id}}", node)
		if err != nil || after != before {
			t.Errorf("the node container changed: %s -> %s (%v)", before, after, err)
		}
		if nodes, err := docker(ctx, "ps", "-a", "-q", "--filter", "label=io.x-k8s.kind.cluster="+cluster); err != nil || len(strings.Fields(nodes)) != 1 {
			t.Errorf("the VM's kind node containers %q (%v), want one", nodes, err)
		}
		if vms := kind.VMs(kroot); len(vms) != 1 {
			t.Errorf("the driver knows %d VMs, want 1", len(vms))
		}
		if _, err := cs.AppsV1().Deployments("default").Get(ctx, "limits", metav1.GetOptions{}); err != nil {
			t.Errorf("the tenant through the mount after the agent restarted: %v", err)
		}
	})

	t.Run("the ClusterClientCertificate is renewed, then deleted with its binding", func(t *testing.T) {
		certificateRenewed(ctx, t, d.app, cs, carol)
	})

	t.Run("a docker kill of the node: the VM is Lost", func(t *testing.T) {
		if out, err := docker(ctx, "kill", node); err != nil {
			t.Fatalf("docker kill: %v: %s", err, out)
		}
		// The bidder ends the contract of a Lost VM (vm-lost) and deletes
		// the VM, which can happen between two looks: the VM is seen Lost,
		// or its contract Failed as vm-lost, which only a Lost VM makes.
		var lost *computev1alpha1.ComputeVM
		if err := framework.Eventually(ctx, 2*time.Minute, "the kind VM Lost", func(ctx context.Context) (bool, string, error) {
			vm := &computev1alpha1.ComputeVM{}
			if err := d.bid.Get(ctx, client.ObjectKey{Namespace: "default", Name: bc.Name}, vm); err == nil && vm.Status.Phase == computev1alpha1.VMLost {
				lost = vm
				return true, "", nil
			}
			cc := &marketv1alpha1.ComputeContract{}
			if err := d.bid.Get(ctx, client.ObjectKey{Namespace: "default", Name: bc.Name}, cc); err != nil {
				return false, err.Error(), nil
			}
			return cc.Status.Phase == marketv1alpha1.ContractFailed && cc.Status.Reason == string(mdeal.VMLost), string(cc.Status.Phase) + " " + cc.Status.Reason, nil
		}); err != nil {
			t.Fatal(err)
		}
		if lost == nil {
			t.Log("the VM was Lost and already removed with its contract (Failed, vm-lost)")
		} else if lost.Status.Reason != computev1alpha1.ReasonProcessGone || lost.Status.Endpoint != "" || lost.Status.Enforced != nil {
			t.Errorf("lost VM status %+v", lost.Status)
		}
		// The lease ended: the hostname the Gateway "nothing" claimed for
		// it is served no more, and the Gateway deleted its record.
		gatewayLeaseEnded(ctx, t, d, gw)
		// The requester's replica goes back to the market (docs/market.md,
		// lease.vm-lost): a new kind VM is bought and mounted, and alice
		// lists its namespaces through the new mount.
		lostAt := time.Now()
		next := contractOf(ctx, t, d.app, "vms", "the requester's next contract Active (a new kind VM mounted)", func(cc *marketv1alpha1.ComputeContract) bool {
			return cc.Name != rc.Name && cc.Status.Phase == marketv1alpha1.ContractActive
		})
		if err := framework.Eventually(ctx, 2*time.Minute, "namespaces through the next mount as alice", func(ctx context.Context) (bool, string, error) {
			names, err := namespaceNames(ctx, mountClient(t, "alice", d.appWS, next.Name))
			if err != nil {
				return false, err.Error(), nil
			}
			return slices.Contains(names, "default"), strings.Join(names, ","), nil
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("FIGURE kind VM Lost -> the replica's next kind VM mounted: %s", time.Since(lostAt).Round(time.Millisecond))
	})

	// Releasing the VM (the requester is deleted) removes the node
	// container, its volumes and its network.
	if err := d.app.Delete(ctx, getMR(ctx, t, d.app, "vms")); err != nil {
		t.Fatal(err)
	}
	if err := framework.Eventually(ctx, 4*time.Minute, "the kind VMs gone", func(ctx context.Context) (bool, string, error) {
		var vms computev1alpha1.ComputeVMList
		if err := d.bid.List(ctx, &vms, client.InNamespace("default")); err != nil {
			return false, err.Error(), nil
		}
		left := kind.VMs(kroot)
		return len(vms.Items) == 0 && len(left) == 0, fmt.Sprintf("%d ComputeVMs, %d kind VMs", len(vms.Items), len(left)), nil
	}); err != nil {
		t.Fatal(err)
	}
	if out, err := docker(ctx, "ps", "-a", "-q", "--filter", "name="+node); err != nil || out != "" {
		t.Errorf("the node container is left: %q, %v", out, err)
	}
	if out, err := docker(ctx, "network", "ls", "-q", "--filter", "name="+cluster); err != nil || out != "" {
		t.Errorf("the VM's network is left: %q, %v", out, err)
	}
	for _, v := range strings.Fields(volumes) {
		if _, err := docker(ctx, "volume", "inspect", v); err == nil {
			t.Errorf("the node's volume %s is left", v)
		}
	}
	if entries, _ := os.ReadDir(kroot); len(entries) != 0 {
		t.Errorf("the kind driver kept %d directories", len(entries))
	}
	t.Logf("FIGURE TestKindTenant cost: %s (setup included)", time.Since(begin).Round(time.Second))
}

// processTenantReleased buys the requester "vms" a tenant from beta, a
// process-driver bidder cheaper than acme, has alice make the namespace
// "shop" and the ConfigMap "settings" in it through the mount, then takes
// beta's capacity away and lowers the replicas to 0: the tenant is
// released with an export (StateSync). It returns the released contract,
// whose snapshot a restoreFrom names.
func processTenantReleased(ctx context.Context, t *testing.T, d *deal) string {
	t.Helper()
	d.bidder(ctx, t, "beta", offerOf("small", 1000, 1024, 20, 1))
	spec := exportingSpec("buyer")
	d.requester(ctx, t, "vms", spec)
	rc := contractOf(ctx, t, d.app, "vms", "the process tenant mounted", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractActive
	})
	if rc.Spec.BidderDID != d.accounts["beta"].DID {
		t.Fatalf("the first contract went to %s, want beta (the process driver)", rc.Spec.BidderDID)
	}
	newCertificate(ctx, t, d.app, "unsigned", rc.Name, nil)
	cs := mountClient(t, "alice", d.appWS, rc.Name)
	if err := framework.Eventually(ctx, 2*time.Minute, "alice makes a namespace and a ConfigMap in the process tenant", func(ctx context.Context) (bool, string, error) {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return false, err.Error(), nil
		}
		_, err := cs.CoreV1().ConfigMaps("shop").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"currency": "EUR"}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return false, err.Error(), nil
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	certificateUnsupported(ctx, t, d.app, rc.Name)
	mergePatch(ctx, t, d.bid, getMB(ctx, t, d.bid, "beta"), map[string]any{"offers": []marketv1alpha1.Offer{offerOf("small", 1000, 1024, 20, 0)}})
	mergePatch(ctx, t, d.app, getMR(ctx, t, d.app, "vms"), map[string]any{"replicas": 0})
	contractOf(ctx, t, d.app, "vms", "the process tenant released with its export", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Name == rc.Name && cc.Status.Phase == marketv1alpha1.ContractCompleted && cc.Status.Reason == string(mdeal.ReplicasLowered)
	})
	return rc.Name
}

// settingsRestored waits up to a minute for the ConfigMap shop/settings
// (currency EUR) that a restored snapshot brings into the tenant cs.
func settingsRestored(ctx context.Context, cs kubernetes.Interface, what string) error {
	return framework.Eventually(ctx, time.Minute, what, func(ctx context.Context) (bool, string, error) {
		cm, err := cs.CoreV1().ConfigMaps("shop").Get(ctx, "settings", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return cm.Data["currency"] == "EUR", fmt.Sprint(cm.Data), nil
	})
}

// streams runs what kubectl exec and attach (WebSocket, and SPDY as older kubectls
// do) and kubectl port-forward (SPDY) do against the pod of the
// Deployment "limits", with the user's config cfg.
func streams(ctx context.Context, t *testing.T, cfg *rest.Config, cs kubernetes.Interface) {
	t.Helper()
	pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=limits"})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("the Deployment's pod: %v", err)
	}
	pod := pods.Items[0].Name
	execURL := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "server", Command: []string{"/testimage", "limits"}, Stdout: true, Stderr: true}, clientgoscheme.ParameterCodec).URL()
	for _, proto := range []string{"websocket", "spdy"} {
		exe := executor(t, cfg, proto, execURL)
		var stdout, stderr strings.Builder
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = exe.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
		cancel()
		if err != nil || !strings.Contains(stdout.String(), "memory limit 67108864") {
			t.Errorf("exec (%s) through the mount: %v; stdout %q stderr %q", proto, err, stdout.String(), stderr.String())
		}
	}

	// kubectl attach: a line written to the container's stdin comes back
	// on its stdout (the server echoes its stdin).
	attachURL := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name(pod).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: "server", Stdin: true, Stdout: true, Stderr: true}, clientgoscheme.ParameterCodec).URL()
	for _, proto := range []string{"websocket", "spdy"} {
		exe := executor(t, cfg, proto, attachURL)
		line := "attached-" + proto
		stdin, feed := io.Pipe()
		stdout := &watchedWriter{want: "stdin: " + line, seen: make(chan struct{})}
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		go func() {
			_, _ = io.WriteString(feed, line+"\n")
			select { // hang up once the echo is seen
			case <-stdout.seen:
			case <-ctx.Done():
			}
			cancel()
			_ = feed.Close()
		}()
		err = exe.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: io.Discard})
		select {
		case <-stdout.seen:
		default:
			t.Errorf("attach (%s) through the mount: %v; stdout %q, want %q", proto, err, stdout.String(), "stdin: "+line)
		}
	}

	pfURL := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name(pod).SubResource("portforward").URL()
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop, ready := make(chan struct{}), make(chan struct{})
	defer close(stop)
	var pfOut, pfErr strings.Builder
	fw, err := portforward.NewOnAddresses(spdy.NewDialer(upgrader, &http.Client{Transport: rt}, "POST", pfURL), []string{"127.0.0.1"}, []string{"0:8080"}, stop, ready, &pfOut, &pfErr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("port-forward through the mount: %v (%s)", err, pfErr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("port-forward through the mount: not ready in 30 s")
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		t.Fatalf("port-forward ports %v, %v", ports, err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/", ports[0].Local))
	if err != nil {
		t.Fatalf("GET through the port-forward: %v (%s)", err, pfErr.String())
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"memoryLimit":"67108864"`) {
		t.Errorf("GET through the port-forward: %d %q", resp.StatusCode, body)
	}
}

// executor is what kubectl streams exec and attach with: the WebSocket
// protocol (kubectl since 1.31) or SPDY (older kubectls).
func executor(t *testing.T, cfg *rest.Config, proto string, u *url.URL) remotecommand.Executor {
	t.Helper()
	var exe remotecommand.Executor
	var err error
	if proto == "websocket" {
		exe, err = remotecommand.NewWebSocketExecutor(cfg, "GET", u.String())
	} else {
		exe, err = remotecommand.NewSPDYExecutor(cfg, "POST", u)
	}
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// watchedWriter keeps what is written and closes seen once it holds want.
type watchedWriter struct {
	mu   sync.Mutex
	buf  strings.Builder
	want string
	seen chan struct{}
}

func (w *watchedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	had := strings.Contains(w.buf.String(), w.want)
	w.buf.Write(p)
	if !had && strings.Contains(w.buf.String(), w.want) {
		close(w.seen)
	}
	return len(p), nil
}

func (w *watchedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// runTestImage makes the Deployment "limits" of image (64Mi, 100m) in
// the tenant's default namespace and returns the name of its pod once it
// is Running and Ready.
func runTestImage(ctx context.Context, t *testing.T, cs kubernetes.Interface, image string) string {
	t.Helper()
	labels := map[string]string{"app": "limits"}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "limits", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "server", Image: image, ImagePullPolicy: corev1.PullNever, Stdin: true,
					Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
					Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
						Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}}}}}}}}
	if _, err := cs.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var name string
	if err := framework.Eventually(ctx, 3*time.Minute, "the Deployment's pod Running", func(ctx context.Context) (bool, string, error) {
		pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=limits"})
		if err != nil {
			return false, err.Error(), nil
		}
		if len(pods.Items) == 0 {
			return false, "no pod", nil
		}
		p := pods.Items[0]
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.Status.Phase == corev1.PodRunning {
				name = p.Name
				return true, "", nil
			}
		}
		msg := string(p.Status.Phase)
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Waiting != nil {
				msg += " " + s.State.Waiting.Reason + ": " + s.State.Waiting.Message
			}
		}
		return false, msg, nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE Deployment created through the mount -> pod Running: %s", time.Since(start).Round(time.Millisecond))
	return name
}
