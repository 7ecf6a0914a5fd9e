package deal

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/market"
)

type contractCase struct {
	name  string
	facts ContractFacts
	want  []TransitionID
	check func(t *testing.T, d ContractDecision)
}

// leaseIn is a lease record in state (with reason) first seen at seen.
func leaseIn(state LeaseState, reason LeaseReason, seen time.Time) *market.Rec {
	return &market.Rec{URI: "at://did:plc:bidder/dev.knotless.market.lease/l1", CID: "bafylease", FirstSeen: seen,
		Lease: &market.Lease{State: state, Reason: reason}}
}

// wantedFacts is a wanted contract in phase on lease, its tenant
// answering, with the defaults a MarketRequester gives.
func wantedFacts(phase marketv1alpha1.ContractPhase, lease *market.Rec) ContractFacts {
	return ContractFacts{Phase: phase, Wanted: true, Lease: lease, TenantAnswers: true,
		Grace: 5 * time.Minute, Confirm: 5 * time.Minute, Notice: 10 * time.Minute}
}

// releasedFacts is a contract the replica no longer wants (replicas
// lowered), in phase on lease, released at released (zero: not yet).
func releasedFacts(phase marketv1alpha1.ContractPhase, lease *market.Rec, released time.Time) ContractFacts {
	f := wantedFacts(phase, lease)
	f.Wanted, f.ReleaseReason = false, ReplicasLowered
	if !released.IsZero() {
		f.Release = &market.Release{Reason: ReplicasLowered, CreatedAt: market.Time(released)}
	}
	return f
}

// is checks a decision's phase and reason.
func is(phase marketv1alpha1.ContractPhase, reason string) func(*testing.T, ContractDecision) {
	return func(t *testing.T, d ContractDecision) {
		t.Helper()
		if d.Phase != phase || d.Reason != reason {
			t.Errorf("phase %q reason %q, want %q %q", d.Phase, d.Reason, phase, reason)
		}
	}
}

func followCases() []contractCase {
	return []contractCase{
		{name: "new, the lease not read yet: Provisioning", facts: wantedFacts("", nil),
			want: []TransitionID{ContractWaitLease}, check: is(marketv1alpha1.ContractProvisioning, "")},
		{name: "Active, the lease not in the view: keeps its phase", facts: wantedFacts(marketv1alpha1.ContractActive, nil),
			want: []TransitionID{ContractWaitLease}, check: is(marketv1alpha1.ContractActive, "")},
		{name: "a lease state this side does not know: keeps its phase", facts: wantedFacts(marketv1alpha1.ContractProvisioning, leaseIn("paused", "", t0)),
			want: []TransitionID{ContractWaitLease}, check: is(marketv1alpha1.ContractProvisioning, "")},
		{name: "confirmed: Provisioning", facts: wantedFacts("", leaseIn(LeaseConfirmed, "", t0)),
			want: []TransitionID{ContractProvisioning}, check: func(t *testing.T, d ContractDecision) {
				is(marketv1alpha1.ContractProvisioning, "")(t, d)
				if d.Due != t0.Add(30*time.Second) {
					t.Errorf("due %s, want in 30 s", d.Due)
				}
			}},
		{name: "running: mount", facts: wantedFacts(marketv1alpha1.ContractProvisioning, leaseIn(LeaseRunning, "", t0)),
			want: []TransitionID{ContractMount}, check: func(t *testing.T, d ContractDecision) {
				if !d.Mount || d.Unmount || d.Phase != marketv1alpha1.ContractProvisioning || !d.Due.IsZero() {
					t.Errorf("%+v: want the tenant mounted, Provisioning until it is, no time to look again (the mount says)", d)
				}
			}},
		{name: "Active, running, the tenant answers: mounted, no time to look again", facts: wantedFacts(marketv1alpha1.ContractActive, leaseIn(LeaseRunning, "", t0)),
			want: []TransitionID{ContractMount}, check: func(t *testing.T, d ContractDecision) {
				if !d.Mount || !d.Due.IsZero() {
					t.Errorf("%+v: want the mount kept and no look again (a healthy contract waits for events and the resync)", d)
				}
			}},
		{name: "a Provisioning contract whose tenant does not answer yet: mounted, not given up", facts: func() ContractFacts {
			f := wantedFacts(marketv1alpha1.ContractProvisioning, leaseIn(LeaseRunning, "", t0))
			f.TenantAnswers = false
			return f
		}(), want: []TransitionID{ContractMount}},
		{name: "the tenant stops answering: Active, released at the end of the grace", facts: func() ContractFacts {
			f := wantedFacts(marketv1alpha1.ContractActive, leaseIn(LeaseRunning, "", t0))
			f.TenantAnswers = false
			return f
		}(), want: []TransitionID{ContractTenantUnresponsive}, check: func(t *testing.T, d ContractDecision) {
			if d.Phase != marketv1alpha1.ContractActive || d.Unresponsive == "" || d.Since != t0 || d.Due != t0.Add(5*time.Minute) || d.Mount || d.Unmount {
				t.Errorf("%+v: want Active, a message, since now, due at the end of the grace", d)
			}
		}},
		{name: "the tenant silent for the grace: given up, released without an export", facts: func() ContractFacts {
			f := wantedFacts(marketv1alpha1.ContractActive, leaseIn(LeaseRunning, "", t0.Add(-time.Hour)))
			f.TenantAnswers, f.UnresponsiveSince, f.Exported = false, t0.Add(-5*time.Minute), true
			return f
		}(), want: []TransitionID{ContractTenantGivenUp, ContractRelease}, check: func(t *testing.T, d ContractDecision) {
			if !d.Unmount || !d.Publish || d.Export || d.ReleaseReason != ProviderUnresponsive || d.Since != t0.Add(-5*time.Minute) {
				t.Errorf("%+v: want the mount gone and a provider-unresponsive release, no export", d)
			}
			is(marketv1alpha1.ContractReleasing, string(ProviderUnresponsive))(t, d)
		}},
		{name: "the tenant silent on a released contract: released as it was", facts: func() ContractFacts {
			f := releasedFacts(marketv1alpha1.ContractReleasing, leaseIn(LeaseRunning, "", t0), t0.Add(-time.Minute))
			f.Wanted, f.TenantAnswers, f.Phase = true, false, marketv1alpha1.ContractActive
			return f
		}(), want: []TransitionID{ContractAwaitEnd}},
	}
}

func endCases() []contractCase {
	reclaim := &marketv1alpha1.ContractReclaim{Seen: metav1.NewTime(t0.Add(-5 * time.Minute))}
	withReclaim := func(f ContractFacts) ContractFacts { f.Reclaim = reclaim; return f }
	return []contractCase{
		{name: "the lease declined", facts: wantedFacts("", leaseIn(LeaseDeclined, NoCapacity, t0)),
			want: []TransitionID{ContractEndedByBidder, ContractOver}, check: is(marketv1alpha1.ContractFailed, string(NoCapacity))},
		{name: "the lease declined with no reason", facts: wantedFacts("", leaseIn(LeaseDeclined, "", t0)),
			want: []TransitionID{ContractEndedByBidder, ContractOver}, check: is(marketv1alpha1.ContractFailed, string(DeclinedNoReason))},
		{name: "the VM lost", facts: wantedFacts(marketv1alpha1.ContractActive, leaseIn(LeaseCompleted, VMLost, t0)),
			want: []TransitionID{ContractEndedByBidder, ContractOver}, check: func(t *testing.T, d ContractDecision) {
				is(marketv1alpha1.ContractFailed, string(VMLost))(t, d)
				if !d.Over || d.Mount {
					t.Errorf("%+v: want it over, not mounted", d)
				}
			}},
		{name: "completed with no reason", facts: wantedFacts(marketv1alpha1.ContractActive, leaseIn(LeaseCompleted, "", t0)),
			want: []TransitionID{ContractEndedByBidder, ContractOver}, check: is(marketv1alpha1.ContractFailed, string(EndedByBidder))},
		{name: "the lease gone", facts: func() ContractFacts {
			f := wantedFacts(marketv1alpha1.ContractActive, nil)
			f.LeaseGone = true
			return f
		}(), want: []TransitionID{ContractEndedByBidder, ContractOver}, check: is(marketv1alpha1.ContractFailed, string(LeaseWithdrawn))},
		{name: "reclaimed, ended before the notice owed (a lost VM too): reclaimed-early",
			facts: withReclaim(wantedFacts(marketv1alpha1.ContractActive, leaseIn(LeaseCompleted, VMLost, t0))),
			want:  []TransitionID{ContractEndedByBidder, ContractOver}, check: is(marketv1alpha1.ContractFailed, string(ReclaimedEarly))},
		{name: "reclaimed, its lease gone before the notice owed: reclaimed-early", facts: func() ContractFacts {
			f := withReclaim(wantedFacts(marketv1alpha1.ContractActive, nil))
			f.LeaseGone = true
			return f
		}(), want: []TransitionID{ContractEndedByBidder, ContractOver}, check: is(marketv1alpha1.ContractFailed, string(ReclaimedEarly))},
		{name: "reclaimed, completed as reclaimed within the slack of the notice owed: Completed",
			facts: withReclaim(wantedFacts(marketv1alpha1.ContractActive, leaseIn(LeaseCompleted, Reclaimed, t0.Add(5*time.Minute-NoticeSlack)))),
			want:  []TransitionID{ContractEndedByBidder, ContractOver}, check: is(marketv1alpha1.ContractCompleted, string(Reclaimed))},
		{name: "reclaimed, completed for another reason after the notice: Failed with it",
			facts: withReclaim(wantedFacts(marketv1alpha1.ContractActive, leaseIn(LeaseCompleted, VMLost, t0.Add(6*time.Minute)))),
			want:  []TransitionID{ContractEndedByBidder, ContractOver}, check: is(marketv1alpha1.ContractFailed, string(VMLost))},
		{name: "not wanted, declined meanwhile", facts: releasedFacts(marketv1alpha1.ContractProvisioning, leaseIn(LeaseDeclined, Suspended, t0), time.Time{}),
			want: []TransitionID{ContractEndedByBidder, ContractOver}, check: is(marketv1alpha1.ContractFailed, string(Suspended))},
		{name: "not wanted, completed without a release", facts: releasedFacts(marketv1alpha1.ContractActive, leaseIn(LeaseCompleted, VMLost, t0), time.Time{}),
			want: []TransitionID{ContractEndedByBidder, ContractOver}, check: is(marketv1alpha1.ContractFailed, string(VMLost))},
	}
}

func contractReleaseCases() []contractCase {
	return []contractCase{
		{name: "not wanted, the lease not in the view: Releasing", facts: releasedFacts(marketv1alpha1.ContractActive, nil, time.Time{}),
			want: []TransitionID{ContractReleaseWaitLease}, check: func(t *testing.T, d ContractDecision) {
				if !d.Unmount || d.Publish || d.Phase != marketv1alpha1.ContractReleasing {
					t.Errorf("%+v: want the mount gone, Releasing, nothing published", d)
				}
			}},
		{name: "not wanted: the mount goes, the release published", facts: releasedFacts(marketv1alpha1.ContractActive, leaseIn(LeaseRunning, "", t0), time.Time{}),
			want: []TransitionID{ContractRelease}, check: func(t *testing.T, d ContractDecision) {
				is(marketv1alpha1.ContractReleasing, string(ReplicasLowered))(t, d)
				if !d.Unmount || !d.Publish || d.Export || d.ReleaseReason != ReplicasLowered || d.Due != t0.Add(30*time.Second) {
					t.Errorf("%+v: want the mount gone, a replicas-lowered release, due in 30 s", d)
				}
			}},
		{name: "not wanted, exported: the export first", facts: func() ContractFacts {
			f := releasedFacts(marketv1alpha1.ContractActive, leaseIn(LeaseRunning, "", t0), time.Time{})
			f.Exported = true
			return f
		}(), want: []TransitionID{ContractExport, ContractRelease}, check: func(t *testing.T, d ContractDecision) {
			if !d.Export || !d.Publish {
				t.Errorf("%+v: want the export, then the release", d)
			}
		}},
		{name: "not wanted, exported, the VM never ran: no export", facts: func() ContractFacts {
			f := releasedFacts(marketv1alpha1.ContractProvisioning, leaseIn(LeaseConfirmed, "", t0), time.Time{})
			f.Exported = true
			return f
		}(), want: []TransitionID{ContractRelease}},
		{name: "released: waits for the bidder until confirm", facts: releasedFacts(marketv1alpha1.ContractReleasing, leaseIn(LeaseRunning, "", t0), t0.Add(-time.Minute)),
			want: []TransitionID{ContractAwaitEnd}, check: func(t *testing.T, d ContractDecision) {
				is(marketv1alpha1.ContractReleasing, string(ReplicasLowered))(t, d)
				if d.Publish || d.Export || d.Due != t0.Add(30*time.Second) {
					t.Errorf("%+v: want nothing published or exported again, due in 30 s", d)
				}
			}},
		{name: "released, not ended by then: bidder-unresponsive", facts: releasedFacts(marketv1alpha1.ContractReleasing, leaseIn(LeaseRunning, "", t0), t0.Add(-5*time.Minute)),
			want: []TransitionID{ContractBidderUnresponsive, ContractOver}, check: is(marketv1alpha1.ContractFailed, string(BidderUnresponsive))},
		{name: "released, completed: Completed with the release's reason", facts: releasedFacts(marketv1alpha1.ContractReleasing, leaseIn(LeaseCompleted, "", t0), t0.Add(-time.Minute)),
			want: []TransitionID{ContractReleasedAndComplete, ContractOver}, check: func(t *testing.T, d ContractDecision) {
				is(marketv1alpha1.ContractCompleted, string(ReplicasLowered))(t, d)
				if !d.Over || !d.Unmount {
					t.Errorf("%+v: want it over, the mount gone", d)
				}
			}},
		{name: "released, the lease gone: Completed", facts: func() ContractFacts {
			f := releasedFacts(marketv1alpha1.ContractReleasing, nil, t0.Add(-time.Minute))
			f.LeaseGone = true
			return f
		}(), want: []TransitionID{ContractReleasedAndComplete, ContractOver}, check: is(marketv1alpha1.ContractCompleted, string(ReplicasLowered))},
	}
}

func contractCases() []contractCase {
	return slices.Concat(followCases(), endCases(), contractReleaseCases())
}

// TestDecideContract: each of the requester's transitions of a contract,
// and the reasons it gives.
func TestDecideContract(t *testing.T) {
	for _, tc := range contractCases() {
		t.Run(tc.name, func(t *testing.T) {
			d := DecideContract(tc.facts, t0)
			if !slices.Equal(d.Transitions, tc.want) {
				t.Fatalf("transitions %v, want %v", d.Transitions, tc.want)
			}
			if tc.check != nil {
				tc.check(t, d)
			}
		})
	}
}

// TestEveryContractTransitionIsTested: every row of the contract's table
// is taken by a case of TestDecideContract.
func TestEveryContractTransitionIsTested(t *testing.T) {
	var wants [][]TransitionID
	for _, tc := range contractCases() {
		wants = append(wants, tc.want)
	}
	everyRowTaken(t, ContractTransitions(), wants, "TestDecideContract")
}
