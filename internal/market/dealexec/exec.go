// Package dealexec executes what a deal.Plan asks of a participant's repo
// and follower view: the record writes (those of one repo, made at once,
// share applyWrites commits) and the repos to list again. It is the part
// of a plan's execution the bidder's and the requester's controllers
// share; their kcp writes (owned by their own objects) stay with them.
package dealexec

import (
	"context"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/ssa"
)

// Publishers bounds the records written at once (the writes of one repo
// go together in applyWrites batches).
const Publishers = 32

// Written is what the record writes of a plan did: Done[i] is set when
// the i-th write (and what follows it) succeeded; CIDs are the CIDs
// written, by at-URI.
type Written struct {
	Done []bool
	CIDs map[string]string
}

// Ready reports whether a write that needs the record write needs (or
// deal.None) may be made.
func (w *Written) Ready(needs int) bool { return needs == deal.None || w.Done[needs] }

// Records makes the record writes at once. observe (when set) is called
// with the market step a write that succeeded ends (RecordOp.MarketStep,
// knotless_market_step_seconds); failed with each write that failed and
// its error. Both are called one at a time.
func Records(ctx context.Context, inv *market.Inventory, ops []deal.RecordOp, observe func(step string, since time.Time), failed func(op deal.RecordOp, err error)) *Written {
	w := &Written{Done: make([]bool, len(ops)), CIDs: map[string]string{}}
	var mu sync.Mutex
	var g errgroup.Group
	g.SetLimit(Publishers)
	for i, op := range ops {
		g.Go(func() error {
			uri, cid, err := Write(ctx, inv, &op)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed(op, err)
				return nil
			}
			w.Done[i] = true
			if op.MarketStep != "" && observe != nil {
				observe(op.MarketStep, op.Since)
			}
			if uri != "" {
				w.CIDs[uri] = cid
			}
			return nil
		})
	}
	_ = g.Wait() // errors went to failed
	return w
}

// Write makes one record write (and what follows it), returning the
// at-URI and CID of the record written (empty for a deletion).
func Write(ctx context.Context, inv *market.Inventory, op *deal.RecordOp) (uri, cid string, err error) {
	for ; op != nil; op = op.Then {
		if op.Value == nil {
			if err := inv.Delete(ctx, op.Collection, op.RKey); err != nil {
				return "", "", err
			}
			continue
		}
		rec, err := inv.Put(ctx, op.Collection, op.RKey, op.Value)
		if err != nil {
			return "", "", err
		}
		if rec != nil {
			uri, cid = rec.URI, rec.CID
		}
	}
	return uri, cid, nil
}

// Look lists again the repos the plan asks for and remembers what it
// found missing.
func Look(l deal.Look, absent *market.Absences, view market.Reader, now time.Time) {
	for _, k := range l.Note {
		absent.Note(k, now)
	}
	for _, k := range l.Forget {
		absent.Present(k)
	}
	for _, did := range l.List {
		view.List(did)
	}
	for _, did := range l.Refresh {
		view.Refresh(did)
	}
}

// WithCID sets the CID of ref to the one written for its URI.
func (w *Written) WithCID(ref *marketv1alpha1.RecordRef) {
	if ref == nil {
		return
	}
	if cid, ok := w.CIDs[ref.URI]; ok {
		ref.CID = cid
	}
}

// WithPublishedCID sets the CID of a published record to the one written
// for its URI.
func (w *Written) WithPublishedCID(ref *marketv1alpha1.PublishedRecord) {
	if ref == nil {
		return
	}
	if cid, ok := w.CIDs[ref.URI]; ok {
		ref.CID = cid
	}
}

// Bid makes the Bid object of op (when asked to; owned by owner, in its
// namespace) or writes its new state: one apply of the whole Bid (it has
// no status subresource), and none when nothing changed. existing is the
// Bid as read (nil: none). It returns the Bid as it now is (nil when there
// is none to write).
func Bid(ctx context.Context, c client.Client, owner client.Object, existing *marketv1alpha1.Bid, op *deal.BidOp, w *Written, manager string) (*marketv1alpha1.Bid, error) {
	var b *marketv1alpha1.Bid
	switch {
	case existing != nil:
		b = existing.DeepCopy()
	case op.Create != nil:
		spec := op.Create.DeepCopy()
		w.WithCID(&spec.Bid)
		b = &marketv1alpha1.Bid{ObjectMeta: metav1.ObjectMeta{Name: op.Name, Namespace: owner.GetNamespace()}, Spec: *spec}
	default:
		return nil, nil
	}
	want := op.Status
	want.Conditions = slices.Clone(b.Status.Conditions)
	ready, reason := metav1.ConditionFalse, string(want.State)
	if want.State == marketv1alpha1.BidLeased {
		ready = metav1.ConditionTrue
	}
	if reason == "" {
		reason = "Pending"
	}
	// No new observedGeneration: a Bid's generation counts its own writes
	// (it has no status subresource), so naming it would make every write
	// call for another. The one a Bid made before carries (written
	// through the status subresource, whose owner keeps it) stays.
	var gen int64
	if r := meta.FindStatusCondition(b.Status.Conditions, conditions.TypeReady); r != nil {
		gen = r.ObservedGeneration
	}
	conditions.SetReady(&want.Conditions, gen, ready, reason, want.Message)
	if existing != nil && apiequality.Semantic.DeepEqual(existing.Status, want) {
		return existing, nil
	}
	b.Status = want
	if err := ssa.WholeChild(ctx, c, b, owner, manager); err != nil {
		if existing != nil && (apierrors.IsNotFound(err) || apierrors.IsConflict(err)) {
			return existing, nil // deleted meanwhile: not made again
		}
		return existing, err
	}
	return b, nil
}
