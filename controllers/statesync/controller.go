// Package statesync is knotless-agent's controller of StateSyncs: it
// exports a running VM's tenant objects into a snapshot, kept in chunk
// Secrets owned by the StateSync, or imports the snapshot whose chunk
// Secrets the provider put beside the StateSync into the VM's tenant,
// through the VM's driver. A StateSync is done once (Completed or Failed)
// and never run again; one that was Running when the agent stopped is run
// again (both directions are idempotent). It is the only writer of
// StateSync status (field manager FieldManager, the agent's, which the
// computevm controller uses too) and of export chunks, and never writes
// spec.
package statesync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/names"
	"github.com/knotless-dev/knotless/internal/ssa"
	"github.com/knotless-dev/knotless/internal/statesync"
)

const (
	// Name is the controller's name.
	Name = "statesync"
	// FieldManager owns StateSync status and the export chunk Secrets.
	FieldManager = names.AgentManager

	// poll is how often a StateSync that waits is looked at again.
	poll = 2 * time.Second
)

// Done says whether a StateSync is over.
func Done(ss *computev1alpha1.StateSync) bool {
	return ss.Status.Phase == computev1alpha1.SyncCompleted || ss.Status.Phase == computev1alpha1.SyncFailed
}

// Reconciler runs the StateSyncs of one workspace.
type Reconciler struct {
	Client client.Client
	// Drivers by name (the VM's spec.driver).
	Drivers map[string]driver.Driver
	// Events records the StateSyncs' Events.
	Events events.EventRecorder
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named(Name).
		For(&computev1alpha1.StateSync{}).
		Owns(&corev1.Secret{}).
		WithOptions(controller.Options{
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](time.Second, time.Minute),
			ReconciliationTimeout:   5 * time.Minute,
			MaxConcurrentReconciles: 2,
		}).
		Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ss := &computev1alpha1.StateSync{}
	if err := r.Client.Get(ctx, req.NamespacedName, ss); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !ss.DeletionTimestamp.IsZero() || Done(ss) {
		return reconcile.Result{}, nil
	}
	st := ss.Status.DeepCopy()
	st.ObservedGeneration = ss.Generation
	result, cause := r.run(ctx, ss, st)
	if err := r.write(ctx, ss, st); err != nil {
		return reconcile.Result{}, err
	}
	return result, cause
}

func (r *Reconciler) run(ctx context.Context, ss *computev1alpha1.StateSync, st *computev1alpha1.StateSyncStatus) (reconcile.Result, error) {
	vm := &computev1alpha1.ComputeVM{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ss.Namespace, Name: ss.Spec.VMName}, vm); err != nil {
		if apierrors.IsNotFound(err) {
			set(st, ss, computev1alpha1.SyncFailed, computev1alpha1.ReasonVMNotRunning, "the ComputeVM does not exist")
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	d := r.Drivers[vm.Spec.Driver]
	switch {
	case !metav1.IsControlledBy(ss, vm):
		set(st, ss, computev1alpha1.SyncFailed, computev1alpha1.ReasonSnapshotInvalid, "the StateSync is not controlled by its ComputeVM")
		return reconcile.Result{}, nil
	case d == nil:
		set(st, ss, computev1alpha1.SyncFailed, computev1alpha1.ReasonVMNotRunning, fmt.Sprintf("this agent has no driver %q", vm.Spec.Driver))
		return reconcile.Result{}, nil
	case vm.Status.Phase == computev1alpha1.VMLost || vm.Status.Phase == computev1alpha1.VMFailed || !vm.DeletionTimestamp.IsZero():
		set(st, ss, computev1alpha1.SyncFailed, computev1alpha1.ReasonVMNotRunning, "the VM is "+string(vm.Status.Phase)+" and will not run again")
		return reconcile.Result{}, nil
	case vm.Status.Phase != computev1alpha1.VMRunning:
		set(st, ss, computev1alpha1.SyncPending, computev1alpha1.ReasonVMNotRunning, "waiting for the VM to run")
		return reconcile.Result{RequeueAfter: poll}, nil
	}
	if why, err := r.unwanted(ctx, ss, vm); err != nil || why != "" {
		if why != "" {
			set(st, ss, computev1alpha1.SyncFailed, computev1alpha1.ReasonNotWanted, why)
		}
		return reconcile.Result{}, err
	}
	if ss.Spec.Direction == computev1alpha1.Export {
		return r.export(ctx, ss, vm, d, st)
	}
	return r.imp(ctx, ss, vm, d, st)
}

// unwanted says why the VM's contract does not ask for ss ("" when it
// does). The provider makes a StateSync only for a VM of a bidder's
// ComputeContract that is live: an export when the requester releases an
// Active contract (before its release is published, so Active, or
// Releasing once the bidder read it), an import into a new tenant before
// the requester mounts it (the bidder's contract is Provisioning, or
// Active once the VM runs). Nothing else is exported or imported: a VM
// made by hand, or one whose contract ended, has no StateSync run.
func (r *Reconciler) unwanted(ctx context.Context, ss *computev1alpha1.StateSync, vm *computev1alpha1.ComputeVM) (string, error) {
	cc := &marketv1alpha1.ComputeContract{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: vm.Namespace, Name: vm.Spec.ContractName}, cc)
	switch {
	case apierrors.IsNotFound(err):
		return "the VM has no ComputeContract: only a contract's VM is exported or imported", nil
	case err != nil:
		return "", err
	case !metav1.IsControlledBy(vm, cc) || cc.Spec.Side != marketv1alpha1.SideBidder:
		return "the VM is not its bidder's ComputeContract's: only a contract's VM is exported or imported", nil
	}
	wanted := []marketv1alpha1.ContractPhase{marketv1alpha1.ContractProvisioning, marketv1alpha1.ContractActive}
	if ss.Spec.Direction == computev1alpha1.Export {
		wanted = []marketv1alpha1.ContractPhase{marketv1alpha1.ContractActive, marketv1alpha1.ContractReleasing}
	}
	if !slices.Contains(wanted, cc.Status.Phase) {
		return fmt.Sprintf("the VM's contract is %s: an %s is made only while it is %s or %s",
			cmp.Or(string(cc.Status.Phase), "new"), strings.ToLower(string(ss.Spec.Direction)), wanted[0], wanted[1]), nil
	}
	return "", nil
}

// running says so in the status before the driver is called: an agent
// that stops meanwhile runs it again.
func (r *Reconciler) running(ctx context.Context, ss *computev1alpha1.StateSync, st *computev1alpha1.StateSyncStatus) error {
	set(st, ss, computev1alpha1.SyncRunning, string(computev1alpha1.SyncRunning), string(ss.Spec.Direction)+"ing the tenant's objects")
	if err := r.write(ctx, ss, st); err != nil {
		return err
	}
	ss.Status = *st.DeepCopy()
	return nil
}

func (r *Reconciler) export(ctx context.Context, ss *computev1alpha1.StateSync, vm *computev1alpha1.ComputeVM, d driver.Driver, st *computev1alpha1.StateSyncStatus) (reconcile.Result, error) {
	if err := r.running(ctx, ss, st); err != nil {
		return reconcile.Result{}, err
	}
	data, n, err := d.Export(ctx, driver.VMOf(vm), computev1alpha1.SchemaGroupResources(ss.Spec.Resources))
	switch {
	case errors.Is(err, statesync.ErrInvalid):
		set(st, ss, computev1alpha1.SyncFailed, computev1alpha1.ReasonExportFailed, err.Error())
		return reconcile.Result{}, nil
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("exporting: %w", err)
	}
	chunks := statesync.Chunks(data, computev1alpha1.SnapshotChunkBytes)
	if len(chunks) > computev1alpha1.SnapshotMaxChunks {
		set(st, ss, computev1alpha1.SyncFailed, computev1alpha1.ReasonSnapshotTooBig,
			fmt.Sprintf("the snapshot has %d bytes, more than %d", len(data), computev1alpha1.SnapshotMaxChunks*computev1alpha1.SnapshotChunkBytes))
		return reconcile.Result{}, nil
	}
	for i, ch := range chunks {
		// Applied, not read first: a chunk an older agent made without
		// LabelAgent is not in the cache.
		sec := corev1ac.Secret(computev1alpha1.SnapshotChunkName(ss.Name, i), ss.Namespace).
			WithLabels(map[string]string{computev1alpha1.LabelStateSync: ss.Name, computev1alpha1.LabelAgent: "true"}).
			WithType(corev1.SecretTypeOpaque).
			WithData(map[string][]byte{computev1alpha1.SnapshotKey: ch}).
			WithOwnerReferences(metav1ac.OwnerReference().WithAPIVersion(computev1alpha1.GroupVersion.String()).WithKind("StateSync").
				WithName(ss.Name).WithUID(ss.UID).WithController(true).WithBlockOwnerDeletion(true))
		if err := r.Client.Apply(ctx, sec, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
			return reconcile.Result{}, fmt.Errorf("writing snapshot chunk %d: %w", i, err)
		}
	}
	st.Objects, st.Bytes, st.Chunks, st.SHA256 = int32(n), int64(len(data)), int32(len(chunks)), statesync.Sum(data)
	set(st, ss, computev1alpha1.SyncCompleted, string(computev1alpha1.SyncCompleted), fmt.Sprintf("exported %d objects (%d bytes in %d chunks)", n, len(data), len(chunks)))
	return reconcile.Result{}, nil
}

func (r *Reconciler) imp(ctx context.Context, ss *computev1alpha1.StateSync, vm *computev1alpha1.ComputeVM, d driver.Driver, st *computev1alpha1.StateSyncStatus) (reconcile.Result, error) {
	var data []byte
	for i := range int(ss.Spec.Chunks) {
		sec := &corev1.Secret{}
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: ss.Namespace, Name: computev1alpha1.SnapshotChunkName(ss.Name, i)}, sec)
		if apierrors.IsNotFound(err) || (err == nil && !metav1.IsControlledBy(sec, ss)) {
			set(st, ss, computev1alpha1.SyncPending, computev1alpha1.ReasonChunksMissing, fmt.Sprintf("waiting for snapshot chunk %d of %d", i, ss.Spec.Chunks))
			return reconcile.Result{RequeueAfter: poll}, nil
		}
		if err != nil {
			return reconcile.Result{}, err
		}
		data = append(data, sec.Data[computev1alpha1.SnapshotKey]...)
	}
	if ss.Spec.Chunks == 0 || statesync.Sum(data) != ss.Spec.SHA256 {
		set(st, ss, computev1alpha1.SyncFailed, computev1alpha1.ReasonSnapshotInvalid, "the snapshot's chunks do not match its SHA-256")
		return reconcile.Result{}, nil
	}
	if err := r.running(ctx, ss, st); err != nil {
		return reconcile.Result{}, err
	}
	n, err := d.Import(ctx, driver.VMOf(vm), data, computev1alpha1.SchemaGroupResources(ss.Spec.Resources))
	switch {
	case errors.Is(err, statesync.ErrInvalid):
		set(st, ss, computev1alpha1.SyncFailed, computev1alpha1.ReasonImportFailed, err.Error())
		return reconcile.Result{}, nil
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("importing: %w", err)
	}
	// The chunks are not needed any more.
	if err := r.Client.DeleteAllOf(ctx, &corev1.Secret{}, client.InNamespace(ss.Namespace), client.MatchingLabels{computev1alpha1.LabelStateSync: ss.Name}); err != nil {
		return reconcile.Result{}, fmt.Errorf("deleting the snapshot's chunks: %w", err)
	}
	st.Objects, st.Bytes = int32(n), int64(len(data))
	set(st, ss, computev1alpha1.SyncCompleted, string(computev1alpha1.SyncCompleted), fmt.Sprintf("imported %d objects", n))
	return reconcile.Result{}, nil
}

func set(st *computev1alpha1.StateSyncStatus, ss *computev1alpha1.StateSync, phase computev1alpha1.StateSyncPhase, reason, msg string) {
	st.Phase, st.Reason = phase, ""
	if phase == computev1alpha1.SyncFailed {
		st.Reason = reason
	}
	msg = conditions.Quote(msg) // a tenant's error text, in part
	status := metav1.ConditionFalse
	if phase == computev1alpha1.SyncCompleted {
		status = metav1.ConditionTrue
	}
	conditions.Set(&st.Conditions, computev1alpha1.ConditionSynced, ss.Generation, status, reason, msg)
	// Ready is Synced under the name every knotless kind has (kubectl
	// wait --for=condition=Ready).
	conditions.SetReady(&st.Conditions, ss.Generation, status, reason, msg)
}

func (r *Reconciler) write(ctx context.Context, ss *computev1alpha1.StateSync, st *computev1alpha1.StateSyncStatus) error {
	return ssa.WriteStatus(ctx, r.Client, ss, &ss.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    ssa.PhaseChanged(ss.Status.Phase, st.Phase, computev1alpha1.SyncFailed, "", meta.FindStatusCondition(st.Conditions, computev1alpha1.ConditionSynced).Message),
		Recorder: r.Events,
		Action:   string(ss.Spec.Direction),
	})
}
