// Package computevm is knotless-agent's controller: it runs the
// ComputeVMs of the bidder workspace the agent is given through a driver.
// A VM is provisioned once (an agent that starts again adopts the VMs that
// run), reported Running with its tenant apiserver's endpoint and CA once
// that answers, and given a Secret (owned by the VM) with the credential
// the mount uses on the tenant. A VM whose process or machine is gone is
// Lost with a reason: the agent never starts it again and never tears
// down a VM because it cannot see it. Deleting a ComputeVM terminates the
// VM (finalizer). It is the only writer of ComputeVM status (field
// manager FieldManager) and never writes spec.
//
// It is registered by knotless-agent only; the provider never starts
// processes.
package computevm

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/names"
	"github.com/knotless-dev/knotless/internal/serviceauth"
	"github.com/knotless-dev/knotless/internal/ssa"
)

const (
	// Name is the controller's name.
	Name = "computevm"
	// FieldManager owns ComputeVM status and finalizer and the credential
	// Secrets.
	FieldManager = names.AgentManager
	// Finalizer terminates the VM before the ComputeVM goes.
	Finalizer = "compute.knotless.dev/vm"

	// pollStarting is how often a starting VM is looked at.
	pollStarting = 2 * time.Second
	// pollRunning is how often a running VM is checked.
	pollRunning = 15 * time.Second
)

// Reconciler runs the ComputeVMs of one workspace.
type Reconciler struct {
	Client client.Client
	// Drivers by name (spec.driver).
	Drivers map[string]driver.Driver
	// Events records the VMs' Events.
	Events events.EventRecorder
	// Grants receive the DIDs each running tenant's RBAC names, which the
	// agent's service-auth webhook lets in (nil: not kept).
	Grants *serviceauth.Grants
	// Gateway is the public address of the agent's gateway (host:port),
	// written into the status of the VMs whose driver serves workloads
	// (driver.Workloads); empty: the agent runs none.
	Gateway string
	// SSHAddress and SSHHostKey are the agent's SSH gateway (host:port)
	// and its host key fingerprint, written like Gateway; empty: none.
	SSHAddress, SSHHostKey string
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named(Name).
		For(&computev1alpha1.ComputeVM{}).
		Owns(&corev1.Secret{}).
		WithOptions(controller.Options{
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](time.Second, time.Minute),
			ReconciliationTimeout:   2 * time.Minute,
			MaxConcurrentReconciles: 4,
		}).
		Complete(r)
}

// CredentialSecret is the name of a VM's credential Secret.
func CredentialSecret(vm string) string { return vm + "-credential" }

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	c := r.Client
	vm := &computev1alpha1.ComputeVM{}
	if err := c.Get(ctx, req.NamespacedName, vm); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	d := r.Drivers[vm.Spec.Driver]
	if !vm.DeletionTimestamp.IsZero() {
		return r.terminate(ctx, vm, d)
	}
	if !controllerutil.ContainsFinalizer(vm, Finalizer) {
		if err := ssa.Metadata(ctx, c, vm, []string{Finalizer}, nil, FieldManager); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}
	st := vm.Status.DeepCopy()
	st.ObservedGeneration = vm.Generation
	result, cause := r.run(ctx, vm, d, st)
	if err := r.write(ctx, vm, st); err != nil {
		return reconcile.Result{}, err
	}
	return result, cause
}

// run drives the VM and sets st.
func (r *Reconciler) run(ctx context.Context, vm *computev1alpha1.ComputeVM, d driver.Driver, st *computev1alpha1.ComputeVMStatus) (reconcile.Result, error) {
	switch {
	case d == nil:
		set(st, vm, computev1alpha1.VMFailed, computev1alpha1.ReasonUnknownDriver, fmt.Sprintf("this agent has no driver %q", vm.Spec.Driver))
		return reconcile.Result{}, nil
	case st.Phase == computev1alpha1.VMLost || st.Phase == computev1alpha1.VMFailed:
		// Never started again: the provider replaces or releases it.
		r.forgetGrants(vm)
		return reconcile.Result{}, nil
	}
	s, err := d.Provision(ctx, driver.VMOf(vm))
	switch {
	case errors.Is(err, driver.ErrLost) || s.State == driver.Lost:
		set(st, vm, computev1alpha1.VMLost, computev1alpha1.ReasonProcessGone, s.Reason)
		r.Events.Eventf(vm, nil, corev1.EventTypeWarning, computev1alpha1.ReasonProcessGone, "Provision", "the VM is lost: %s", s.Reason)
		return reconcile.Result{}, nil
	case errors.Is(err, driver.ErrUnrunnable):
		set(st, vm, computev1alpha1.VMFailed, computev1alpha1.ReasonDriverFailed, err.Error())
		return reconcile.Result{}, nil
	case err != nil:
		set(st, vm, computev1alpha1.VMProvisioning, computev1alpha1.ReasonDriverFailed, "the driver failed: "+err.Error())
		return reconcile.Result{}, err
	case s.State != driver.Running:
		set(st, vm, computev1alpha1.VMProvisioning, computev1alpha1.ReasonStarting, "the VM is starting")
		return reconcile.Result{RequeueAfter: pollStarting}, nil
	}
	token, err := d.Credential(ctx, driver.VMOf(vm))
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := r.credential(ctx, vm, token); err != nil {
		return reconcile.Result{}, err
	}
	fp, err := market.CAFingerprint(s.CA)
	if err != nil {
		set(st, vm, computev1alpha1.VMFailed, computev1alpha1.ReasonDriverFailed, "the VM's CA bundle cannot be pinned: "+err.Error())
		return reconcile.Result{}, nil
	}
	st.Endpoint, st.CABundle, st.CAFingerprint, st.CredentialSecret = s.Endpoint, string(s.CA), fp, CredentialSecret(vm.Name)
	st.ServiceID, st.Gateway, st.SSHAddress, st.SSHHostKey = s.ServiceID, "", "", ""
	if _, ok := d.(driver.Workloads); ok {
		st.Gateway, st.SSHAddress, st.SSHHostKey = r.Gateway, r.SSHAddress, r.SSHHostKey
	}
	if st.ServiceID != "" {
		r.refreshGrants(ctx, vm, d)
	}
	st.Enforced = enforced(s.Enforced)
	set(st, vm, computev1alpha1.VMRunning, string(computev1alpha1.VMRunning), "the tenant apiserver answers at "+s.Endpoint)
	return reconcile.Result{RequeueAfter: pollRunning}, nil
}

// credential makes the VM's credential Secret (owned by the VM, labelled
// for the agent's cache) hold token. It is applied, not read first: a
// Secret an older agent made without the label is not in the cache.
func (r *Reconciler) credential(ctx context.Context, vm *computev1alpha1.ComputeVM, token string) error {
	sec := corev1ac.Secret(CredentialSecret(vm.Name), vm.Namespace).
		WithLabels(map[string]string{computev1alpha1.LabelAgent: "true"}).
		WithType(corev1.SecretTypeOpaque).
		WithData(map[string][]byte{"token": []byte(token)}).
		WithOwnerReferences(metav1ac.OwnerReference().WithAPIVersion(computev1alpha1.GroupVersion.String()).WithKind("ComputeVM").
			WithName(vm.Name).WithUID(vm.UID).WithController(true).WithBlockOwnerDeletion(true))
	if err := r.Client.Apply(ctx, sec, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("the VM's credential Secret: %w", err)
	}
	return nil
}

// forgetGrants drops what the webhook lets into a VM that is gone.
func (r *Reconciler) forgetGrants(vm *computev1alpha1.ComputeVM) {
	if r.Grants != nil {
		r.Grants.Delete(string(vm.UID))
	}
}

// refreshGrants reads the DIDs the running VM's tenant (one that takes
// service-auth tokens) names in its RBAC for the webhook. A failed read
// forgets them (only the VM's admin DIDs get in) until a read succeeds.
func (r *Reconciler) refreshGrants(ctx context.Context, vm *computev1alpha1.ComputeVM, d driver.Driver) {
	if r.Grants == nil {
		return
	}
	dids, err := d.AccessDIDs(ctx, driver.VMOf(vm))
	if err != nil {
		log.FromContext(ctx).V(1).Info("reading the DIDs the tenant's RBAC names", "error", err.Error())
		r.Grants.Delete(string(vm.UID))
		return
	}
	r.Grants.Set(string(vm.UID), dids)
}

// enforced is the status field of what the driver read back of the VM's
// shape.
func enforced(e *driver.Enforced) *computev1alpha1.EnforcedShape {
	if e == nil {
		return nil
	}
	return &computev1alpha1.EnforcedShape{LimitCPUMillis: e.LimitCPUMillis, LimitMemoryMiB: e.LimitMemoryMiB,
		AllocatableCPUMillis: e.AllocatableCPUMillis, AllocatableMemoryMiB: e.AllocatableMemoryMiB}
}

func set(st *computev1alpha1.ComputeVMStatus, vm *computev1alpha1.ComputeVM, phase computev1alpha1.VMPhase, reason, msg string) {
	st.Phase = phase
	st.Reason = ""
	if phase == computev1alpha1.VMLost || phase == computev1alpha1.VMFailed {
		st.Reason = reason
		st.Endpoint, st.CABundle, st.CAFingerprint, st.ServiceID, st.Gateway = "", "", "", "", ""
		st.SSHAddress, st.SSHHostKey = "", ""
		st.Enforced = nil
	}
	status := metav1.ConditionFalse
	if phase == computev1alpha1.VMRunning {
		status = metav1.ConditionTrue
	}
	conditions.Set(&st.Conditions, computev1alpha1.ConditionRunning, vm.Generation, status, reason, msg)
	// Ready is Running under the name every knotless kind has (kubectl
	// wait --for=condition=Ready).
	conditions.SetReady(&st.Conditions, vm.Generation, status, reason, msg)
}

func (r *Reconciler) write(ctx context.Context, vm *computev1alpha1.ComputeVM, st *computev1alpha1.ComputeVMStatus) error {
	return ssa.WriteStatus(ctx, r.Client, vm, &vm.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Replace:  true, // endpoint and CA go when the VM is lost
		Event:    ssa.PhaseChanged(vm.Status.Phase, st.Phase, computev1alpha1.VMFailed, "", meta.FindStatusCondition(st.Conditions, computev1alpha1.ConditionRunning).Message),
		Recorder: r.Events,
		Action:   "Reconcile",
	})
}

// terminate stops a deleted VM, then lets it go.
func (r *Reconciler) terminate(ctx context.Context, vm *computev1alpha1.ComputeVM, d driver.Driver) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(vm, Finalizer) {
		return reconcile.Result{}, nil
	}
	if d != nil {
		if vm.Status.Phase != computev1alpha1.VMTerminating {
			st := vm.Status.DeepCopy()
			set(st, vm, computev1alpha1.VMTerminating, string(computev1alpha1.VMTerminating), "stopping the VM")
			if err := r.write(ctx, vm, st); err != nil {
				return reconcile.Result{}, err
			}
		}
		if err := d.Terminate(ctx, driver.VMOf(vm)); err != nil {
			return reconcile.Result{}, fmt.Errorf("terminating the VM: %w", err)
		}
		// The status write moved the object on.
		if err := r.Client.Get(ctx, client.ObjectKeyFromObject(vm), vm); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}
	r.forgetGrants(vm)
	if err := ssa.RemoveFinalizer(ctx, r.Client, vm, Finalizer); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	return reconcile.Result{}, nil
}
