package marketrequester

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/bodylimit"
	kclock "github.com/knotless-dev/knotless/internal/clock"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/serviceauth"
	"github.com/knotless-dev/knotless/internal/statesync"
	"github.com/knotless-dev/knotless/internal/tenant"
	"github.com/knotless-dev/knotless/internal/tenantreach"
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

// A snapshot's SHA-256 is also kept in the provider's own workspace, a
// ConfigMap of tenant.MarketNamespace per snapshot of a requester
// (snapshotRecord), which no member of the requester's workspace can
// write: a snapshot is whole only when its chunks add up to that sum, so
// chunks a member writes (a Secret may be made owned by the requester and
// carry its own sum) are never imported into the requester's tenant.
// The records of a requester go with it (sweepMounts).
const labelRequester = "market.knotless.dev/requester-uid"

// snapshotRecord is the ConfigMap of the provider's workspace that keeps
// the SHA-256 of the snapshot name of this session's requester.
func (s *session) snapshotRecord(name string) *corev1.ConfigMap {
	key := sha256.Sum256([]byte(s.lc + "/" + s.mr.Namespace + "/" + string(s.mr.UID) + "/" + name))
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: tenant.MarketNamespace, Name: "snapshot-" + hex.EncodeToString(key[:16]),
		Labels: map[string]string{tenant.LabelMarketCluster: s.lc, labelRequester: string(s.mr.UID)}}}
}

// keptSum is the SHA-256 the provider keeps for the snapshot name of this
// session's requester ("" when it keeps none).
func (s *session) keptSum(name string) string {
	if s.r.Mounts == nil {
		return ""
	}
	cm := s.snapshotRecord(name)
	if err := s.r.Mounts.Get(s.ctx, client.ObjectKeyFromObject(cm), cm); err != nil {
		if !apierrors.IsNotFound(err) {
			log.FromContext(s.ctx).Info("the snapshot's record could not be read", "snapshot", name, "error", err.Error())
		}
		return ""
	}
	return cm.Data[keySHA256]
}

// A tenant's objects move with the requester's own identity: its side
// exports the tenant of a contract it releases (spec.stateSync.mode
// Export) before it publishes the release, and imports spec.restoreFrom
// into a new tenant before it first mounts it, through package statesync
// against the tenant the bidder's lease names (deal.TenantOf), with a
// service-auth token of its PDS. Nothing goes through the bidder's
// workspace (R20). One export or import runs within the reconcile, for
// snapshotDeadline (the reconcile has a minute), and reads at most
// maxSnapshotAnswer of one answer of the tenant and maxSnapshotRead of
// them all; a failure that may pass is tried again snapshotRetry after
// the try ended, doubling (an import that got further goes on where it
// stopped, snapshotRetry later); an export that has not succeeded within
// market.ExportWait of its first try is given up (the release goes out
// without a snapshot, with an Event).
const (
	snapshotDeadline  = 40 * time.Second
	snapshotRetry     = 10 * time.Second
	maxSnapshotRead   = 2 * statesync.MaxBytes
	maxSnapshotAnswer = 16 << 20
	// maxSnapshotKept is the most a snapshot kept in chunks holds.
	maxSnapshotKept = computev1alpha1.SnapshotChunkBytes * computev1alpha1.SnapshotMaxChunks
)

// TenantState exports and imports a tenant's objects (statesync.Export
// and statesync.Import by default).
type TenantState interface {
	Export(ctx context.Context, cfg *rest.Config, resources []schema.GroupResource) ([]byte, int, error)
	// Import applies the snapshot's objects from the index from on
	// (statesync.ImportFrom).
	Import(ctx context.Context, cfg *rest.Config, snapshot []byte, allowed []schema.GroupResource, from int) (int, error)
}

type statesyncState struct{}

func (statesyncState) Export(ctx context.Context, cfg *rest.Config, resources []schema.GroupResource) ([]byte, int, error) {
	return statesync.Export(ctx, cfg, resources)
}

func (statesyncState) Import(ctx context.Context, cfg *rest.Config, snapshot []byte, allowed []schema.GroupResource, from int) (int, error) {
	return statesync.ImportFrom(ctx, cfg, snapshot, allowed, from)
}

func (r *Reconciler) tenantState() TenantState {
	if r.TenantState != nil {
		return r.TenantState
	}
	return statesyncState{}
}

// exportTry is how a released contract's export went (Reconciler.exports):
// when it was first tried, when it is tried next, and how many tries in
// a row failed.
type exportTry struct {
	first, next time.Time
	fails       int
}

// export exports the tenant of cc, whose lease is lease, into a snapshot
// kept in the requester's workspace, before its release. It reports
// whether the release may be published: the snapshot is kept, or the
// export failed for good (an Event says why; the release goes out
// without a snapshot).
func (s *session) export(cc *marketv1alpha1.ComputeContract, lease *market.Rec) (bool, error) {
	if chunks, _ := s.snapshot(cc.Name); chunks != nil {
		s.r.exports.Delete(cc.UID)
		return true, nil
	}
	last := exportTry{first: s.now}
	if v, ok := s.r.exports.Load(cc.UID); ok {
		last = v.(exportTry)
	}
	if s.now.Before(last.next) {
		s.due(last.next)
		return false, nil
	}
	failed := func(why string) (bool, error) {
		s.r.exports.Delete(cc.UID)
		s.events.Eventf(s.mr, nil, corev1.EventTypeWarning, "ExportFailed", "Release", "the tenant of %s was not exported (%s); it is released without a snapshot", cc.Name, why)
		return true, nil
	}
	tn, err := deal.TenantOf(cc.Spec.BidderDID, lease.Lease)
	if err != nil {
		return failed("the bidder's lease does not say how to reach the tenant")
	}
	var data []byte
	var n int
	_, err = s.withToken(cc, tn, serviceauth.Method, s.now.Add(snapshotDeadline+time.Minute), snapshotDeadline, func(ctx context.Context, token string) (err error) {
		data, n, err = s.r.tenantState().Export(ctx, s.r.snapshotConfig(tn, token), computev1alpha1.SchemaGroupResources(s.mr.Spec.StateSync.Resources))
		return err
	})
	switch {
	case errors.Is(err, statesync.ErrInvalid):
		return failed(snapshotRefusal(err))
	case err == nil && len(data) > maxSnapshotKept:
		return failed(fmt.Sprintf("the snapshot is more than %d bytes", maxSnapshotKept))
	case err == nil:
		if err = s.keepSnapshot(cc.Name, data, n); err != nil {
			log.FromContext(s.ctx).Info("the snapshot was not kept", "contract", cc.Name, "error", err.Error())
			err = errSnapshotNotKept
		}
	}
	if err != nil {
		// Counted from when the try ended, which may be most of the
		// reconcile's minute after it began.
		end := kclock.Now(s.r.Now)
		if end.Sub(last.first) >= market.ExportWait {
			why := refusal(err)
			if errors.Is(err, errSnapshotNotKept) {
				why = err.Error()
			}
			return failed(why + "; given up after " + market.ExportWait.String())
		}
		wait := backoff(snapshotRetry, last.fails, market.ExportWait)
		s.r.exports.Store(cc.UID, exportTry{first: last.first, next: end.Add(wait), fails: last.fails + 1})
		s.due(end.Add(wait))
		return false, nil
	}
	s.r.exports.Delete(cc.UID)
	s.events.Eventf(s.mr, nil, corev1.EventTypeNormal, "Exported", "Release", "the tenant of %s was exported: %d objects, %d bytes, kept as snapshot %s (spec.restoreFrom: %s)",
		cc.Name, n, len(data), cc.Name, cc.Name)
	return true, nil
}

// errSnapshotNotKept: the export's snapshot could not be written to the
// requester's workspace, or its sum to the provider's (the provider's log says why).
var errSnapshotNotKept = errors.New("the snapshot could not be kept (the provider's log says why)")

// keepSnapshot keeps data, a snapshot of n objects, as snapshot name in
// the requester's workspace: its chunks (statesync.Chunks), each a Secret
// owned by the MarketRequester; then its SHA-256 in the provider's
// workspace (snapshotRecord).
func (s *session) keepSnapshot(name string, data []byte, n int) error {
	if s.r.Mounts == nil {
		return errNoMountStore
	}
	chunks := statesync.Chunks(data, computev1alpha1.SnapshotChunkBytes)
	sum := statesync.Sum(data)
	for i, ch := range chunks {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: computev1alpha1.SnapshotChunkName(snapshotOwner(name), i), Namespace: s.mr.Namespace}}
		if _, err := controllerutil.CreateOrUpdate(s.ctx, s.c, sec, func() error {
			sec.Type = corev1.SecretTypeOpaque
			sec.Labels = map[string]string{LabelSnapshot: name}
			sec.Data = map[string][]byte{
				computev1alpha1.SnapshotKey: ch,
				keyIndex:                    []byte(strconv.Itoa(i)),
				keyChunks:                   []byte(strconv.Itoa(len(chunks))),
				keySHA256:                   []byte(sum),
				keyObjects:                  []byte(strconv.Itoa(n)),
			}
			return controllerutil.SetControllerReference(s.mr, sec, s.c.Scheme())
		}); err != nil {
			return fmt.Errorf("the snapshot's chunk %d: %w", i, err)
		}
	}
	// Chunks past the new last one (of a longer snapshot written before)
	// would keep it from being whole.
	var secs corev1.SecretList
	if err := s.c.List(s.ctx, &secs, client.InNamespace(s.mr.Namespace), client.MatchingLabels{LabelSnapshot: name}); err != nil {
		return err
	}
	for i := range secs.Items {
		if sec := &secs.Items[i]; atoi(sec.Data[keyIndex]) >= len(chunks) && metav1.IsControlledBy(sec, s.mr) {
			if err := client.IgnoreNotFound(s.c.Delete(s.ctx, sec)); err != nil {
				return err
			}
		}
	}
	rec := s.snapshotRecord(name)
	want := rec.Labels
	_, err := controllerutil.CreateOrUpdate(s.ctx, s.r.Mounts, rec, func() error {
		rec.Labels, rec.Data = want, map[string]string{keySHA256: sum}
		return nil
	})
	return err
}

// restoreTry is how the import of a snapshot into a new contract's
// tenant went (Reconciler.restores): done, failed for good (why), or
// when it is tried next after failures that may pass.
type restoreTry struct {
	// sum is the snapshot's SHA-256, tenant the tenant's service identity
	// and endpoint: another snapshot or another tenant starts afresh.
	sum, tenant, failed, why string
	done                     bool
	next                     time.Time
	fails                    int
	// applied is how many of the snapshot's objects are applied.
	applied int
}

// restoreFirst imports spec.restoreFrom into tn, the tenant of cc, before
// it is first mounted. A contract that was Active once is never restored
// (its tenant has live objects). It reports whether the import is done,
// and what it waits for.
func (s *session) restoreFirst(cc *marketv1alpha1.ComputeContract, tn deal.Tenant) (bool, string) {
	from := s.mr.Spec.RestoreFrom
	if from == "" || cc.Status.Phase == marketv1alpha1.ContractActive {
		return true, ""
	}
	chunks, sum := s.snapshot(from)
	if chunks == nil {
		s.due(s.now.Add(snapshotRetry))
		return false, fmt.Sprintf("snapshot %s (spec.restoreFrom) is not whole in this workspace: not mounted", from)
	}
	tenant := tn.ServiceID + " " + tn.Endpoint
	var last restoreTry
	if v, ok := s.r.restores.Load(cc.UID); ok && v.(restoreTry).sum == sum && v.(restoreTry).tenant == tenant {
		last = v.(restoreTry)
	}
	switch {
	case last.done:
		return true, ""
	case last.failed != "":
		return false, last.failed
	case s.now.Before(last.next):
		s.due(last.next)
		return false, last.why
	}
	n := last.applied
	_, err := s.withToken(cc, tn, serviceauth.Method, s.now.Add(snapshotDeadline+time.Minute), snapshotDeadline, func(ctx context.Context, token string) (err error) {
		n, err = s.r.tenantState().Import(ctx, s.r.snapshotConfig(tn, token), bytes.Join(chunks, nil), computev1alpha1.SchemaGroupResources(s.mr.Spec.StateSync.Resources), last.applied)
		return err
	})
	switch {
	case err == nil:
		s.r.restores.Store(cc.UID, restoreTry{sum: sum, tenant: tenant, done: true})
		s.events.Eventf(s.mr, nil, corev1.EventTypeNormal, "Restored", "Provision", "snapshot %s was restored into the tenant of %s: %d objects", from, cc.Name, n)
		return true, ""
	case errors.Is(err, statesync.ErrInvalid):
		why := fmt.Sprintf("restoring snapshot %s failed (%s): not mounted; remove spec.restoreFrom to mount the tenant without it", from, snapshotRefusal(err))
		s.r.restores.Store(cc.UID, restoreTry{sum: sum, tenant: tenant, failed: why})
		return false, why
	}
	// Counted from when the try ended; a try that got further goes on
	// soon, where it stopped.
	end, fails := kclock.Now(s.r.Now), last.fails
	if n > last.applied {
		fails = 0
	}
	wait := backoff(snapshotRetry, fails, mountTokenMaxWait)
	why := fmt.Sprintf("restoring snapshot %s into the tenant (%d objects applied): %s; tried again at %s", from, n, refusal(err), market.Time(end.Add(wait)))
	s.r.restores.Store(cc.UID, restoreTry{sum: sum, tenant: tenant, why: why, next: end.Add(wait), fails: fails + 1, applied: max(n, last.applied)})
	s.due(end.Add(wait))
	return false, why
}

// snapshotRefusal says why an export or import failed for good
// (statesync.ErrInvalid): statesync's own words, unless the tenant refused
// an object (its answer stays in the provider's log, R17).
func snapshotRefusal(err error) string {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return "the tenant refused an object of the snapshot"
	}
	return err.Error()
}

// snapshotConfig is the configuration of tn for one export or import as
// the bearer of token: tenantreach.Config's, with answers of at most
// maxSnapshotAnswer, all of the job's read against one budget of
// maxSnapshotRead, and a rate of 200 requests/s (an import applies
// objects one by one).
func (r *Reconciler) snapshotConfig(tn deal.Tenant, token string) *rest.Config {
	cfg := tenantreach.Config(tn, token, r.Policy, tenantreach.MaxAnswer)
	cfg.Timeout, cfg.QPS, cfg.Burst = snapshotDeadline, 200, 400
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return bodylimit.Budget(bodylimit.Transport(rt, maxSnapshotAnswer), maxSnapshotRead)
	}
	return cfg
}

// snapshot returns the chunks of a whole snapshot of this requester and
// its SHA-256; nil when there is none or it is not whole: its chunks do
// not add up to the sum they say, or to the one the provider keeps.
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
	if hex.EncodeToString(h.Sum(nil)) != sum || s.keptSum(name) != sum {
		return nil, ""
	}
	return chunks, sum
}

func atoi(b []byte) int {
	n, err := strconv.Atoi(string(b))
	if err != nil {
		return -1
	}
	return n
}
