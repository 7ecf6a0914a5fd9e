package computevm

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/driver/drivertest"
)

// TestVMLifecycle: a VM is provisioned once, Running with endpoint, CA,
// fingerprint and a credential Secret it owns; a VM whose process is gone
// is Lost and never provisioned again; deleting it terminates it.
func TestVMLifecycle(t *testing.T) {
	vm := &computev1alpha1.ComputeVM{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "default", UID: "vm-uid", Generation: 1},
		Spec: computev1alpha1.ComputeVMSpec{ContractName: "c", Driver: "process", CPUMillis: 1000, MemoryMiB: 1024}}
	ws := clustertest.New(vm)
	d := drivertest.New(t)
	r := &Reconciler{Client: ws.Client, Drivers: map[string]driver.Driver{"process": d}, Events: ws.GetEventRecorder(Name)}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "vm"}}
	get := func() *computev1alpha1.ComputeVM {
		t.Helper()
		out := &computev1alpha1.ComputeVM{}
		if err := ws.Client.Get(context.Background(), req.NamespacedName, out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	reconcileIt := func() reconcile.Result {
		t.Helper()
		res, err := r.Reconcile(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := reconcileIt(); res.RequeueAfter != pollStarting || get().Status.Phase != computev1alpha1.VMProvisioning {
		t.Fatalf("after the first reconcile: %+v, %+v", res, get().Status)
	}
	reconcileIt()
	if d.Provisions != 1 {
		t.Errorf("provisioned %d times", d.Provisions)
	}
	d.Set("vm-uid", driver.Running)
	d.Enforced = &driver.Enforced{LimitCPUMillis: 1000, LimitMemoryMiB: 1024, AllocatableCPUMillis: 1000, AllocatableMemoryMiB: 1020}
	reconcileIt()
	got := get()
	if got.Status.Phase != computev1alpha1.VMRunning || got.Status.Endpoint == "" || got.Status.CAFingerprint == "" || got.Status.CredentialSecret != "vm-credential" {
		t.Fatalf("running: %+v", got.Status)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, "Ready"); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Ready of a running VM: %+v", c)
	}
	if e := got.Status.Enforced; e == nil || *e != (computev1alpha1.EnforcedShape{LimitCPUMillis: 1000, LimitMemoryMiB: 1024, AllocatableCPUMillis: 1000, AllocatableMemoryMiB: 1020}) {
		t.Errorf("enforced shape in the status: %+v", e)
	}
	sec := &corev1.Secret{}
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "vm-credential"}, sec); err != nil || string(sec.Data["token"]) != "tok" || !metav1.IsControlledBy(sec, got) {
		t.Fatalf("credential Secret %+v, %v", sec, err)
	}
	if sec.Labels[computev1alpha1.LabelAgent] != "true" {
		t.Errorf("the credential Secret is not labelled for the agent's cache: %v", sec.Labels)
	}
	d.Set("vm-uid", driver.Lost)
	reconcileIt()
	if got := get(); got.Status.Phase != computev1alpha1.VMLost || got.Status.Reason != computev1alpha1.ReasonProcessGone || got.Status.Endpoint != "" || got.Status.Enforced != nil {
		t.Fatalf("lost: %+v", got.Status)
	}
	d.Set("vm-uid", driver.Absent) // even if the driver would start it
	reconcileIt()
	if d.Provisions != 1 || get().Status.Phase != computev1alpha1.VMLost {
		t.Errorf("a lost VM was provisioned again (%d)", d.Provisions)
	}
	if err := ws.Client.Delete(context.Background(), get()); err != nil {
		t.Fatal(err)
	}
	reconcileIt()
	if len(d.Terminated) != 1 {
		t.Errorf("terminated %v", d.Terminated)
	}
	if err := ws.Client.Get(context.Background(), req.NamespacedName, &computev1alpha1.ComputeVM{}); err == nil {
		t.Error("the ComputeVM is still there")
	}
}

// TestUnknownDriver: a VM of a driver the agent does not have fails
// with a reason and is not provisioned.
func TestUnknownDriver(t *testing.T) {
	vm := &computev1alpha1.ComputeVM{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "default", UID: "u"}, Spec: computev1alpha1.ComputeVMSpec{Driver: "cloud"}}
	ws := clustertest.New(vm)
	r := &Reconciler{Client: ws.Client, Drivers: map[string]driver.Driver{}, Events: ws.GetEventRecorder(Name)}
	if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "vm"}}); err != nil {
		t.Fatal(err)
	}
	got := &computev1alpha1.ComputeVM{}
	_ = ws.Client.Get(context.Background(), client.ObjectKeyFromObject(vm), got)
	if got.Status.Phase != computev1alpha1.VMFailed || got.Status.Reason != computev1alpha1.ReasonUnknownDriver {
		t.Errorf("status %+v", got.Status)
	}
}

// TestUnrunnableVMFails: a VM the driver will never run (a shape it
// cannot hold) is Failed with the driver's reason, and not retried.
func TestUnrunnableVMFails(t *testing.T) {
	vm := &computev1alpha1.ComputeVM{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "default", UID: "u", Generation: 1},
		Spec: computev1alpha1.ComputeVMSpec{ContractName: "c", Driver: "kind", CPUMillis: 100, MemoryMiB: 128}}
	ws := clustertest.New(vm)
	d := drivertest.New(t)
	d.ProvisionErr = fmt.Errorf("%w: the shape is below the smallest node", driver.ErrUnrunnable)
	r := &Reconciler{Client: ws.Client, Drivers: map[string]driver.Driver{"kind": d}, Events: ws.GetEventRecorder(Name)}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "vm"}}
	for range 2 {
		res, err := r.Reconcile(context.Background(), req)
		if err != nil || res.RequeueAfter != 0 {
			t.Fatalf("reconcile: %+v, %v (want no retry)", res, err)
		}
	}
	got := &computev1alpha1.ComputeVM{}
	_ = ws.Client.Get(context.Background(), req.NamespacedName, got)
	c := meta.FindStatusCondition(got.Status.Conditions, computev1alpha1.ConditionRunning)
	if got.Status.Phase != computev1alpha1.VMFailed || got.Status.Reason != computev1alpha1.ReasonDriverFailed || c == nil || !strings.Contains(c.Message, "smallest node") {
		t.Errorf("status %+v", got.Status)
	}
}
