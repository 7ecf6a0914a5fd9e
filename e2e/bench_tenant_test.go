package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/controllers/marketrequester"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/driver/kind"
	"github.com/knotless-dev/knotless/internal/driver/process"
)

// TestTenantWalkTimes prints the p50 (and the spread) over N walks of a
// MarketRequester created -> `kubectl get namespaces` through the mounted
// tenant, split into market, provisioning and mount; then the same for a
// migration (a snapshot taken from the first walk's tenant, restored into
// each new one), with the import in the provisioning part; and the
// agent's RSS and CPU per VM. Run with KNOTLESS_E2E_TENANT_BENCH=N (make
// bench-tenant); it asserts only that every walk ends mounted. With
// KNOTLESS_E2E_TENANT_DRIVER=kind (make bench-tenant DRIVER=kind) the
// bidder runs kind VMs, and each plain walk also runs a Deployment of the
// test image through the mount (MarketRequester -> pod Running).
func TestTenantWalkTimes(t *testing.T) {
	spec := os.Getenv("KNOTLESS_E2E_TENANT_BENCH")
	if spec == "" {
		t.Skip("set KNOTLESS_E2E_TENANT_BENCH=N (make bench-tenant) to run")
	}
	n, _ := strconv.Atoi(spec)
	n = max(n, 1)
	defer failWithLogs(t)
	ctx := t.Context()
	drv := marketv1alpha1.Driver(os.Getenv("KNOTLESS_E2E_TENANT_DRIVER"))
	var agentArgs []string
	var kroot, testImage string
	if drv == marketv1alpha1.DriverKind {
		k := kindSetup(t)
		agentArgs, kroot = kindAgent(t, k)
		testImage = k.testImage
	}
	d, a, _ := tenantDealWith(ctx, t, "bt", agentArgs, "acme")
	d.bidderWith(ctx, t, "acme", drv, offerOf("small", 1000, 1024, 30, 1))
	spec0 := requesterSpec("buyer", 1000, 1024, 50, 5)
	spec0.TenantAdmins.Users = []string{"alice"}
	spec0.StateSync = marketv1alpha1.StateSyncPolicy{Mode: marketv1alpha1.StateSyncExport, Resources: []computev1alpha1.GroupResource{{Resource: "configmaps"}}}

	type walk struct{ market, provisioning, total, pod time.Duration }
	// one walk: replicas 1 (with restoreFrom), until the namespaces (or
	// the restored ConfigMap) are read through the mount.
	one := func(restore string) (walk, *marketv1alpha1.ComputeContract) {
		t.Helper()
		// The walk's contract is the one that did not exist before it
		// (an earlier walk's may still be finishing its release).
		before := map[string]bool{}
		for _, cc := range contractsOwnedBy(ctx, t, d.app, "vms") {
			before[cc.Name] = true
		}
		start := time.Now()
		mergePatch(ctx, t, d.app, getMR(ctx, t, d.app, "vms"), map[string]any{"replicas": 1, "restoreFrom": restore})
		agreed := contractOf(ctx, t, d.app, "vms", "agreed", func(cc *marketv1alpha1.ComputeContract) bool {
			return !before[cc.Name] && cc.Status.Records.Lease != nil
		})
		var w walk
		w.market = time.Since(start)
		contractOf(ctx, t, d.bid, "acme", "the VM runs", func(cc *marketv1alpha1.ComputeContract) bool {
			return cc.Spec.Accept == agreed.Spec.Accept && cc.Status.Phase == marketv1alpha1.ContractActive
		})
		w.provisioning = time.Since(start) - w.market
		rc := contractOf(ctx, t, d.app, "vms", "mounted", func(cc *marketv1alpha1.ComputeContract) bool {
			return cc.Name == agreed.Name && cc.Status.Phase == marketv1alpha1.ContractActive
		})
		cs := mountClient(t, "alice", d.appWS, rc.Name)
		if err := framework.Eventually(ctx, 2*time.Minute, "read through the mount", func(ctx context.Context) (bool, string, error) {
			if restore != "" {
				_, err := cs.CoreV1().ConfigMaps("shop").Get(ctx, "settings", metav1.GetOptions{})
				return err == nil, fmt.Sprint(err), nil
			}
			_, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
			return err == nil, fmt.Sprint(err), nil
		}); err != nil {
			t.Fatal(err)
		}
		w.total = time.Since(start)
		if drv == marketv1alpha1.DriverKind && restore == "" {
			runTestImage(ctx, t, cs, testImage)
			w.pod = time.Since(start)
		}
		return w, rc
	}
	release := func() {
		t.Helper()
		mergePatch(ctx, t, d.app, getMR(ctx, t, d.app, "vms"), map[string]any{"replicas": 0})
		if err := framework.Eventually(ctx, 3*time.Minute, "released: no VM left, every contract over", func(ctx context.Context) (bool, string, error) {
			var vms computev1alpha1.ComputeVMList
			if err := d.bid.List(ctx, &vms, client.InNamespace("default")); err != nil {
				return false, err.Error(), nil
			}
			open := 0
			for _, cc := range contractsOwnedBy(ctx, t, d.app, "vms") {
				if cc.Status.Phase != marketv1alpha1.ContractCompleted && cc.Status.Phase != marketv1alpha1.ContractFailed {
					open++
				}
			}
			return len(vms.Items) == 0 && len(process.PIDs(a.root)) == 0 && len(kind.VMs(kroot)) == 0 && open == 0, fmt.Sprintf("%d VMs, %d contracts not over", len(vms.Items), open), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	report := func(what string, ws []walk) {
		p50 := func(f func(walk) time.Duration) time.Duration {
			ds := make([]time.Duration, len(ws))
			for i, w := range ws {
				ds[i] = f(w)
			}
			slices.Sort(ds)
			return ds[len(ds)/2].Round(time.Millisecond)
		}
		var all []string
		for _, w := range ws {
			all = append(all, w.total.Round(100*time.Millisecond).String())
		}
		t.Logf("FIGURE %s, p50 over %d: %s (market %s, provisioning %s, mount %s); each: %s", what, len(ws),
			p50(func(w walk) time.Duration { return w.total }), p50(func(w walk) time.Duration { return w.market }),
			p50(func(w walk) time.Duration { return w.provisioning }), p50(func(w walk) time.Duration { return w.total - w.market - w.provisioning }),
			strings.Join(all, " "))
	}

	spec0.Replicas = 0
	d.requester(ctx, t, "vms", spec0)
	var plain []walk
	var first *marketv1alpha1.ComputeContract
	for i := range n {
		w, rc := one("")
		plain = append(plain, w)
		if i == 0 {
			first = rc
			cs := mountClient(t, "alice", d.appWS, rc.Name)
			if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := cs.CoreV1().ConfigMaps("shop").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if rss, err := a.proc.RSS(); err == nil {
			cpu, _ := a.proc.CPU()
			t.Logf("walk %d: %s; agent RSS %d MiB, CPU %s so far", i, w.total.Round(time.Millisecond), rss>>20, cpu.Round(time.Millisecond))
		}
		release()
	}
	report("MarketRequester wanted -> kubectl get namespaces through the mount", plain)
	if drv == marketv1alpha1.DriverKind {
		pods := make([]time.Duration, len(plain))
		for i, w := range plain {
			pods[i] = w.pod
		}
		slices.Sort(pods)
		t.Logf("FIGURE MarketRequester wanted -> a Deployment's pod Running in the kind tenant, p50 over %d: %s", len(pods), pods[len(pods)/2].Round(time.Millisecond))
	}
	var snap corev1.SecretList
	if err := d.app.List(ctx, &snap, client.InNamespace("default"), client.MatchingLabels{marketrequester.LabelSnapshot: first.Name}); err != nil || len(snap.Items) == 0 {
		t.Fatalf("no snapshot of the first walk's tenant: %v", err)
	}
	var moved []walk
	for range n {
		w, _ := one(first.Name)
		moved = append(moved, w)
		release()
	}
	report("migration: wanted with restoreFrom -> the restored ConfigMap read through the mount", moved)
	cpu, _ := a.proc.CPU()
	t.Logf("FIGURE agent CPU per VM: %s (%d VMs)", (cpu / time.Duration(2*n)).Round(time.Millisecond), 2*n)
}
