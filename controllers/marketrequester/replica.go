package marketrequester

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/ssa"
)

// replica follows one replica's contracts; wanted says whether it should
// have a VM. It returns the replica's status, whether the replica stays in
// status.requests, and the replica's buying round when it needs a VM (its
// status then comes from the round: deal.DecideRequester).
func (s *session) replica(rr *replicaRecords, wanted bool) (marketv1alpha1.RequestStatus, bool, *deal.Replica, error) {
	rs := marketv1alpha1.RequestStatus{Index: rr.index, Attempt: rr.attempt, State: marketv1alpha1.RequestOpen}
	accepts := s.acceptsOf(rr)
	var reclaimed *marketv1alpha1.ComputeContract
	if ccs := s.contractsOf(rr.index); len(ccs) > 0 {
		// A contract whose bidder reclaimed it runs until a newer one of
		// the replica is Active; then it is released.
		for i, cc := range ccs[:len(ccs)-1] {
			keep, reason := wanted && !anyActive(ccs[i+1:]), s.release
			if wanted {
				reason = deal.ReleaseReclaimed
			}
			if _, err := s.contracted(rr, cc, accepts, keep, reason, &marketv1alpha1.RequestStatus{}); err != nil {
				return rs, true, nil, err
			}
		}
		cc := ccs[len(ccs)-1]
		finished, err := s.contracted(rr, cc, accepts, wanted, s.release, &rs)
		switch {
		case err != nil:
			return rs, true, nil, err
		case finished:
			// The deal is over: the replica goes back to the market (or
			// away).
			s.due(s.now)
			return rs, wanted || len(ccs) > 1, nil, nil
		case !wanted:
			// A request for the next VM of a reclaimed one goes too.
			return rs, true, nil, s.withdrawOpen(rr, accepts)
		case cc.Status.Reclaim == nil || cc.Status.Phase == marketv1alpha1.ContractReleasing:
			return rs, true, nil, nil
		}
		// Its bidder reclaims it: the next VM is bought while it runs.
		reclaimed = cc
	}
	if !wanted {
		// Nothing is leased: withdraw what is open.
		err := s.withdraw(rr, accepts)
		return rs, err != nil, nil, err
	}
	return rs, true, rr.buying(reclaimed), nil
}

// acceptsOf returns the requester's accept records of the replica's
// requests, by request URI.
func (s *session) acceptsOf(rr *replicaRecords) map[string][]*ownAccept {
	out := map[string][]*ownAccept{}
	for _, rec := range s.inv.List(lexicon.Accept) {
		var acc market.Accept
		if market.Decode(lexicon.Accept, rec.Value, &acc) != nil {
			continue
		}
		for _, req := range rr.attempts {
			if acc.Request.URI == req.uri {
				_, _, rkey := market.SplitURI(rec.URI)
				out[req.uri] = append(out[req.uri], &ownAccept{uri: rec.URI, cid: rec.CID, rkey: rkey, accept: &acc})
			}
		}
	}
	return out
}

type ownAccept struct {
	uri, cid, rkey string
	accept         *market.Accept
}

// withdraw deletes the replica's open requests and accepts (nothing is
// leased).
func (s *session) withdraw(rr *replicaRecords, accepts map[string][]*ownAccept) error {
	var errs []error
	for _, rec := range rr.attempts {
		errs = append(errs, s.withdrawRequest(rec, accepts[rec.uri]))
	}
	return errors.Join(errs...)
}

// withdrawOpen deletes the replica's requests (and their accepts) that no
// live contract rests on.
func (s *session) withdrawOpen(rr *replicaRecords, accepts map[string][]*ownAccept) error {
	var errs []error
	for _, rec := range rr.attempts {
		if !s.restsOn(rec.uri) {
			errs = append(errs, s.withdrawRequest(rec, accepts[rec.uri]))
		}
	}
	return errors.Join(errs...)
}

// withdrawRequest deletes a request record and its accepts.
func (s *session) withdrawRequest(rec *ownRecord, accepts []*ownAccept) error {
	for _, acc := range accepts {
		if err := s.inv.Delete(s.ctx, lexicon.Accept, acc.rkey); err != nil {
			return err
		}
	}
	return s.inv.Delete(s.ctx, lexicon.Request, rec.rkey)
}

func (s *session) confirm() time.Duration {
	return time.Duration(cmp.Or(s.mr.Spec.ConfirmSeconds, 300)) * time.Second
}

// contractsOf returns the replica's live contracts, oldest first: more
// than one while the next VM of a reclaimed one is bought.
func (s *session) contractsOf(index int32) []*marketv1alpha1.ComputeContract {
	var out []*marketv1alpha1.ComputeContract
	for _, cc := range s.contracts {
		if cc.Spec.ReplicaIndex == index && deal.LiveContract(cc) {
			out = append(out, cc)
		}
	}
	// By when the request each rests on was made (its key says, to the
	// millisecond).
	stamp := func(cc *marketv1alpha1.ComputeContract) int64 {
		_, _, rkey := market.SplitURI(cc.Spec.Request.URI)
		_, at, _ := market.ParseRequestKey(s.owner, rkey)
		return at
	}
	slices.SortFunc(out, func(a, b *marketv1alpha1.ComputeContract) int {
		return cmp.Or(cmp.Compare(stamp(a), stamp(b)), a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	return out
}

func anyActive(ccs []*marketv1alpha1.ComputeContract) bool {
	return slices.ContainsFunc(ccs, func(cc *marketv1alpha1.ComputeContract) bool { return cc.Status.Phase == marketv1alpha1.ContractActive })
}

// restsOn reports whether a live contract rests on the request at uri.
func (s *session) restsOn(uri string) bool {
	for _, cc := range s.contracts {
		if deal.LiveContract(cc) && cc.Spec.Request.URI == uri {
			return true
		}
	}
	return false
}

// contracted follows a replica's contract: from the bidder's lease while
// the replica is wanted, through a release (with relReason) when it no
// longer is (load, deal.DecideContract, then carry the decision out; one
// status write). When the deal is over (Completed or Failed) the
// requester's records of it are deleted and it reports finished.
func (s *session) contracted(rr *replicaRecords, cc *marketv1alpha1.ComputeContract, accepts map[string][]*ownAccept, wanted bool, relReason deal.ReleaseReason, rs *marketv1alpha1.RequestStatus) (bool, error) {
	if _, _, akey := market.SplitURI(cc.Spec.Accept.URI); s.inv.Get(lexicon.Accept, akey) == nil {
		// The requester deleted the accept when the deal ended: a contract
		// that looks live is a cache behind that write; it is not judged
		// again.
		return true, nil
	}
	st := cc.Status.DeepCopy()
	st.ObservedGeneration = cc.Generation
	st.Records.Request, st.Records.Bid, st.Records.Accept = new(cc.Spec.Request), new(cc.Spec.Bid), new(cc.Spec.Accept)
	rs.State, rs.Contract = marketv1alpha1.RequestContracted, cc.Name
	rs.Record = &marketv1alpha1.PublishedRecord{URI: cc.Spec.Request.URI, CID: cc.Spec.Request.CID}
	rs.Accept = &marketv1alpha1.PublishedRecord{URI: cc.Spec.Accept.URI, CID: cc.Spec.Accept.CID}

	d := s.dealOf(rr, cc, st)
	dec := deal.DecideContract(s.contractFacts(cc, st, d, wanted, relReason), s.now)
	if dec.Phase != "" {
		st.Phase, st.Reason = dec.Phase, cmp.Or(dec.Reason, st.Reason)
	}
	if dec.Unmount {
		rs.State = marketv1alpha1.RequestReleasing
	}
	mountReason, mountMsg, err := s.carryOut(rr, cc, st, d, dec)
	if err != nil {
		return false, err
	}
	if st.Phase == marketv1alpha1.ContractActive && !dec.Over {
		s.grantAccess(cc, st, d.lease)
	}
	s.due(dec.Due)
	active := st.Phase == marketv1alpha1.ContractActive && cc.Status.Phase != marketv1alpha1.ContractActive
	if err := s.contractStatus(cc, st, mountReason, mountMsg, dec.Unresponsive != ""); err != nil {
		return false, err
	}
	if active {
		s.r.observeStep(market.StepLeaseActive, cc.CreationTimestamp.Time)
	}
	if !dec.Over {
		rs.Message = fmt.Sprintf("ComputeContract %s is %s", cc.Name, st.Phase)
		if mountMsg != "" && st.Phase != marketv1alpha1.ContractActive {
			rs.Message += ": " + mountMsg
		}
		return false, nil
	}
	if err := s.over(rr, cc, accepts, d.release); err != nil {
		return false, err
	}
	rs.State, rs.Contract, rs.Accept, rs.Record = marketv1alpha1.RequestOpen, "", nil, nil
	rs.Message = fmt.Sprintf("ComputeContract %s ended: %s (%s)", cc.Name, st.Phase, st.Reason)
	return true, nil
}

// contractDeal is what the market says of a contract: the bidder's lease
// (nil when it is not in the view), the requester's release of it (nil:
// none), and whether the lease is gone.
type contractDeal struct {
	lease   *market.Rec
	release *ownRelease
	// gone: the lease was missing from a listing of the bidder's repo
	// that ended after it was found missing.
	gone bool
}

// dealOf reads a contract's lease, release and reclaim into st (its
// records, the reclaim the bidder gave notice of) and returns them.
func (s *session) dealOf(rr *replicaRecords, cc *marketv1alpha1.ComputeContract, st *marketv1alpha1.ComputeContractStatus) contractDeal {
	var d contractDeal
	d.lease = deal.LeaseOf(s.view, cc.Spec.Accept.URI, cc.Spec.Accept.CID, cc.Spec.BidderDID, s.ignored)
	s.view.Refresh(cc.Spec.BidderDID)
	if d.lease != nil {
		st.Records.Lease = &marketv1alpha1.RecordRef{URI: d.lease.URI, CID: d.lease.CID}
	}
	if st.Records.Lease != nil && st.Records.Lease.URI != "" {
		leaseURI := st.Records.Lease.URI
		if d.release = s.releaseOf(leaseURI); d.release != nil {
			st.Records.Release = &marketv1alpha1.RecordRef{URI: d.release.uri, CID: d.release.cid}
		}
		s.noteReclaim(rr, cc, st, leaseURI, d.lease)
	}
	// A lease counts as gone only once a listing of the bidder's repo
	// ended after it was found missing.
	leaseKey := "lease|" + cc.Spec.Accept.URI
	d.gone = d.lease == nil && s.r.absent.Gone(s.view, cc.Spec.BidderDID, leaseKey, s.now)
	if d.lease != nil {
		s.r.absent.Present(leaseKey)
	}
	return d
}

// contractFacts is what deal.DecideContract judges a contract by.
func (s *session) contractFacts(cc *marketv1alpha1.ComputeContract, st *marketv1alpha1.ComputeContractStatus, d contractDeal, wanted bool, relReason deal.ReleaseReason) deal.ContractFacts {
	f := deal.ContractFacts{
		Phase: cc.Status.Phase, Wanted: wanted, ReleaseReason: relReason,
		Lease: d.lease, LeaseGone: d.gone,
		Reclaim: st.Reclaim, Notice: time.Duration(cc.Spec.NoticeSeconds) * time.Second,
		TenantAnswers: s.tenantAnswers(cc),
		Grace:         time.Duration(cmp.Or(s.mr.Spec.UnresponsiveGraceSeconds, 300)) * time.Second,
		Confirm:       s.confirm(),
		Exported:      s.mr.Spec.StateSync.Mode == marketv1alpha1.StateSyncExport && !s.deleting,
	}
	if d.release != nil {
		f.Release = d.release.release
	}
	if c := meta.FindStatusCondition(cc.Status.Conditions, marketv1alpha1.ConditionReady); c != nil && c.Reason == ReasonTenantUnresponsive {
		f.UnresponsiveSince = c.LastTransitionTime.Time
	}
	return f
}

// tenantAnswers reports whether the contract's mounted tenant answers
// (its TenantCluster is Ready), or is not mounted.
func (s *session) tenantAnswers(cc *marketv1alpha1.ComputeContract) bool {
	tc := &computev1alpha1.TenantCluster{}
	return s.c.Get(s.ctx, client.ObjectKey{Name: cc.Name}, tc) != nil || tc.Status.Phase == computev1alpha1.PhaseReady
}

// carryOut carries out what deal.DecideContract decided for a contract,
// into st. It returns the mount's reason and message while the tenant is
// not mounted (or does not answer).
func (s *session) carryOut(rr *replicaRecords, cc *marketv1alpha1.ComputeContract, st *marketv1alpha1.ComputeContractStatus, d contractDeal, dec deal.ContractDecision) (mountReason, mountMsg string, err error) {
	if slices.Contains(dec.Transitions, deal.ContractTenantGivenUp) {
		s.events.Eventf(s.mr, nil, corev1.EventTypeWarning, "ProviderUnresponsive", "Release", "replica %d: the tenant of %s has not answered since %s; released", rr.index, cc.Name, market.Time(dec.Since))
	}
	switch {
	case dec.Unresponsive != "":
		// The mount's token is still renewed: a tenant that answers again
		// within the grace is reached.
		if d.lease != nil && d.lease.Lease != nil && d.lease.Lease.State == deal.LeaseRunning {
			if _, _, _, err := s.deliver(cc, d.lease); err != nil {
				return "", "", err
			}
		}
		return "", dec.Unresponsive, nil
	case dec.Mount:
		ready, reason, why, err := s.deliver(cc, d.lease)
		if err != nil {
			return "", "", err
		}
		if ready {
			st.Phase = marketv1alpha1.ContractActive
		}
		return reason, why, nil
	case dec.Unmount:
		if err := s.undeliver(cc); err != nil {
			return "", "", err
		}
	}
	if dec.Publish {
		return "", "", s.publishRelease(rr, cc, st, d.lease, dec)
	}
	return "", "", nil
}

// publishRelease publishes the requester's release of lease; when an
// export is wanted the tenant is exported first (the bidder stops the VM
// once it sees the release), and the release waits until the snapshot is
// kept or the export failed.
func (s *session) publishRelease(rr *replicaRecords, cc *marketv1alpha1.ComputeContract, st *marketv1alpha1.ComputeContractStatus, lease *market.Rec, dec deal.ContractDecision) error {
	if dec.Export {
		ready, err := s.export(cc, lease)
		if err != nil || !ready {
			// Not released yet: the contract keeps its reason.
			st.Reason = cc.Status.Reason
			return err
		}
	}
	rel := &market.Release{Type: lexicon.Release, Lease: lease.Ref(), Reason: dec.ReleaseReason, CreatedAt: market.Time(s.now)}
	rec, err := s.inv.Put(s.ctx, lexicon.Release, market.ReleaseKey(s.owner, lease.URI), rel)
	if err != nil {
		return err
	}
	st.Records.Release = &marketv1alpha1.RecordRef{URI: rec.URI, CID: rec.CID}
	s.events.Eventf(s.mr, nil, corev1.EventTypeNormal, "Released", "Release", "replica %d: released %s (%s)", rr.index, cc.Name, dec.ReleaseReason)
	return nil
}

// over deletes what is left of a deal that ended: the mount, and the
// requester's records of it (its release, its request, its accept).
func (s *session) over(rr *replicaRecords, cc *marketv1alpha1.ComputeContract, accepts map[string][]*ownAccept, release *ownRelease) error {
	s.r.access.Delete(cc.UID)
	s.r.mints.Delete(cc.UID)
	s.r.minted.Delete(cc.UID)
	s.r.exports.Delete(cc.UID)
	s.r.restores.Delete(cc.UID)
	errs := []error{s.undeliver(cc)}
	if release != nil {
		errs = append(errs, s.inv.Delete(s.ctx, lexicon.Release, release.rkey))
	}
	for _, req := range rr.attempts {
		if req.uri == cc.Spec.Request.URI {
			errs = append(errs, s.withdrawRequest(req, accepts[req.uri]))
		}
	}
	_, _, acceptKey := market.SplitURI(cc.Spec.Accept.URI)
	errs = append(errs, s.inv.Delete(s.ctx, lexicon.Accept, acceptKey))
	return errors.Join(errs...)
}

// noteReclaim reads the bidder's reclaim of the lease at leaseURI (read
// as lease, nil when it is not in the view) into st: only one in the
// bidder's repo counts. When the requester's side
// first sees it is kept (the notice owed is counted from then, by its own
// clock, also after a restart); a reclaim whose terminateAfter gives less
// than the contract's notice from then is ShortNotice.
func (s *session) noteReclaim(rr *replicaRecords, cc *marketv1alpha1.ComputeContract, st *marketv1alpha1.ComputeContractStatus, leaseURI string, lease *market.Rec) {
	var rec *market.Rec
	for _, r := range s.view.Children(leaseURI, lexicon.Reclaim) {
		if r.DID != cc.Spec.BidderDID || r.Reclaim == nil || market.ParseTime(r.Reclaim.TerminateAfter).IsZero() {
			s.ignored[r.URI+"|"+r.CID] = true
			continue
		}
		rec = r
	}
	if rec == nil {
		return
	}
	by := market.ParseTime(rec.Reclaim.TerminateAfter)
	// Seen is when the reclaim was first read, but never before the lease
	// it names was (a reclaim may be on the firehose before its lease);
	// kept from then on.
	first := st.Reclaim == nil
	seen := s.now
	switch {
	case !first:
		seen = st.Reclaim.Seen.Time
	case lease != nil:
		seen = rec.FirstSeen
		if lease.FirstSeen.After(seen) {
			seen = lease.FirstSeen
		}
		if seen.IsZero() {
			seen = s.now
		}
	}
	notice := time.Duration(cc.Spec.NoticeSeconds) * time.Second
	short := by.Before(seen.Add(notice - deal.NoticeSlack))
	st.Records.Reclaim = &marketv1alpha1.RecordRef{URI: rec.URI, CID: rec.CID}
	// Kept to the second, as status holds it (else every pass rewrites it).
	st.Reclaim = &marketv1alpha1.ContractReclaim{Reason: string(rec.Reclaim.Reason), TerminateAfter: *market.MetaTime(by), Seen: *market.MetaTime(seen), ShortNotice: short}
	if len(st.Reclaim.Reason) > 64 {
		st.Reclaim.Reason = st.Reclaim.Reason[:64]
	}
	if first {
		kind, why := corev1.EventTypeNormal, "buying the next VM meanwhile"
		if short {
			kind, why = corev1.EventTypeWarning, fmt.Sprintf("less than the %s of notice the request asked for", notice)
		}
		s.events.Eventf(s.mr, nil, kind, "Reclaimed", "Reclaim", "replica %d: bidder %s reclaims %s (%s) and stops it after %s: %s",
			rr.index, cc.Spec.BidderDID, cc.Name, knownReclaim(rec.Reclaim.Reason), market.Time(by), why)
	}
}

// knownReclaim is a reclaim's reason when it is one of the lexicon's known
// values (a bidder's free text is not repeated).
func knownReclaim(reason deal.ReclaimReason) string {
	if slices.Contains(deal.ReclaimReasons(), reason) {
		return string(reason)
	}
	return "other"
}

type ownRelease struct {
	uri, cid, rkey string
	release        *market.Release
}

// releaseOf returns the requester's release of a lease, if it made one.
func (s *session) releaseOf(leaseURI string) *ownRelease {
	rkey := market.ReleaseKey(s.owner, leaseURI)
	rec := s.inv.Get(lexicon.Release, rkey)
	if rec == nil {
		return nil
	}
	var rel market.Release
	if market.Decode(lexicon.Release, rec.Value, &rel) != nil {
		return nil
	}
	return &ownRelease{uri: rec.URI, cid: rec.CID, rkey: rkey, release: &rel}
}

// contractStatus writes a contract's status when it changed, with an
// Event when its phase did.
func (s *session) contractStatus(cc *marketv1alpha1.ComputeContract, st *marketv1alpha1.ComputeContractStatus, mountReason, mount string, unresponsive bool) error {
	status, reason, msg := metav1.ConditionTrue, string(st.Phase), "the contract is "+string(st.Phase)
	switch st.Phase {
	case marketv1alpha1.ContractFailed:
		status, msg = metav1.ConditionFalse, "the contract failed: "+st.Reason
	case marketv1alpha1.ContractCompleted:
		status, msg = metav1.ConditionFalse, "the contract is over: "+st.Reason
	case marketv1alpha1.ContractProvisioning, marketv1alpha1.ContractPending:
		status, msg = metav1.ConditionFalse, "the bidder confirmed; the VM is not running yet"
		if mount != "" {
			msg = mount
		}
		reason = cmp.Or(mountReason, reason)
	case marketv1alpha1.ContractActive:
		msg, reason = cmp.Or(mount, msg), cmp.Or(mountReason, reason)
		switch {
		case unresponsive:
			status, reason = metav1.ConditionFalse, ReasonTenantUnresponsive
		case st.Reclaim != nil:
			reason = ReasonReclaimed
			msg = "the bidder reclaims the VM and stops it after " + market.Time(st.Reclaim.TerminateAfter.Time) + "; the next one is bought meanwhile"
		}
	case marketv1alpha1.ContractReleasing:
		status, msg = metav1.ConditionFalse, "released ("+st.Reason+"); waiting for the bidder to end the lease"
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: marketv1alpha1.ConditionReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: cc.Generation})
	err := ssa.WriteStatus(s.ctx, s.c, cc, &cc.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    ssa.PhaseMoved(cc.Status.Phase, st.Phase, marketv1alpha1.ContractFailed, "", msg),
		Recorder: s.events,
		Action:   "Reconcile",
	})
	if err == nil {
		cc.Status = *st
	}
	return err
}

// prune deletes what the requester no longer needs: Bids of requests it
// no longer holds beyond the newest keepSettledBids (unless a kept
// contract rests on them), and finished contracts beyond the newest
// keepFinished.
func (s *session) prune() error {
	current := map[string]bool{}
	for _, rec := range s.inv.List(lexicon.Request) {
		current[rec.URI] = true
	}
	var finished []*marketv1alpha1.ComputeContract
	kept := map[string]bool{}
	for _, cc := range s.contracts {
		if !deal.LiveContract(cc) {
			finished = append(finished, cc)
			continue
		}
		kept[cc.Spec.Bid.URI+"|"+cc.Spec.Bid.CID] = true
	}
	slices.SortFunc(finished, func(a, b *marketv1alpha1.ComputeContract) int {
		return b.CreationTimestamp.Compare(a.CreationTimestamp.Time)
	})
	var errs []error
	for i, cc := range finished {
		if i < keepFinished {
			kept[cc.Spec.Bid.URI+"|"+cc.Spec.Bid.CID] = true
			continue
		}
		errs = append(errs, deleteObject(s, cc))
		delete(s.contracts, cc.Name)
	}
	// Bids of requests the requester no longer holds are history: the
	// newest keepSettledBids stay.
	var settled []*marketv1alpha1.Bid
	for _, b := range s.bids {
		if !current[b.Spec.Request.URI] && !kept[b.Spec.Bid.URI+"|"+b.Spec.Bid.CID] {
			settled = append(settled, b)
		}
	}
	slices.SortFunc(settled, func(a, b *marketv1alpha1.Bid) int {
		return cmp.Or(b.CreationTimestamp.Compare(a.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	for i, b := range settled {
		if i < keepSettledBids {
			continue
		}
		errs = append(errs, deleteObject(s, b))
		delete(s.bids, b.Name)
	}
	return errors.Join(errs...)
}

func deleteObject(s *session, o client.Object) error {
	uid := o.GetUID()
	err := s.c.Delete(s.ctx, o, client.Preconditions{UID: &uid})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}
