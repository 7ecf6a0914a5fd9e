package marketrequester

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/ssa"
	"github.com/knotless-dev/knotless/internal/statesync"
)

// A snapshot in the requester's workspace is named after the contract
// whose tenant was exported: its chunks are Secrets <contract>-snapshot-<i>
// owned by the MarketRequester (so it outlives the contract), labelled
// LabelSnapshot=<contract>; besides the chunk (key snapshot) each holds
// its index, the number of chunks, the SHA-256 of the whole and the
// number of objects.
const (
	LabelSnapshot = "market.knotless.dev/snapshot"

	keyIndex   = "index"
	keyChunks  = "chunks"
	keySHA256  = "sha256"
	keyObjects = "objects"
)

func snapshotOwner(snapshot string) string { return snapshot + "-snapshot" }

// startExport makes the StateSync that exports the contract's tenant in
// the bidder's workspace (owned by the VM), before the release is
// published: the bidder's side keeps a VM with an export until the
// snapshot is copied here. An export older than market.ExportWait is
// from an earlier release that did not go out: it is deleted and made
// again, so a snapshot is never older than its release. It reports
// whether the release may be published.
func (s *session) startExport(cc *marketv1alpha1.ComputeContract) (bool, error) {
	if chunks, _ := s.snapshot(cc.Name); chunks != nil {
		return true, nil
	}
	bc, vm := s.bidderVM(cc)
	if vm == nil || vm.Status.Phase != computev1alpha1.VMRunning {
		return true, nil
	}
	ss := &computev1alpha1.StateSync{ObjectMeta: metav1.ObjectMeta{Name: computev1alpha1.ExportName(vm.Name), Namespace: vm.Namespace}}
	switch err := bc.Get(s.ctx, client.ObjectKeyFromObject(ss), ss); {
	case err == nil && !ss.DeletionTimestamp.IsZero():
		return false, nil
	case err == nil && s.now.After(ss.CreationTimestamp.Add(market.ExportWait)):
		uid := ss.UID
		return false, client.IgnoreNotFound(bc.Delete(s.ctx, ss, client.Preconditions{UID: &uid}))
	case err == nil:
		return true, nil
	case !apierrors.IsNotFound(err):
		return false, err
	}
	ss.Spec = computev1alpha1.StateSyncSpec{VMName: vm.Name, Direction: computev1alpha1.Export, Resources: s.mr.Spec.StateSync.Resources}
	return true, ssa.Child(s.ctx, bc, ss, vm, FieldManager)
}

// collectExport copies the snapshot of a released contract's export from
// the bidder's workspace into the requester's, then deletes the export
// (with its chunks) so that the VM may go. A failed export is deleted too
// (with an Event), and so is one the requester no longer wants (it is
// being deleted).
func (s *session) collectExport(cc *marketv1alpha1.ComputeContract) error {
	bc, vm := s.bidderVM(cc)
	if vm == nil {
		return nil
	}
	ss := &computev1alpha1.StateSync{}
	if err := bc.Get(s.ctx, client.ObjectKey{Namespace: vm.Namespace, Name: computev1alpha1.ExportName(vm.Name)}, ss); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(ss, vm) || !ss.DeletionTimestamp.IsZero() {
		return nil
	}
	done := func() error {
		uid := ss.UID
		return client.IgnoreNotFound(bc.Delete(s.ctx, ss, client.Preconditions{UID: &uid}))
	}
	if s.deleting {
		return done()
	}
	failed := func(why string) error {
		s.events.Eventf(s.mr, nil, corev1.EventTypeWarning, "ExportFailed", "Release", "the tenant of %s was not exported (%s); it is released without a snapshot", cc.Name, why)
		return done()
	}
	switch ss.Status.Phase {
	case computev1alpha1.SyncFailed:
		// Only reasons the agent gives are repeated (the bidder writes
		// this status).
		return failed(knownReason(ss.Status.Reason))
	case computev1alpha1.SyncCompleted:
	default:
		s.due(s.now.Add(2 * time.Second))
		return nil
	}
	n := int(ss.Status.Chunks)
	if n < 1 || n > computev1alpha1.SnapshotMaxChunks {
		return failed(computev1alpha1.ReasonSnapshotInvalid)
	}
	var data []byte
	chunks := make([][]byte, n)
	for i := range chunks {
		sec := &corev1.Secret{}
		err := bc.Get(s.ctx, client.ObjectKey{Namespace: ss.Namespace, Name: computev1alpha1.SnapshotChunkName(ss.Name, i)}, sec)
		switch {
		case err != nil && !apierrors.IsNotFound(err):
			return err
		case err != nil || !metav1.IsControlledBy(sec, ss):
			s.due(s.now.Add(2 * time.Second))
			return nil
		case len(sec.Data[computev1alpha1.SnapshotKey]) > computev1alpha1.SnapshotChunkBytes:
			return failed(computev1alpha1.ReasonSnapshotInvalid)
		}
		chunks[i] = sec.Data[computev1alpha1.SnapshotKey]
		data = append(data, chunks[i]...)
	}
	if statesync.Sum(data) != ss.Status.SHA256 {
		// The chunks may be read before the status that made them.
		if s.now.Before(ss.CreationTimestamp.Add(market.ExportWait)) {
			s.due(s.now.Add(2 * time.Second))
			return nil
		}
		return failed(computev1alpha1.ReasonSnapshotInvalid)
	}
	for i, ch := range chunks {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: computev1alpha1.SnapshotChunkName(snapshotOwner(cc.Name), i), Namespace: s.mr.Namespace}}
		if _, err := controllerutil.CreateOrUpdate(s.ctx, s.c, sec, func() error {
			sec.Type = corev1.SecretTypeOpaque
			sec.Labels = map[string]string{LabelSnapshot: cc.Name}
			sec.Data = map[string][]byte{
				computev1alpha1.SnapshotKey: ch,
				keyIndex:                    []byte(strconv.Itoa(i)),
				keyChunks:                   []byte(strconv.Itoa(len(chunks))),
				keySHA256:                   []byte(ss.Status.SHA256),
				keyObjects:                  []byte(strconv.Itoa(int(ss.Status.Objects))),
			}
			return controllerutil.SetControllerReference(s.mr, sec, s.c.Scheme())
		}); err != nil {
			return fmt.Errorf("the snapshot's chunk %d: %w", i, err)
		}
	}
	s.events.Eventf(s.mr, nil, corev1.EventTypeNormal, "Exported", "Release", "the tenant of %s was exported: %d objects, %d bytes, kept as snapshot %s (spec.restoreFrom: %s)",
		cc.Name, ss.Status.Objects, len(data), cc.Name, cc.Name)
	return done()
}

// snapshot returns the chunks of a whole snapshot of this requester and
// its SHA-256; nil when there is none or it is not whole.
func (s *session) snapshot(name string) ([][]byte, string) {
	var secs corev1.SecretList
	if err := s.c.List(s.ctx, &secs, client.InNamespace(s.mr.Namespace), client.MatchingLabels{LabelSnapshot: name}); err != nil ||
		len(secs.Items) == 0 || len(secs.Items) > computev1alpha1.SnapshotMaxChunks {
		return nil, ""
	}
	slices.SortFunc(secs.Items, func(a, b corev1.Secret) int {
		return cmp.Compare(atoi(a.Data[keyIndex]), atoi(b.Data[keyIndex]))
	})
	sum, n := string(secs.Items[0].Data[keySHA256]), atoi(secs.Items[0].Data[keyChunks])
	if n != len(secs.Items) {
		return nil, ""
	}
	chunks := make([][]byte, 0, n)
	h := sha256.New()
	for i := range secs.Items {
		sec := &secs.Items[i]
		ch := sec.Data[computev1alpha1.SnapshotKey]
		if !metav1.IsControlledBy(sec, s.mr) || atoi(sec.Data[keyIndex]) != i || len(ch) > computev1alpha1.SnapshotChunkBytes {
			return nil, ""
		}
		h.Write(ch)
		chunks = append(chunks, ch)
	}
	if hex.EncodeToString(h.Sum(nil)) != sum {
		return nil, ""
	}
	return chunks, sum
}

// knownReason is reason if it is one the agent gives, else "failed".
func knownReason(reason string) string {
	switch reason {
	case computev1alpha1.ReasonVMNotRunning, computev1alpha1.ReasonChunksMissing, computev1alpha1.ReasonSnapshotInvalid,
		computev1alpha1.ReasonSnapshotTooBig, computev1alpha1.ReasonExportFailed, computev1alpha1.ReasonImportFailed, computev1alpha1.ReasonNotWanted:
		return reason
	}
	return "failed"
}

func atoi(b []byte) int {
	n, err := strconv.Atoi(string(b))
	if err != nil {
		return -1
	}
	return n
}

// importSettled judges the import StateSync ss found in the bidder's
// workspace. It settles restore's answer when the VM does not own ss, or
// ss has completed, failed or is going away: done once the import
// completed, else what it waits for. Otherwise (settled false) the
// snapshot is still to be written to it.
func (s *session) importSettled(ss *computev1alpha1.StateSync, vm *computev1alpha1.ComputeVM, from string) (done bool, wait string, settled bool) {
	switch {
	case !metav1.IsControlledBy(ss, vm):
		return false, "the bidder's workspace holds a StateSync the VM does not own: not mounted", true
	case ss.Status.Phase == computev1alpha1.SyncCompleted:
		return true, "", true
	case ss.Status.Phase == computev1alpha1.SyncFailed:
		return false, fmt.Sprintf("restoring snapshot %s failed (%s): not mounted; remove spec.restoreFrom to mount the tenant without it", from, knownReason(ss.Status.Reason)), true
	case !ss.DeletionTimestamp.IsZero():
		s.due(s.now.Add(2 * time.Second))
		return false, "restoring snapshot " + from + " into the tenant", true
	}
	return false, "", false
}

// restore imports the snapshot from into the new tenant of cc before it
// is mounted: a StateSync in the bidder's workspace (owned by the VM)
// with the snapshot's chunks beside it (owned by the StateSync), that
// may apply only namespaces and the kinds of spec.stateSync.resources. A
// contract that was Active once is never restored (its tenant has live
// objects). It reports whether the import is done, and what it waits
// for.
func (s *session) restore(cc *marketv1alpha1.ComputeContract, bc client.Client, vm *computev1alpha1.ComputeVM, from string) (bool, string, error) {
	if cc.Status.Phase == marketv1alpha1.ContractActive {
		return true, "", nil
	}
	ss := &computev1alpha1.StateSync{}
	err := bc.Get(s.ctx, client.ObjectKey{Namespace: vm.Namespace, Name: computev1alpha1.ImportName(vm.Name)}, ss)
	switch {
	case err == nil:
		if done, wait, settled := s.importSettled(ss, vm, from); settled {
			return done, wait, nil
		}
	case !apierrors.IsNotFound(err):
		return false, "", err
	}
	chunks, sum := s.snapshot(from)
	if chunks == nil {
		return false, fmt.Sprintf("snapshot %s (spec.restoreFrom) is not whole in this workspace: not mounted", from), nil
	}
	s.due(s.now.Add(2 * time.Second))
	if err == nil && ss.Spec.SHA256 != sum && ss.Status.Phase != computev1alpha1.SyncRunning {
		// Another snapshot than the one asked for now: made again.
		uid := ss.UID
		return false, "restoring snapshot " + from + " into the tenant", client.IgnoreNotFound(bc.Delete(s.ctx, ss, client.Preconditions{UID: &uid}))
	}
	if apierrors.IsNotFound(err) {
		ss = &computev1alpha1.StateSync{ObjectMeta: metav1.ObjectMeta{Name: computev1alpha1.ImportName(vm.Name), Namespace: vm.Namespace},
			Spec: computev1alpha1.StateSyncSpec{VMName: vm.Name, Direction: computev1alpha1.Import, Chunks: int32(len(chunks)), SHA256: sum,
				Resources: s.mr.Spec.StateSync.Resources}}
		if err := ssa.Child(s.ctx, bc, ss, vm, FieldManager); err != nil {
			return false, "", err
		}
		if err := bc.Get(s.ctx, client.ObjectKeyFromObject(ss), ss); err != nil {
			return false, "", err
		}
	}
	for i, ch := range chunks {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: computev1alpha1.SnapshotChunkName(ss.Name, i), Namespace: ss.Namespace}}
		if _, err := controllerutil.CreateOrUpdate(s.ctx, bc, sec, func() error {
			sec.Type = corev1.SecretTypeOpaque
			// LabelAgent: the agent caches only Secrets that carry it.
			sec.Labels = map[string]string{computev1alpha1.LabelStateSync: ss.Name, computev1alpha1.LabelAgent: "true"}
			sec.Data = map[string][]byte{computev1alpha1.SnapshotKey: ch}
			return controllerutil.SetControllerReference(ss, sec, bc.Scheme())
		}); err != nil {
			return false, "", fmt.Errorf("the snapshot's chunk %d in the bidder's workspace: %w", i, err)
		}
	}
	return false, fmt.Sprintf("restoring snapshot %s into the tenant (%s)", from, cmp.Or(string(ss.Status.Phase), string(computev1alpha1.SyncPending))), nil
}
