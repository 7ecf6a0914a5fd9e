package marketbidder

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/market/dealexec"
	"github.com/knotless-dev/knotless/internal/ssa"
)

const (
	// kcpWriters bounds the kcp writes (Bids, contracts, VMs) made at once.
	kcpWriters = 16
)

// trader is one reconcile of one MarketBidder's trading: load what the
// records and the kcp objects say, decide (deal.DecideBidder), execute
// the plan: the record writes, then the kcp writes of those that
// succeeded, one status write per object.
type trader struct {
	ctx     context.Context
	c       client.Client
	b       *marketv1alpha1.MarketBidder
	st      *marketv1alpha1.MarketBidderStatus
	events  events.EventRecorder
	now     time.Time
	id      *marketv1alpha1.MarketIdentity
	net     *marketv1alpha1.MarketNetwork
	network string
	view    market.Reader
	inv     *market.Inventory
	owner   string
	absent  *market.Absences
	// stop is why no new work is taken ("" when it may be).
	stop string
	// observe records a market step ended by a record write (nil: none).
	observe func(step string, since time.Time)

	snap *deal.BidderSnapshot
	plan *deal.Plan
	// counted is set once the counts are complete (trading ran).
	counted bool
	errs    []error
	// mu guards errs and the plan's counts while the plan runs.
	mu sync.Mutex
}

// fail records an error (safe from the plan's writers).
func (t *trader) fail(err error) {
	if err == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.errs = append(t.errs, err)
}

// run does the bidder's trading.
func (t *trader) run() {
	if err := t.load(); err != nil {
		t.errs = append(t.errs, err)
		return
	}
	t.plan = deal.DecideBidder(t.snap, t.now)
	t.look()
	t.execute()
	t.counted = true
}

// used and reserved are the plan's counts for offer i (0 before a plan).
func (t *trader) used(i int) int32 {
	if t.plan == nil || i >= len(t.plan.Counts.Used) {
		return 0
	}
	return t.plan.Counts.Used[i]
}

func (t *trader) reserved(i int) int32 {
	if t.plan == nil || i >= len(t.plan.Counts.Reserved) {
		return 0
	}
	return t.plan.Counts.Reserved[i]
}

// next is when the plan wants another look (zero: the resync).
func (t *trader) next() time.Time {
	if t.plan == nil {
		return time.Time{}
	}
	return t.plan.Requeue
}

// load reads the bidder's own records and the kcp objects it owns into
// the snapshot the decision reads.
func (t *trader) load() error {
	s := &deal.BidderSnapshot{Name: t.b.Name, Namespace: t.b.Namespace, DID: t.st.DID, Owner: t.owner, Network: t.network,
		Operator: t.net.Spec.OperatorDID, Spec: t.b.Spec, Identity: t.id, Stop: t.stop, View: t.view, Missing: t.absent,
		Bids: t.inv.List(lexicon.Bid), Leases: t.inv.List(lexicon.Lease), Reclaims: t.inv.List(lexicon.Reclaim),
		BidObjects: map[string]*marketv1alpha1.Bid{}, Contracts: map[string]*marketv1alpha1.ComputeContract{},
		VMs: map[string]*computev1alpha1.ComputeVM{}}
	t.snap = s
	var bids marketv1alpha1.BidList
	if err := t.c.List(t.ctx, &bids, client.InNamespace(t.b.Namespace)); err != nil {
		return err
	}
	for i := range bids.Items {
		if b := &bids.Items[i]; metav1.IsControlledBy(b, t.b) && b.Spec.Side == marketv1alpha1.SideBidder {
			s.BidObjects[b.Name] = b
		}
	}
	var ccs marketv1alpha1.ComputeContractList
	if err := t.c.List(t.ctx, &ccs, client.InNamespace(t.b.Namespace)); err != nil {
		return err
	}
	for i := range ccs.Items {
		if cc := &ccs.Items[i]; metav1.IsControlledBy(cc, t.b) && cc.Spec.Side == marketv1alpha1.SideBidder {
			s.Contracts[cc.Name] = cc
		}
	}
	var vms computev1alpha1.ComputeVMList
	if err := t.c.List(t.ctx, &vms, client.InNamespace(t.b.Namespace)); err != nil {
		return err
	}
	for i := range vms.Items {
		if vm := &vms.Items[i]; s.Contracts[vm.Name] != nil && metav1.IsControlledBy(vm, s.Contracts[vm.Name]) {
			s.VMs[vm.Name] = vm
		}
	}
	return nil
}

// look lists again the repos the plan asks for and remembers what it
// found missing.
func (t *trader) look() { dealexec.Look(t.plan.Look, t.absent, t.view, t.now) }

// execute makes the plan's writes: the record writes at once (those of
// one repo share applyWrites commits), then the kcp writes of those that
// succeeded, then the deletions of finished objects.
func (t *trader) execute() {
	p := t.plan
	w := dealexec.Records(t.ctx, t.inv, p.Records, t.observe, func(op deal.RecordOp, err error) {
		t.fail(err)
		t.mu.Lock()
		defer t.mu.Unlock()
		undo(&p.Counts, op.Undo)
	})
	ready := w.Ready
	var k errgroup.Group
	k.SetLimit(kcpWriters)
	for _, op := range p.Bids {
		if ready(op.Needs) {
			k.Go(func() error { t.fail(t.bid(op, w)); return nil })
		}
	}
	for _, op := range p.Contracts {
		if ready(op.Needs) {
			k.Go(func() error { t.fail(t.contract(op, w)); return nil })
		}
	}
	for _, op := range p.VMs {
		if ready(op.Needs) {
			k.Go(func() error { t.fail(t.vm(op)); return nil })
		}
	}
	_ = k.Wait()
	for _, ev := range p.Events {
		if ready(ev.Needs) {
			t.event(ev)
		}
	}
	for _, del := range p.Deletes {
		t.fail(t.delete(del))
	}
}

// undo gives back what a failed record write would have taken or freed.
func undo(c *deal.Counts, u deal.Undo) {
	if u.Offer < 0 || u.Offer >= len(c.Used) {
		return
	}
	c.Used[u.Offer] += u.Used
	c.Reserved[u.Offer] += u.Reserved
}

// bid makes a Bid object (when asked to) and writes its status.
func (t *trader) bid(op *deal.BidOp, w *dealexec.Written) error {
	_, err := dealexec.Bid(t.ctx, t.c, t.b, t.snap.BidObjects[op.Name], op, w, FieldManager)
	return err
}

// contract makes a ComputeContract (when asked to) and writes its status
// when it changed.
func (t *trader) contract(op *deal.ContractOp, w *dealexec.Written) error {
	cc := t.snap.Contracts[op.Name]
	if op.Create != nil {
		cc = &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Name: op.Name, Namespace: t.b.Namespace}, Spec: *op.Create}
		if err := ssa.Child(t.ctx, t.c, cc, t.b, FieldManager); err != nil {
			return err
		}
	}
	if cc == nil {
		return nil
	}
	st := op.Status.DeepCopy()
	if op.Create != nil {
		// The plan could not know the generation of a contract it makes:
		// the server's answer says it (else the next pass writes the
		// status again only for it).
		st.ObservedGeneration = cc.Generation
		for i := range st.Conditions {
			st.Conditions[i].ObservedGeneration = cc.Generation
		}
	}
	w.WithCID(st.Records.Lease)
	w.WithCID(st.Records.Reclaim)
	msg := ""
	if len(st.Conditions) > 0 {
		msg = st.Conditions[0].Message
	}
	return ssa.WriteStatus(t.ctx, t.c, cc, &cc.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    ssa.PhaseMoved(cc.Status.Phase, st.Phase, marketv1alpha1.ContractFailed, "", msg),
		Recorder: t.events,
		Action:   "Reconcile",
	})
}

// vm makes or deletes a contract's ComputeVM (the agent runs or stops
// it).
func (t *trader) vm(op deal.VMOp) error {
	if op.Delete != nil {
		uid := op.Delete.UID
		if err := t.c.Delete(t.ctx, op.Delete, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	}
	cc := t.snap.Contracts[op.Name]
	if cc == nil {
		return nil
	}
	want := &computev1alpha1.ComputeVM{ObjectMeta: metav1.ObjectMeta{Name: op.Name, Namespace: t.b.Namespace}, Spec: *op.Create}
	return ssa.Child(t.ctx, t.c, want, cc, FieldManager)
}

// event records one of the plan's Events, on the contract it names (the
// bidder when it names none or the contract is not there).
func (t *trader) event(ev deal.Event) {
	var on client.Object = t.b
	if cc := t.snap.Contracts[ev.Contract]; ev.Contract != "" && cc != nil {
		on = cc
	}
	t.events.Eventf(on, nil, ev.Type, ev.Reason, ev.Action, "%s", ev.Note)
}

// delete deletes a finished Bid or ComputeContract.
func (t *trader) delete(del deal.Delete) error {
	var o client.Object = del.Bid
	if del.Contract != nil {
		o = del.Contract
	}
	uid := o.GetUID()
	if err := t.c.Delete(t.ctx, o, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return err
	}
	return nil
}

// withdrawAll ends a deleted bidder's part in the market: its bid and
// lease records are deleted (a requester whose lease is gone goes back to
// the market), so nothing of it stays published. It reports whether that
// is done.
func (t *trader) withdrawAll() bool {
	var ops []deal.RecordOp
	for _, col := range []string{lexicon.Reclaim, lexicon.Lease, lexicon.Bid} {
		for _, rec := range t.inv.List(col) {
			_, _, rkey := market.SplitURI(rec.URI)
			ops = append(ops, deal.RecordOp{Collection: col, RKey: rkey})
		}
	}
	var g errgroup.Group
	g.SetLimit(dealexec.Publishers)
	for _, op := range ops {
		g.Go(func() error {
			_, _, err := dealexec.Write(t.ctx, t.inv, &op)
			t.fail(err)
			return nil
		})
	}
	_ = g.Wait()
	return len(t.errs) == 0
}
