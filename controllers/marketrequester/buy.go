package marketrequester

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/market/dealexec"
	"github.com/knotless-dev/knotless/internal/ssa"
)

// retryWait is deal.RetryWait.
func retryWait(window, attempt int32) time.Duration { return deal.RetryWait(window, attempt) }

// buying is the replica's buying round as deal.DecideRequester reads it;
// reclaimed is its live contract that its bidder reclaims (nil: none).
func (rr *replicaRecords) buying(reclaimed *marketv1alpha1.ComputeContract) *deal.Replica {
	r := &deal.Replica{Index: rr.index, Attempt: rr.attempt, Attempts: map[int64]*deal.OwnRequest{}, Stamp: rr.stamp, Reclaimed: reclaimed}
	for stamp, rec := range rr.attempts {
		r.Attempts[stamp] = &deal.OwnRequest{URI: rec.uri, CID: rec.cid, RKey: rec.rkey, Request: rec.request}
	}
	if rr.current != nil {
		r.Current = r.Attempts[rr.stamp]
	}
	return r
}

// buy runs the buying rounds of the replicas that need a VM: load (the
// snapshot), decide (deal.DecideRequester), execute the plan: the record
// writes at once (one repo: they share applyWrites commits), then the
// Bids (one status write each, when it changed) and the contracts of
// those that succeeded. A contract made is followed at once. It returns
// the replicas' statuses by index.
func (s *session) buy(buying []*deal.Replica, replicas map[int32]*replicaRecords) (map[int32]marketv1alpha1.RequestStatus, error) {
	snap := &deal.RequesterSnapshot{Name: s.mr.Name, DID: s.st.DID, Owner: s.owner, Network: s.network, Operator: s.net.Spec.OperatorDID,
		Spec: s.mr.Spec, Identity: s.id, Accepts: s.inv.List(lexicon.Accept), View: s.view, Missing: &s.r.absent,
		Bids: s.bids, Contracts: s.contracts, Replicas: buying}
	p := deal.DecideRequester(snap, s.now)
	dealexec.Look(p.Look, &s.r.absent, s.view, s.now)
	for k := range p.Ignored {
		s.ignored[k] = true
	}
	s.due(p.Requeue)
	var errs []error
	w := dealexec.Records(s.ctx, s.inv, p.Records, s.r.observeStep, func(_ deal.RecordOp, err error) { errs = append(errs, err) })
	made, err := s.writeObjects(p, w)
	errs = append(errs, err)
	for _, ev := range p.Events {
		if w.Ready(ev.Needs) && (ev.Contract == "" || made[ev.Contract] != nil) {
			s.events.Eventf(s.mr, nil, ev.Type, ev.Reason, ev.Action, "%s", ev.Note)
		}
	}
	out := map[int32]marketv1alpha1.RequestStatus{}
	for _, op := range p.Requests {
		rs := op.Status
		if !w.Ready(op.Needs) {
			rs = op.Before
		}
		w.WithPublishedCID(rs.Record)
		w.WithPublishedCID(rs.Accept)
		if cc := made[op.Contract]; cc != nil {
			// From here on the replica's status is its contract's, as the
			// next pass (replica) will say it: the round's counts go, so
			// that the next pass has nothing to write.
			rs = marketv1alpha1.RequestStatus{Index: rs.Index, Attempt: rs.Attempt, State: marketv1alpha1.RequestOpen}
			rr := replicas[rs.Index]
			if _, err := s.contracted(rr, cc, s.acceptsOf(rr), true, s.release, &rs); err != nil {
				errs = append(errs, fmt.Errorf("replica %d: %w", rs.Index, err))
			}
		}
		out[rs.Index] = rs
	}
	return out, errors.Join(errs...)
}

// writeObjects makes the plan's Bids and contracts whose record writes
// succeeded, at most kcpWriters at once, and returns the contracts made.
func (s *session) writeObjects(p *deal.Plan, w *dealexec.Written) (map[string]*marketv1alpha1.ComputeContract, error) {
	var mu sync.Mutex
	var errs []error
	made := map[string]*marketv1alpha1.ComputeContract{}
	bids := map[string]*marketv1alpha1.Bid{}
	var g errgroup.Group
	g.SetLimit(kcpWriters)
	for _, name := range slices.Sorted(maps.Keys(p.Bids)) {
		op, existing := p.Bids[name], s.bids[name]
		if !w.Ready(op.Needs) {
			continue
		}
		g.Go(func() error {
			b, err := dealexec.Bid(s.ctx, s.c, s.mr, existing, op, w, FieldManager)
			mu.Lock()
			defer mu.Unlock()
			errs = append(errs, err)
			if b != nil {
				bids[name] = b
			}
			return nil
		})
	}
	for _, name := range slices.Sorted(maps.Keys(p.Contracts)) {
		op := p.Contracts[name]
		if op.Create == nil || !w.Ready(op.Needs) {
			continue
		}
		g.Go(func() error {
			cc := &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Name: op.Name, Namespace: s.mr.Namespace}, Spec: *op.Create}
			err := ssa.Child(s.ctx, s.c, cc, s.mr, FieldManager)
			mu.Lock()
			defer mu.Unlock()
			errs = append(errs, err)
			if err == nil {
				made[op.Name] = cc
			}
			return nil
		})
	}
	_ = g.Wait() // errors are in errs
	for name, b := range bids {
		s.bids[name] = b
	}
	for name, cc := range made {
		s.contracts[name] = cc
	}
	return made, errors.Join(errs...)
}
