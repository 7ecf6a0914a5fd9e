package marketbidder

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/ssa"
)

const (
	// maxBidWindow: requests whose deadline is further away than this are
	// not bid on (a reservation would be held for that long).
	maxBidWindow = 10 * time.Minute
	// keepFinished is how many finished contracts and settled Bids a
	// bidder keeps.
	keepFinished = 20
	// settleAfter: a lease that is over (completed or declined) is deleted
	// with its bid once the requester has removed its accept, or after
	// this long at the latest.
	settleAfter = 10 * time.Minute
	// publishers bounds the records written at once (the writes of one
	// repo go together in applyWrites batches).
	publishers = 32
	// kcpWriters bounds the kcp writes (Bids, contracts) made at once.
	kcpWriters = 16
	// defaultMaxNotice is the most notice a bidder promises by default
	// (spec.maxNoticeSeconds), and maxNoticeCap the most it can promise.
	defaultMaxNotice = 24 * 60 * 60
	maxNoticeCap     = 30 * 24 * 60 * 60
)

// trader is one reconcile of one MarketBidder's trading: its bids, the
// accepts they get and the leases it holds.
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

	// used and reserved count, per offer, the VMs leased and held by open
	// bids; unknown counts live leases whose offer is not known.
	used, reserved []int32
	unknown        int32
	// counted is set once the counts are complete (trading ran).
	counted bool
	// perRequester counts the open bids on each requester's requests.
	perRequester map[string]int32
	bids         map[string]*marketv1alpha1.Bid
	contracts    map[string]*marketv1alpha1.ComputeContract
	vms          map[string]*computev1alpha1.ComputeVM
	// exports are the StateSync exports of the VMs, by VM name.
	exports map[string]*computev1alpha1.StateSync
	// admins are the tenant admins the requester of a contract names.
	admins  func(cc *marketv1alpha1.ComputeContract) computev1alpha1.TenantAdmins
	ignored map[string]bool
	next    time.Time
	errs    []error

	// actions are the writes decided on, done by execute.
	actions []action
	// mu guards bids, contracts, ignored, errs and the counts while
	// actions run.
	mu sync.Mutex
}

// action is one write a reconcile decided on: a record write (pds), and
// what to write in kcp once it succeeded (kcp). Decisions are taken first
// and in order (capacity is counted as they are made); then the record
// writes go out together, so that the writes of one repo share applyWrites
// batches, and then the kcp writes, also concurrently.
type action struct {
	pds func() error
	kcp func() error
	// failed runs (under mu) when pds failed.
	failed func()
}

func (t *trader) do(a action) { t.actions = append(t.actions, a) }

// fail records an error (safe from actions).
func (t *trader) fail(err error) {
	if err == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.errs = append(t.errs, err)
}

// ignore counts a forged or stale record (safe from actions).
func (t *trader) ignore(r *market.Rec) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ignored[r.URI+"|"+r.CID] = true
}

// execute does the decided writes: the record writes at once, then the
// kcp writes of those that succeeded.
func (t *trader) execute() {
	done := make([]bool, len(t.actions))
	var g errgroup.Group
	g.SetLimit(publishers)
	for i, a := range t.actions {
		if a.pds == nil {
			done[i] = true
			continue
		}
		g.Go(func() error {
			if err := a.pds(); err != nil {
				t.fail(err)
				if a.failed != nil {
					t.mu.Lock()
					a.failed()
					t.mu.Unlock()
				}
				return nil
			}
			done[i] = true
			return nil
		})
	}
	_ = g.Wait() // errors are in t.errs
	var k errgroup.Group
	k.SetLimit(kcpWriters)
	for i, a := range t.actions {
		if done[i] && a.kcp != nil {
			k.Go(func() error {
				t.fail(a.kcp())
				return nil
			})
		}
	}
	_ = k.Wait()
	t.actions = nil
}

func (t *trader) due(at time.Time) {
	if !at.IsZero() && (t.next.IsZero() || at.Before(t.next)) {
		t.next = at
	}
}

// ownBid is one of the bidder's bid records.
type ownBid struct {
	uri, cid, rkey string
	bid            *market.Bid
	offer          int
	leased         bool
}

// ownLease is one of the bidder's lease records.
type ownLease struct {
	uri, cid, rkey string
	lease          *market.Lease
	bid            *ownBid
}

func (t *trader) capacity(offer int) int32 {
	if offer < 0 || offer >= len(t.b.Spec.Offers) {
		return 0
	}
	return t.b.Spec.Offers[offer].Capacity
}

// free is what an offer can still take. Leases whose offer is not known
// (their bid record or offer is gone) count against every offer.
func (t *trader) free(offer int) int32 {
	return max(t.capacity(offer)-t.used[offer]-t.unknown-t.reserved[offer], 0)
}

// offerOf finds the offer a bid was made from by its shape and price;
// -1 when the bidder no longer offers it.
func (t *trader) offerOf(b *market.Bid) int {
	if b.Shape == nil {
		return -1
	}
	// By name (the key of spec.offers; an offer whose shape or price was
	// edited keeps its bids and leases), then by shape.
	for i, o := range t.b.Spec.Offers {
		if o.Name == b.Shape.Name {
			return i
		}
	}
	for i, o := range t.b.Spec.Offers {
		if o.CPUMillis == b.Shape.CPUMillis && o.MemoryMiB == b.Shape.MemoryMiB {
			return i
		}
	}
	return -1
}

// run does the bidder's trading: leases first (what it runs), then its
// open bids (what it holds), then new bids on requests it can serve.
func (t *trader) run() {
	t.used, t.reserved, t.perRequester = make([]int32, len(t.b.Spec.Offers)), make([]int32, len(t.b.Spec.Offers)), map[string]int32{}
	if err := t.load(); err != nil {
		t.errs = append(t.errs, err)
		return
	}
	bids := map[string]*ownBid{}
	for _, rec := range t.inv.List(lexicon.Bid) {
		var b market.Bid
		if market.Decode(lexicon.Bid, rec.Value, &b) != nil {
			continue
		}
		_, _, rkey := market.SplitURI(rec.URI)
		ob := &ownBid{uri: rec.URI, cid: rec.CID, rkey: rkey, bid: &b}
		ob.offer = t.offerOf(&b)
		bids[rec.URI] = ob
	}
	for _, rec := range t.inv.List(lexicon.Lease) {
		var l market.Lease
		if market.Decode(lexicon.Lease, rec.Value, &l) != nil {
			continue
		}
		_, _, rkey := market.SplitURI(rec.URI)
		ol := &ownLease{uri: rec.URI, cid: rec.CID, rkey: rkey, lease: &l}
		// The lease names the bid it took; older leases are linked
		// through their accept.
		bid := t.bidOfAccept(l.Accept.URI)
		if l.Bid != nil {
			bid = l.Bid.URI
		}
		if ob := bids[bid]; ob != nil {
			ob.leased, ol.bid = true, ob
		}
		t.lease(ol)
	}
	for _, uri := range sortedKeys(bids) {
		if ob := bids[uri]; !ob.leased {
			t.openBid(ob)
		}
	}
	if t.stop == "" {
		t.bidOnRequests(bids)
	}
	t.counted = true
	t.execute()
	t.prune()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// load reads the Bids and ComputeContracts the bidder owns.
func (t *trader) load() error {
	t.bids, t.contracts, t.ignored = map[string]*marketv1alpha1.Bid{}, map[string]*marketv1alpha1.ComputeContract{}, map[string]bool{}
	var bids marketv1alpha1.BidList
	if err := t.c.List(t.ctx, &bids, client.InNamespace(t.b.Namespace)); err != nil {
		return err
	}
	for i := range bids.Items {
		if b := &bids.Items[i]; metav1.IsControlledBy(b, t.b) && b.Spec.Side == marketv1alpha1.SideBidder {
			t.bids[b.Name] = b
		}
	}
	var ccs marketv1alpha1.ComputeContractList
	if err := t.c.List(t.ctx, &ccs, client.InNamespace(t.b.Namespace)); err != nil {
		return err
	}
	for i := range ccs.Items {
		if cc := &ccs.Items[i]; metav1.IsControlledBy(cc, t.b) && cc.Spec.Side == marketv1alpha1.SideBidder {
			t.contracts[cc.Name] = cc
		}
	}
	t.vms = map[string]*computev1alpha1.ComputeVM{}
	var vms computev1alpha1.ComputeVMList
	if err := t.c.List(t.ctx, &vms, client.InNamespace(t.b.Namespace)); err != nil {
		return err
	}
	for i := range vms.Items {
		if vm := &vms.Items[i]; t.contracts[vm.Name] != nil && metav1.IsControlledBy(vm, t.contracts[vm.Name]) {
			t.vms[vm.Name] = vm
		}
	}
	t.exports = map[string]*computev1alpha1.StateSync{}
	if len(t.vms) == 0 {
		return nil
	}
	var syncs computev1alpha1.StateSyncList
	if err := t.c.List(t.ctx, &syncs, client.InNamespace(t.b.Namespace)); err != nil {
		return err
	}
	for i := range syncs.Items {
		ss := &syncs.Items[i]
		if vm := t.vms[ss.Spec.VMName]; vm != nil && metav1.IsControlledBy(ss, vm) && ss.Spec.Direction == computev1alpha1.Export && ss.Name == computev1alpha1.ExportName(vm.Name) {
			t.exports[vm.Name] = ss
		}
	}
	return nil
}

// exporting says whether a released VM is kept for its export: the
// requester's side made one before it released, and it has neither
// failed nor been copied to the requester (which deletes it then), for
// market.ExportWait after kcp made it at most (never a time the
// requester writes). A VM that ran and does not answer for a while (its
// phase is Provisioning again) is kept too: only a VM that is Lost or
// Failed cannot be exported.
func (t *trader) exporting(vm *computev1alpha1.ComputeVM, release *market.Rec) bool {
	ss := t.exports[vm.Name]
	switch {
	case ss == nil, release == nil, vm.Status.Phase == computev1alpha1.VMLost, vm.Status.Phase == computev1alpha1.VMFailed, !vm.DeletionTimestamp.IsZero(),
		ss.Status.Phase == computev1alpha1.SyncFailed, !ss.DeletionTimestamp.IsZero():
		return false
	case t.now.After(ss.CreationTimestamp.Add(market.ExportWait)):
		t.events.Eventf(t.b, nil, corev1.EventTypeWarning, "ExportAbandoned", "Release", "the export of %s did not end within %s: the VM stops", vm.Name, market.ExportWait)
		return false
	}
	return true
}

// ensureVM makes the ComputeVM of the contract name (owned by it) when it
// does not exist; the agent runs it.
func (t *trader) ensureVM(name string, vm *computev1alpha1.ComputeVM) error {
	t.mu.Lock()
	cc := t.contracts[name]
	t.mu.Unlock()
	if vm != nil || cc == nil || !live(cc) {
		return nil
	}
	want := &computev1alpha1.ComputeVM{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: t.b.Namespace},
		Spec: computev1alpha1.ComputeVMSpec{
			ContractName: name,
			Driver:       string(cmp.Or(t.b.Spec.Driver, marketv1alpha1.DriverProcess)),
			CPUMillis:    cc.Spec.Shape.CPUMillis,
			MemoryMiB:    cc.Spec.Shape.MemoryMiB,
		},
	}
	if t.admins != nil {
		want.Spec.Admins = t.admins(cc)
	}
	if err := ssa.Child(t.ctx, t.c, want, cc, FieldManager); err != nil {
		return err
	}
	t.events.Eventf(cc, nil, corev1.EventTypeNormal, "Provisioning", "Provision", "ComputeVM %s made for the lease; the agent runs it", name)
	return nil
}

// deleteVM deletes a contract's VM (the agent stops it).
func (t *trader) deleteVM(vm *computev1alpha1.ComputeVM) error {
	if !vm.DeletionTimestamp.IsZero() {
		return nil
	}
	uid := vm.UID
	if err := t.c.Delete(t.ctx, vm, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// bidOfAccept returns the URI of the bid an accept took: from the accept
// record, or from the contract made for it.
func (t *trader) bidOfAccept(acceptURI string) string {
	if a := t.view.Get(acceptURI); a != nil && a.Accept != nil {
		return a.Accept.Bid.URI
	}
	if cc := t.contracts[market.ChildName(t.b.Name, acceptURI)]; cc != nil {
		return cc.Spec.Bid.URI
	}
	return ""
}

// lease follows one lease: a live one counts against its offer until the
// requester releases it (or withdraws its accept); one that is over goes,
// with its bid, once the requester has cleaned up.
func (t *trader) lease(ol *ownLease) {
	l := ol.lease
	requester, _, _ := market.SplitURI(l.Accept.URI)
	acc := t.view.Get(l.Accept.URI)
	complete := t.view.Complete() == nil
	t.view.Refresh(requester)
	if acc != nil && acc.DID != requester {
		acc = nil
	}
	// An accept counts as withdrawn only once a listing of the
	// requester's repo ended after it was found missing.
	acceptKey := "accept|" + l.Accept.URI
	cc := t.contracts[market.ChildName(t.b.Name, l.Accept.URI)]
	// Once found withdrawn it stays so (the VM is stopped over several
	// passes; an absence is proved once).
	withdrawn := acc == nil && (t.absent.Gone(t.view, requester, acceptKey, t.now) ||
		(cc != nil && cc.Status.Phase == marketv1alpha1.ContractReleasing && cc.Status.Reason == string(deal.AcceptWithdrawn)))
	if acc != nil {
		t.absent.Present(acceptKey)
	}
	offer := -1
	if ol.bid != nil {
		offer = ol.bid.offer
	}
	switch l.State {
	case deal.LeaseConfirmed, deal.LeaseRunning:
		release := t.releaseOf(ol, requester)
		name := market.ChildName(t.b.Name, l.Accept.URI)
		vm := t.vms[name]
		reclaim, _ := t.reclaimOf(ol)
		noticeOver := reclaim != nil && !t.now.Before(market.ParseTime(reclaim.TerminateAfter))
		if release == nil && !withdrawn && !noticeOver {
			if offer >= 0 {
				t.used[offer]++
			} else {
				t.unknown++
			}
			t.due(t.now.Add(30 * time.Second))
			if reclaim != nil {
				t.due(market.ParseTime(reclaim.TerminateAfter))
			} else if why := t.reclaimWanted(cc); why != "" {
				t.reclaim(ol, acc, cc, why)
				return
			}
			switch {
			case vm != nil && (vm.Status.Phase == computev1alpha1.VMLost || vm.Status.Phase == computev1alpha1.VMFailed):
				// The VM is gone: the lease ends, the requester goes back to
				// the market.
				reason := deal.VMLost
				if vm.Status.Phase == computev1alpha1.VMFailed {
					reason = deal.DriverFailed
				}
				done := *l
				done.State, done.Reason, done.CAFingerprint, done.UpdatedAt = deal.LeaseCompleted, reason, "", market.Time(t.now)
				t.do(action{
					pds: func() error { _, err := t.inv.Put(t.ctx, lexicon.Lease, ol.rkey, &done); return err },
					kcp: func() error {
						t.events.Eventf(t.b, nil, corev1.EventTypeWarning, "VMLost", "Lease", "the VM of %s is %s (%s): the lease ends", name, vm.Status.Phase, vm.Status.Reason)
						return errors.Join(t.contract(ol, acc, cc, marketv1alpha1.ContractFailed, deal.Of(reason)), t.deleteVM(vm))
					},
				})
				return
			case vm != nil && vm.Status.Phase == computev1alpha1.VMRunning && (l.State != deal.LeaseRunning || l.CAFingerprint != vm.Status.CAFingerprint):
				// The VM runs: the lease says so, with the CA's fingerprint
				// (never the CA or a credential).
				up := *l
				up.State, up.CAFingerprint, up.UpdatedAt = deal.LeaseRunning, vm.Status.CAFingerprint, market.Time(t.now)
				t.do(action{
					pds: func() error { _, err := t.inv.Put(t.ctx, lexicon.Lease, ol.rkey, &up); return err },
					kcp: func() error { return t.contract(ol, acc, cc, marketv1alpha1.ContractActive, "") },
				})
				return
			}
			phase := marketv1alpha1.ContractProvisioning
			if l.State == deal.LeaseRunning {
				phase = marketv1alpha1.ContractActive
			}
			t.do(action{kcp: func() error {
				return errors.Join(t.contract(ol, acc, cc, phase, ""), t.ensureVM(name, vm))
			}})
			return
		}
		// Released, the requester withdrew its accept, or the notice of
		// the bidder's reclaim ran out: the VM stops first, then the lease
		// ends.
		reason := deal.AcceptWithdrawn
		switch {
		case release != nil:
			reason = deal.Of(release.Release.Reason)
		case !withdrawn:
			reason = deal.Of(deal.Reclaimed)
		}
		if vm != nil && t.exporting(vm, release) {
			// The tenant's objects are exported before the VM stops.
			t.do(action{kcp: func() error { return t.contract(ol, acc, cc, marketv1alpha1.ContractReleasing, reason) }})
			t.due(t.now.Add(2 * time.Second))
			return
		}
		if vm != nil {
			t.do(action{kcp: func() error {
				return errors.Join(t.contract(ol, acc, cc, marketv1alpha1.ContractReleasing, reason), t.deleteVM(vm))
			}})
			t.due(t.now.Add(2 * time.Second))
			return
		}
		done := *l
		done.State, done.UpdatedAt = deal.LeaseCompleted, market.Time(t.now)
		if reason == deal.Of(deal.Reclaimed) {
			done.Reason = deal.Reclaimed
		}
		t.do(action{
			pds: func() error { _, err := t.inv.Put(t.ctx, lexicon.Lease, ol.rkey, &done); return err },
			kcp: func() error {
				t.events.Eventf(t.b, nil, corev1.EventTypeNormal, "Completed", "Release", "lease %s ended: %s", ol.uri, reason)
				return t.contract(ol, acc, cc, marketv1alpha1.ContractCompleted, reason)
			},
		})
		t.due(t.now.Add(5 * time.Second))
	case deal.LeaseCompleted, deal.LeaseDeclined:
		if cc != nil && live(cc) {
			phase, reason := marketv1alpha1.ContractCompleted, deal.ContractReason(cc.Status.Reason)
			if l.State == deal.LeaseDeclined {
				phase, reason = marketv1alpha1.ContractFailed, deal.Of(l.Reason)
			}
			t.do(action{kcp: func() error { return t.contract(ol, acc, cc, phase, reason) }})
		}
		// The requester removes its accept (and release) once it has seen
		// the end; then the bidder's records of the deal go.
		settled := complete && acc == nil
		if at := market.ParseTime(cmp.Or(l.UpdatedAt, l.CreatedAt)); !at.IsZero() && t.now.Sub(at) > settleAfter {
			settled = true
		}
		if !settled {
			t.due(t.now.Add(30 * time.Second))
			return
		}
		// A reclaim goes before its lease (never left without one).
		t.do(action{pds: func() error {
			if err := t.inv.Delete(t.ctx, lexicon.Reclaim, market.ReclaimKey(t.owner, ol.uri)); err != nil {
				return err
			}
			return t.inv.Delete(t.ctx, lexicon.Lease, ol.rkey)
		}})
		if ol.bid != nil {
			t.do(action{pds: func() error { return t.inv.Delete(t.ctx, lexicon.Bid, ol.bid.rkey) }})
		}
	}
}

// reclaimOf returns the bidder's own reclaim of a lease and its record,
// if it made one.
func (t *trader) reclaimOf(ol *ownLease) (*market.Reclaim, *pds.Record) {
	rec := t.inv.Get(lexicon.Reclaim, market.ReclaimKey(t.owner, ol.uri))
	if rec == nil {
		return nil, nil
	}
	var rc market.Reclaim
	if market.Decode(lexicon.Reclaim, rec.Value, &rc) != nil || market.ParseTime(rc.TerminateAfter).IsZero() {
		return nil, nil // not one knotless wrote: made again
	}
	return &rc, rec
}

// reclaimWanted is the reason spec.reclaims gives for taking the live
// contract cc back ("" when it does not name it).
func (t *trader) reclaimWanted(cc *marketv1alpha1.ComputeContract) marketv1alpha1.ReclaimReason {
	if cc == nil || !live(cc) {
		return ""
	}
	for _, r := range t.b.Spec.Reclaims {
		if r.Contract == cc.Name {
			return cmp.Or(r.Reason, marketv1alpha1.ReclaimMaintenance)
		}
	}
	return ""
}

// maxNotice is the most notice the bidder promises (spec.maxNoticeSeconds,
// default a day).
func (t *trader) maxNotice() int64 {
	if t.b.Spec.MaxNoticeSeconds == nil {
		return defaultMaxNotice
	}
	return int64(*t.b.Spec.MaxNoticeSeconds)
}

// notice is what the bidder owes before it takes the VM of cc back: what
// the request asked for (the record, else what the contract kept of it),
// and when neither is known the most it promises.
func (t *trader) notice(cc *marketv1alpha1.ComputeContract) time.Duration {
	secs := int64(cc.Spec.NoticeSeconds)
	if req := t.view.Get(cc.Spec.Request.URI); req != nil && req.Request != nil && req.CID == cc.Spec.Request.CID {
		secs = req.Request.NoticeSeconds
	} else if secs == 0 {
		secs = t.maxNotice()
	}
	return time.Duration(min(max(secs, 0), maxNoticeCap)) * time.Second
}

// reclaim publishes the notice that the bidder takes a leased VM back:
// the VM keeps running until terminateAfter, the notice the request asked
// for from now.
func (t *trader) reclaim(ol *ownLease, acc *market.Rec, cc *marketv1alpha1.ComputeContract, why marketv1alpha1.ReclaimReason) {
	by := t.now.Add(t.notice(cc))
	cid := ol.cid
	if cur := t.inv.Get(lexicon.Lease, ol.rkey); cur != nil {
		cid = cur.CID
	}
	rc := &market.Reclaim{Type: lexicon.Reclaim, Lease: market.StrongRef{URI: ol.uri, CID: cid}, Reason: why,
		TerminateAfter: market.Time(by), CreatedAt: market.Time(t.now)}
	t.do(action{
		pds: func() error {
			_, err := t.inv.Put(t.ctx, lexicon.Reclaim, market.ReclaimKey(t.owner, ol.uri), rc)
			return err
		},
		kcp: func() error {
			t.events.Eventf(cc, nil, corev1.EventTypeNormal, "Reclaiming", "Reclaim", "reclaim published (%s): the VM stops after %s", why, rc.TerminateAfter)
			return t.contract(ol, acc, cc, cc.Status.Phase, deal.ContractReason(cc.Status.Reason))
		},
	})
	t.due(by)
}

// releaseOf returns the requester's release of the lease, if any; a
// release in another repo than the requester's is forged (counted).
func (t *trader) releaseOf(ol *ownLease, requester string) *market.Rec {
	var found *market.Rec
	for _, r := range t.view.Children(ol.uri, lexicon.Release) {
		if r.DID != requester {
			t.ignore(r)
			continue
		}
		found = r
	}
	return found
}

// contract applies the bidder's ComputeContract of a lease and its
// status.
func (t *trader) contract(ol *ownLease, acc *market.Rec, cc *marketv1alpha1.ComputeContract, phase marketv1alpha1.ContractPhase, reason deal.ContractReason) error {
	name := market.ChildName(t.b.Name, ol.lease.Accept.URI)
	if cc == nil {
		if acc == nil || acc.Accept == nil || ol.bid == nil {
			return nil // nothing to make it from: the deal is over
		}
		requester, _, _ := market.SplitURI(ol.lease.Accept.URI)
		cc = &marketv1alpha1.ComputeContract{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: t.b.Namespace},
			Spec: marketv1alpha1.ComputeContractSpec{
				Side:         marketv1alpha1.SideBidder,
				RequesterDID: requester,
				BidderDID:    t.st.DID,
				PricePerHour: marketv1alpha1.Price{Amount: ol.bid.bid.PricePerHour.Amount, Currency: ol.bid.bid.PricePerHour.Currency},
				Request:      market.APIRef(acc.Accept.Request),
				Bid:          market.APIRef(acc.Accept.Bid),
				Accept:       market.APIRef(acc.Ref()),
			},
		}
		if ol.bid.bid.Shape != nil {
			cc.Spec.Shape = market.APIShape(*ol.bid.bid.Shape)
		}
		// Only the version of the request the bid and the accept name (a
		// request edited since asks what the bidder never agreed to).
		if req := t.view.Get(acc.Accept.Request.URI); req != nil && req.Request != nil && req.CID == acc.Accept.Request.CID {
			cc.Spec.ReplicaIndex = int32(req.Request.ReplicaIndex)
			cc.Spec.NoticeSeconds = int32(min(max(req.Request.NoticeSeconds, 0), maxNoticeCap))
			if ol.bid.bid.Shape == nil {
				cc.Spec.Shape = market.APIShape(req.Request.Shape)
			}
		}
		if err := ssa.Child(t.ctx, t.c, cc, t.b, FieldManager); err != nil {
			return err
		}
		t.mu.Lock()
		t.contracts[name] = cc
		t.mu.Unlock()
		t.events.Eventf(t.b, nil, corev1.EventTypeNormal, "Leased", "Lease", "leased a VM to %s: ComputeContract %s", requester, name)
	}
	st := cc.Status.DeepCopy()
	st.ObservedGeneration = cc.Generation
	st.Phase, st.Reason = phase, string(reason)
	st.Records.Request, st.Records.Bid, st.Records.Accept = refPtr(cc.Spec.Request), refPtr(cc.Spec.Bid), refPtr(cc.Spec.Accept)
	st.Records.Lease = &marketv1alpha1.RecordRef{URI: ol.uri, CID: ol.cid}
	if cur := t.inv.Get(lexicon.Lease, ol.rkey); cur != nil {
		st.Records.Lease.CID = cur.CID
	}
	if rel := t.releaseOf(ol, cc.Spec.RequesterDID); rel != nil {
		st.Records.Release = &marketv1alpha1.RecordRef{URI: rel.URI, CID: rel.CID}
	}
	reclaimed := ""
	if rc, rec := t.reclaimOf(ol); rc != nil {
		st.Records.Reclaim = &marketv1alpha1.RecordRef{URI: rec.URI, CID: rec.CID}
		// To the second, as status holds it (else every pass rewrites it).
		st.Reclaim = &marketv1alpha1.ContractReclaim{Reason: string(rc.Reason), TerminateAfter: *market.MetaTime(market.ParseTime(rc.TerminateAfter))}
		if at := market.MetaTime(market.ParseTime(rc.CreatedAt)); at != nil {
			st.Reclaim.Seen = *at
		}
		reclaimed = fmt.Sprintf("; reclaimed (%s): it stops after %s", rc.Reason, rc.TerminateAfter)
	}
	status, msg := metav1.ConditionFalse, "leased; the VM is not running yet"+reclaimed
	switch phase {
	case marketv1alpha1.ContractActive:
		status, msg = metav1.ConditionTrue, "the VM runs"+reclaimed
	case marketv1alpha1.ContractCompleted:
		msg = "the lease is over: " + string(reason)
	case marketv1alpha1.ContractFailed:
		msg = "the lease failed: " + string(reason)
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: marketv1alpha1.ConditionReady, Status: status, Reason: string(phase), Message: msg, ObservedGeneration: cc.Generation})
	err := ssa.WriteStatus(t.ctx, t.c, cc, &cc.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    ssa.PhaseChanged(cc.Status.Phase, st.Phase, marketv1alpha1.ContractFailed, "", msg),
		Recorder: t.events,
		Action:   "Reconcile",
	})
	if err == nil {
		cc.Status = *st
	}
	return err
}

func refPtr(r marketv1alpha1.RecordRef) *marketv1alpha1.RecordRef { return &r }

func live(cc *marketv1alpha1.ComputeContract) bool {
	return cc.Status.Phase != marketv1alpha1.ContractCompleted && cc.Status.Phase != marketv1alpha1.ContractFailed
}

// openBid follows a bid that has no lease: the requester's accept is
// answered with a lease; a bid that lost, expired, or whose request went
// or changed is deleted (its capacity is free again); otherwise it holds
// capacity until its validUntil.
func (t *trader) openBid(ob *ownBid) {
	b := ob.bid
	requester, _, _ := market.SplitURI(b.Request.URI)
	req := t.view.Get(b.Request.URI)
	if req != nil && req.DID != requester {
		req = nil
	}
	complete := t.view.Complete() == nil
	var ours, other *market.Rec
	seen := map[string]bool{}
	for _, a := range append(t.view.Children(ob.uri, lexicon.Accept), t.view.Children(b.Request.URI, lexicon.Accept)...) {
		if seen[a.URI] || a.Accept == nil {
			continue
		}
		seen[a.URI] = true
		switch {
		case a.DID != requester:
			// An accept in a repo that is not the requester's.
			t.ignore(a)
		case a.Accept.Bid.URI == ob.uri && (a.Accept.Bid.CID != ob.cid || a.Accept.Request.URI != b.Request.URI || a.Accept.Request.CID != b.Request.CID):
			// An accept of another version of the bid or of the request.
			t.ignore(a)
		case a.Accept.Bid.URI == ob.uri:
			ours = a
		case a.Accept.Request.URI == b.Request.URI:
			other = a
		}
	}
	name := market.ChildName(t.b.Name, ob.uri+"|"+b.Request.CID)
	validUntil := market.ParseTime(b.ValidUntil)
	requestKey := "request|" + b.Request.URI
	if req != nil {
		t.absent.Present(requestKey)
	}
	switch {
	case ours != nil:
		t.answer(ob, ours, req, name)
		return
	case other != nil && t.leased(other):
		t.settleBid(ob, name, marketv1alpha1.BidLost, "another bid was leased")
		return
	case req != nil && req.CID != b.Request.CID:
		t.settleBid(ob, name, marketv1alpha1.BidWithdrawn, "the request was edited")
		return
	case req == nil && t.absent.Gone(t.view, requester, requestKey, t.now):
		t.settleBid(ob, name, marketv1alpha1.BidWithdrawn, "the request was withdrawn")
		return
	case !t.now.Before(validUntil) && complete:
		t.settleBid(ob, name, marketv1alpha1.BidExpired, "not accepted by "+b.ValidUntil)
		return
	}
	// Still open (or not known to be over: the view is incomplete). Until
	// another bid is leased, the requester may come back to this one.
	if ob.offer >= 0 {
		t.reserved[ob.offer]++
	}
	t.perRequester[requester]++
	t.view.Refresh(requester)
	t.due(validUntil)
	msg := "open until " + b.ValidUntil
	if other != nil {
		msg = "another bid was accepted; held until it is leased or this one expires at " + b.ValidUntil
	}
	t.do(action{kcp: func() error { return t.recordBid(ob, req, name, marketv1alpha1.BidOpen, msg) }})
}

// leased reports whether the accept (of another bid) was confirmed by its
// bidder with a lease in that bidder's repo.
func (t *trader) leased(acc *market.Rec) bool {
	bidder, _, _ := market.SplitURI(acc.Accept.Bid.URI)
	for _, l := range t.view.Children(acc.URI, lexicon.Lease) {
		if l.DID == bidder && l.Lease != nil && l.Lease.Accept.CID == acc.CID && (l.Lease.State == deal.LeaseConfirmed || l.Lease.State == deal.LeaseRunning) {
			return true
		}
	}
	return false
}

// answer publishes the lease that answers the requester's accept of a
// bid: confirmed when the bidder still can (not suspended, in time, with
// capacity), declined with a reason otherwise.
func (t *trader) answer(ob *ownBid, acc, req *market.Rec, name string) {
	confirmBy := market.ParseTime(acc.Accept.ConfirmBy)
	validUntil := market.ParseTime(ob.bid.ValidUntil)
	var reason deal.LeaseReason
	switch {
	case t.stop != "":
		reason = deal.Suspended
	case confirmBy.IsZero() || acc.FirstSeen.After(confirmBy) || !t.now.Before(confirmBy) || acc.FirstSeen.After(validUntil):
		reason = deal.Expired
	case ob.offer < 0 || t.used[ob.offer]+t.unknown+1 > t.capacity(ob.offer):
		reason = deal.NoCapacity
	}
	lease := &market.Lease{Type: lexicon.Lease, Accept: acc.Ref(), Bid: &market.StrongRef{URI: ob.uri, CID: ob.cid}, State: deal.LeaseConfirmed, Reason: reason,
		CreatedAt: market.Time(t.now), UpdatedAt: market.Time(t.now)}
	if reason != "" {
		lease.State = deal.LeaseDeclined
	}
	rkey := market.LeaseKey(t.owner, acc.URI)
	ol := &ownLease{uri: market.URI(t.st.DID, lexicon.Lease, rkey), rkey: rkey, lease: lease, bid: ob}
	put := func() error { _, err := t.inv.Put(t.ctx, lexicon.Lease, rkey, lease); return err }
	held := func() {
		if ob.offer >= 0 {
			t.reserved[ob.offer]++ // still held
		}
	}
	if reason != "" {
		t.do(action{pds: put, failed: held, kcp: func() error {
			t.events.Eventf(t.b, nil, corev1.EventTypeWarning, "Declined", "Lease", "declined the accept %s: %s", acc.URI, reason)
			return t.recordBid(ob, req, name, marketv1alpha1.BidDeclined, "declined: "+string(reason))
		}})
		t.due(t.now.Add(30 * time.Second))
		return
	}
	t.used[ob.offer]++
	t.do(action{pds: put, failed: func() { t.used[ob.offer]--; held() }, kcp: func() error {
		return errors.Join(t.recordBid(ob, req, name, marketv1alpha1.BidLeased, "leased: ComputeContract "+market.ChildName(t.b.Name, acc.URI)),
			t.contract(ol, acc, nil, marketv1alpha1.ContractProvisioning, ""))
	}})
	t.due(t.now.Add(30 * time.Second))
}

// settleBid deletes a bid record that can no longer be accepted and
// records why.
func (t *trader) settleBid(ob *ownBid, name string, state marketv1alpha1.BidState, msg string) {
	t.do(action{
		pds: func() error { return t.inv.Delete(t.ctx, lexicon.Bid, ob.rkey) },
		failed: func() {
			if ob.offer >= 0 {
				t.reserved[ob.offer]++ // still held
			}
		},
		kcp: func() error {
			t.mu.Lock()
			b := t.bids[name]
			t.mu.Unlock()
			if b == nil {
				return nil
			}
			return t.bidState(b, state, msg)
		},
	})
}

// bidOnRequests bids on every request of the network the bidder can
// serve and has not bid on: a vouched requester, before the deadline, at
// a price no higher than asked, from an offer with free capacity (the
// cheapest that fits). Capacity is reserved before the bid is written.
func (t *trader) bidOnRequests(bids map[string]*ownBid) {
	validity := time.Duration(cmp.Or(t.b.Spec.BidValiditySeconds, 60)) * time.Second
	type pending struct {
		req   *market.Rec
		rkey  string
		name  string
		value *market.Bid
		offer int
	}
	var todo []pending
	// A requester this bidder takes a VM back from looks elsewhere for
	// the next one (it refuses this bidder's bids): no bid is made.
	reclaiming := map[string]bool{}
	for _, cc := range t.contracts {
		if t.reclaimWanted(cc) != "" || (live(cc) && cc.Status.Reclaim != nil) {
			reclaiming[cc.Spec.RequesterDID] = true
		}
	}
	for _, req := range t.view.Requests() {
		rkey := market.BidKey(t.owner, req.URI)
		if bids[market.URI(t.st.DID, lexicon.Bid, rkey)] != nil || req.Request == nil || req.DID == t.st.DID {
			continue
		}
		name := market.ChildName(t.b.Name, market.URI(t.st.DID, lexicon.Bid, rkey)+"|"+req.CID)
		if t.bids[name] != nil {
			continue // bid on before and settled
		}
		r := req.Request
		deadline := market.ParseTime(r.BidDeadline)
		if r.Network != t.network || deadline.IsZero() || !t.now.Before(deadline) || deadline.After(t.now.Add(maxBidWindow)) || r.NoticeSeconds > t.maxNotice() {
			continue
		}
		if reclaiming[req.DID] || !market.Vouched(t.view, t.net.Spec.OperatorDID, t.id, req.DID, marketv1alpha1.RoleRequester) {
			continue
		}
		// One requester cannot hold all of the bidder's capacity with
		// requests it never accepts.
		if t.perRequester[req.DID] >= cmp.Or(t.b.Spec.MaxOpenBidsPerRequester, 10) {
			continue
		}
		offer := -1
		for i, o := range t.b.Spec.Offers {
			fits := market.Fits(market.Shape{CPUMillis: o.CPUMillis, MemoryMiB: o.MemoryMiB}, r.Shape) &&
				o.PricePerHour.Currency == r.MaxPricePerHour.Currency && o.PricePerHour.Amount <= r.MaxPricePerHour.Amount && t.free(i) > 0
			if fits && (offer < 0 || o.PricePerHour.Amount < t.b.Spec.Offers[offer].PricePerHour.Amount) {
				offer = i
			}
		}
		if offer < 0 {
			continue
		}
		o := t.b.Spec.Offers[offer]
		t.reserved[offer]++
		t.perRequester[req.DID]++
		todo = append(todo, pending{req: req, rkey: rkey, name: name, offer: offer, value: &market.Bid{
			Type:         lexicon.Bid,
			Request:      req.Ref(),
			PricePerHour: market.Price{Amount: o.PricePerHour.Amount, Currency: o.PricePerHour.Currency},
			Shape:        &market.Shape{Name: o.Name, CPUMillis: o.CPUMillis, MemoryMiB: o.MemoryMiB},
			ValidUntil:   market.Time(deadline.Add(validity)),
			Driver:       string(cmp.Or(t.b.Spec.Driver, marketv1alpha1.DriverProcess)),
			CreatedAt:    market.Time(t.now),
		}})
	}
	for _, p := range todo {
		var ob *ownBid
		t.do(action{
			pds: func() error {
				rec, err := t.inv.Put(t.ctx, lexicon.Bid, p.rkey, p.value)
				if err != nil {
					return err
				}
				ob = &ownBid{uri: rec.URI, cid: rec.CID, rkey: p.rkey, bid: p.value, offer: p.offer}
				return nil
			},
			failed: func() { t.reserved[p.offer]-- },
			kcp: func() error {
				return t.recordBid(ob, p.req, p.name, marketv1alpha1.BidOpen, "open until "+p.value.ValidUntil)
			},
		})
		t.due(market.ParseTime(p.value.ValidUntil))
	}
}

// recordBid keeps the Bid object of one of the bidder's bids and its
// state.
func (t *trader) recordBid(ob *ownBid, req *market.Rec, name string, state marketv1alpha1.BidState, msg string) error {
	t.mu.Lock()
	b := t.bids[name]
	t.mu.Unlock()
	if b == nil {
		requester, _, _ := market.SplitURI(ob.bid.Request.URI)
		b = &marketv1alpha1.Bid{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: t.b.Namespace},
			Spec: marketv1alpha1.BidSpec{
				Side:         marketv1alpha1.SideBidder,
				Request:      market.APIRef(ob.bid.Request),
				Bid:          marketv1alpha1.RecordRef{URI: ob.uri, CID: ob.cid},
				RequesterDID: requester,
				BidderDID:    t.st.DID,
				PricePerHour: marketv1alpha1.Price{Amount: ob.bid.PricePerHour.Amount, Currency: ob.bid.PricePerHour.Currency},
				ValidUntil:   market.MetaTime(market.ParseTime(ob.bid.ValidUntil)),
			},
		}
		if req != nil && req.Request != nil {
			b.Spec.ReplicaIndex = int32(req.Request.ReplicaIndex)
		}
		if ob.bid.Shape != nil {
			shape := market.APIShape(*ob.bid.Shape)
			b.Spec.Shape = &shape
		}
		if err := ssa.Child(t.ctx, t.c, b, t.b, FieldManager); err != nil {
			return err
		}
		t.mu.Lock()
		t.bids[name] = b
		t.mu.Unlock()
	}
	return t.bidState(b, state, msg)
}

func (t *trader) bidState(b *marketv1alpha1.Bid, state marketv1alpha1.BidState, msg string) error {
	want := marketv1alpha1.BidStatus{State: state, Message: msg}
	err := ssa.WriteStatus(t.ctx, t.c, b, &b.Status, &want, ssa.StatusOptions{Manager: FieldManager})
	if err == nil {
		b.Status = want
	}
	return err
}

// prune settles Bids whose record is gone and deletes settled Bids and
// finished contracts beyond the newest keepFinished.
func (t *trader) prune() {
	open := map[string]bool{}
	for _, rec := range t.inv.List(lexicon.Bid) {
		open[rec.URI] = true
	}
	var settled []client.Object
	for _, b := range t.bids {
		switch b.Status.State {
		case marketv1alpha1.BidOpen, marketv1alpha1.BidAccepted, "":
			if !open[b.Spec.Bid.URI] {
				t.errs = append(t.errs, t.bidState(b, marketv1alpha1.BidWithdrawn, "the bid record is gone"))
			}
			continue
		case marketv1alpha1.BidLeased:
			if open[b.Spec.Bid.URI] {
				continue
			}
		}
		settled = append(settled, b)
	}
	for _, cc := range t.contracts {
		if !live(cc) {
			settled = append(settled, cc)
		}
	}
	slices.SortFunc(settled, func(a, b client.Object) int {
		return b.GetCreationTimestamp().Compare(a.GetCreationTimestamp().Time)
	})
	kept := map[string]int{}
	for _, o := range settled {
		kind := fmt.Sprintf("%T", o)
		if kept[kind]++; kept[kind] <= keepFinished {
			continue
		}
		uid := o.GetUID()
		if err := t.c.Delete(t.ctx, o, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			t.errs = append(t.errs, err)
		}
	}
}

// withdrawAll ends a deleted bidder's part in the market: its bid and
// lease records are deleted (a requester whose lease is gone goes back to
// the market), so nothing of it stays published. It reports whether that
// is done.
func (t *trader) withdrawAll() bool {
	for _, col := range []string{lexicon.Reclaim, lexicon.Lease, lexicon.Bid} {
		for _, rec := range t.inv.List(col) {
			_, _, rkey := market.SplitURI(rec.URI)
			t.do(action{pds: func() error { return t.inv.Delete(t.ctx, col, rkey) }})
		}
	}
	t.execute()
	return len(t.errs) == 0
}
