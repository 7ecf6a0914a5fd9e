package deal

import (
	"cmp"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
)

// leaseView is what a decision about one lease knows.
type leaseView struct {
	ol        *ownLease
	requester string
	acc       *market.Rec
	cc        *marketv1alpha1.ComputeContract
	name      string
	withdrawn bool
	offer     int
}

// lease follows one lease: a live one counts against its offer until the
// requester releases it (or withdraws its accept); one that is over goes,
// with its bid, once the requester has cleaned up.
func (d *bidder) lease(ol *ownLease) {
	l := ol.lease
	requester, _, _ := market.SplitURI(l.Accept.URI)
	lv := &leaseView{ol: ol, requester: requester, acc: d.s.View.Get(l.Accept.URI), offer: -1,
		name: market.ChildName(d.s.Name, l.Accept.URI)}
	d.p.Look.Refresh = append(d.p.Look.Refresh, requester)
	if lv.acc != nil && lv.acc.DID != requester {
		lv.acc = nil
	}
	lv.cc = d.s.Contracts[lv.name]
	// An accept counts as withdrawn only once a listing of the
	// requester's repo ended after it was found missing; once found
	// withdrawn it stays so (the VM is stopped over several passes).
	acceptKey := "accept|" + l.Accept.URI
	lv.withdrawn = lv.acc == nil && (d.gone(requester, acceptKey) ||
		(lv.cc != nil && lv.cc.Status.Phase == marketv1alpha1.ContractReleasing && lv.cc.Status.Reason == string(AcceptWithdrawn)))
	if lv.acc != nil {
		d.present(acceptKey)
	}
	if ol.bid != nil {
		lv.offer = ol.bid.offer
	}
	switch {
	case Live(l.State):
		d.liveLease(lv)
	case l.State == LeaseCompleted, l.State == LeaseDeclined:
		d.overLease(lv)
	}
}

// liveLease follows a confirmed or running lease.
func (d *bidder) liveLease(lv *leaseView) {
	release := d.releaseOf(lv.ol, lv.requester)
	reclaim, _ := d.reclaimOf(lv.ol)
	noticeOver := reclaim != nil && !d.now.Before(market.ParseTime(reclaim.TerminateAfter))
	if release != nil || lv.withdrawn || noticeOver {
		d.endLease(lv, release)
		return
	}
	if lv.offer >= 0 {
		d.p.Counts.Used[lv.offer]++
	} else {
		d.p.Counts.Unknown++
	}
	d.p.due(d.now.Add(leaseLook))
	if reclaim != nil {
		d.p.due(market.ParseTime(reclaim.TerminateAfter))
	} else if why := d.reclaimWanted(lv.cc); why != "" {
		d.reclaim(lv, why)
		return
	}
	l, vm := lv.ol.lease, d.s.VMs[lv.name]
	switch {
	case vm != nil && (vm.Status.Phase == computev1alpha1.VMLost || vm.Status.Phase == computev1alpha1.VMFailed):
		// The VM is gone: the lease ends, the requester goes back to the
		// market.
		d.p.step(LeaseVMLost, lv.ol.uri)
		reason := VMLost
		if vm.Status.Phase == computev1alpha1.VMFailed {
			reason = DriverFailed
		}
		done := *l
		done.State, done.Reason, done.UpdatedAt = LeaseCompleted, reason, market.Time(d.now)
		done.CAFingerprint, done.CABundle, done.Endpoint, done.ServiceID, done.Gateway = "", "", "", "", ""
		done.SSHAddress, done.SSHHostKey = "", ""
		i := d.p.record(RecordOp{Collection: lexicon.Lease, RKey: lv.ol.rkey, Value: &done})
		d.p.event("", corev1.EventTypeWarning, "VMLost", "Lease", fmt.Sprintf("the VM of %s is %s (%s): the lease ends", lv.name, vm.Status.Phase, vm.Status.Reason), i)
		d.contractOf(lv.ol, lv.acc, lv.cc, marketv1alpha1.ContractFailed, Of(reason), i, nil)
		d.deleteVM(vm, i)
	case vm != nil && vm.Status.Phase == computev1alpha1.VMRunning && !leaseShows(l, vm):
		// The VM runs: the lease says so, with the tenant's endpoint, its
		// CA bundle and that bundle's pin, its service identity (never a
		// credential: callers authenticate with their own identity) and
		// the agent's gateways (HTTP, SSH), if it runs them.
		d.p.step(LeaseRun, lv.ol.uri)
		up := *l
		up.State, up.CAFingerprint, up.UpdatedAt = LeaseRunning, vm.Status.CAFingerprint, market.Time(d.now)
		up.CABundle, up.Endpoint, up.ServiceID, up.Gateway = vm.Status.CABundle, vm.Status.Endpoint, vm.Status.ServiceID, vm.Status.Gateway
		up.SSHAddress, up.SSHHostKey = vm.Status.SSHAddress, vm.Status.SSHHostKey
		i := d.p.record(RecordOp{Collection: lexicon.Lease, RKey: lv.ol.rkey, Value: &up})
		d.contractOf(lv.ol, lv.acc, lv.cc, marketv1alpha1.ContractActive, "", i, nil)
	default:
		d.p.step(LeaseProvision, lv.ol.uri)
		phase := marketv1alpha1.ContractProvisioning
		if l.State == LeaseRunning {
			phase = marketv1alpha1.ContractActive
		}
		d.contractOf(lv.ol, lv.acc, lv.cc, phase, "", None, nil)
		d.ensureVM(lv.name, vm)
	}
}

// ensureVM makes the ComputeVM of the contract name when it does not
// exist and the contract does (the VM is owned by it); the agent runs it.
func (d *bidder) ensureVM(name string, vm *computev1alpha1.ComputeVM) {
	cc := d.s.Contracts[name]
	if vm != nil || cc == nil || !live(cc) {
		return
	}
	d.p.VMs = append(d.p.VMs, VMOp{Name: name, Needs: None, Create: &computev1alpha1.ComputeVMSpec{
		ContractName: name,
		Driver:       string(cmp.Or(d.s.Spec.Driver, marketv1alpha1.DriverProcess)),
		CPUMillis:    cc.Spec.Shape.CPUMillis,
		MemoryMiB:    cc.Spec.Shape.MemoryMiB,
		// The requester's identity administers the tenant, and the
		// tenant's service identity is the bidder's (both from the
		// contract's agreement, which never changes).
		AdminDIDs:  []string{cc.Spec.RequesterDID},
		ServiceDID: cc.Spec.BidderDID,
	}})
	d.p.event(name, corev1.EventTypeNormal, "Provisioning", "Provision", fmt.Sprintf("ComputeVM %s made for the lease; the agent runs it", name), None)
}

func (d *bidder) deleteVM(vm *computev1alpha1.ComputeVM, needs int) {
	if vm.DeletionTimestamp.IsZero() {
		d.p.VMs = append(d.p.VMs, VMOp{Name: vm.Name, Delete: vm, Needs: needs})
	}
}

// endLease ends a lease that was released, whose accept the requester
// withdrew, or whose reclaim notice ran out: the VM stops first, then the
// lease ends. (The requester's side exported the tenant, if it wanted
// to, before it released.)
func (d *bidder) endLease(lv *leaseView, release *market.Rec) {
	reason := AcceptWithdrawn
	switch {
	case release != nil:
		reason = Of(release.Release.Reason)
	case !lv.withdrawn:
		reason = Of(Reclaimed)
	}
	if vm := d.s.VMs[lv.name]; vm != nil {
		d.p.step(LeaseStopVM, lv.ol.uri)
		d.contractOf(lv.ol, lv.acc, lv.cc, marketv1alpha1.ContractReleasing, reason, None, nil)
		d.deleteVM(vm, None)
		d.p.due(d.now.Add(2 * time.Second))
		return
	}
	d.p.step(LeaseComplete, lv.ol.uri)
	done := *lv.ol.lease
	done.State, done.UpdatedAt = LeaseCompleted, market.Time(d.now)
	if reason == Of(Reclaimed) {
		done.Reason = Reclaimed
	}
	i := d.p.record(RecordOp{Collection: lexicon.Lease, RKey: lv.ol.rkey, Value: &done})
	d.p.event("", corev1.EventTypeNormal, "Completed", "Release", fmt.Sprintf("lease %s ended: %s", lv.ol.uri, reason), i)
	d.contractOf(lv.ol, lv.acc, lv.cc, marketv1alpha1.ContractCompleted, reason, i, nil)
	d.p.due(d.now.Add(5 * time.Second))
}

// overLease follows a completed or declined lease: its contract says so,
// and its records go once the requester has removed its accept.
func (d *bidder) overLease(lv *leaseView) {
	l := lv.ol.lease
	if lv.cc != nil && live(lv.cc) {
		d.p.step(LeaseEnded, lv.ol.uri)
		phase, reason := marketv1alpha1.ContractCompleted, ContractReason(lv.cc.Status.Reason)
		if l.State == LeaseDeclined || l.Reason == VMLost || l.Reason == DriverFailed {
			// As lease.vm-lost says it, when the pass that ended the lease
			// did not get to write the contract.
			phase, reason = marketv1alpha1.ContractFailed, Of(l.Reason)
		}
		d.contractOf(lv.ol, lv.acc, lv.cc, phase, reason, None, nil)
	}
	// The requester removes its accept (and release) once it has seen
	// the end; then the bidder's records of the deal go.
	settled := d.complete && lv.acc == nil
	if at := market.ParseTime(cmp.Or(l.UpdatedAt, l.CreatedAt)); !at.IsZero() && d.now.Sub(at) > SettleAfter {
		settled = true
	}
	if !settled {
		d.p.step(LeaseWait, lv.ol.uri)
		d.p.due(d.now.Add(leaseLook))
		return
	}
	d.p.step(LeaseSettle, lv.ol.uri)
	// A reclaim goes before its lease (never left without one).
	lease := &RecordOp{Collection: lexicon.Lease, RKey: lv.ol.rkey}
	if _, ok := d.reclaims[market.ReclaimKey(d.s.Owner, lv.ol.uri)]; ok {
		d.p.record(RecordOp{Collection: lexicon.Reclaim, RKey: market.ReclaimKey(d.s.Owner, lv.ol.uri), Then: lease})
	} else {
		d.p.record(*lease)
	}
	if lv.ol.bid != nil {
		d.p.record(RecordOp{Collection: lexicon.Bid, RKey: lv.ol.bid.rkey})
	}
}

// reclaim publishes the notice that the bidder takes a leased VM back:
// the VM keeps running until terminateAfter, the notice the request asked
// for from now.
func (d *bidder) reclaim(lv *leaseView, why ReclaimReason) {
	d.p.step(LeaseReclaim, lv.ol.uri)
	by := d.now.Add(d.notice(lv.cc))
	rc := &market.Reclaim{Type: lexicon.Reclaim, Lease: market.StrongRef{URI: lv.ol.uri, CID: lv.ol.cid}, Reason: why,
		TerminateAfter: market.Time(by), CreatedAt: market.Time(d.now)}
	i := d.p.record(RecordOp{Collection: lexicon.Reclaim, RKey: market.ReclaimKey(d.s.Owner, lv.ol.uri), Value: rc})
	d.p.event(lv.cc.Name, corev1.EventTypeNormal, "Reclaiming", "Reclaim", fmt.Sprintf("reclaim published (%s): the VM stops after %s", why, rc.TerminateAfter), i)
	d.contractOf(lv.ol, lv.acc, lv.cc, lv.cc.Status.Phase, ContractReason(lv.cc.Status.Reason), i, rc)
	d.p.due(by)
}

// leaseShows: the lease l says that vm runs, as vm's status says it is
// reached.
func leaseShows(l *market.Lease, vm *computev1alpha1.ComputeVM) bool {
	st := &vm.Status
	return l.State == LeaseRunning && l.CAFingerprint == st.CAFingerprint && l.CABundle == st.CABundle &&
		l.Endpoint == st.Endpoint && l.ServiceID == st.ServiceID && l.Gateway == st.Gateway &&
		l.SSHAddress == st.SSHAddress && l.SSHHostKey == st.SSHHostKey
}
