package marketrequester

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/market"
)

// The objects a contract's tenant is mounted with, in the requester's
// workspace: a Secret with the tenant's CA and the mount's credential
// (owned by the requester's contract), and the TenantCluster
// (cluster-scoped, named like the contract; a cluster-scoped object
// cannot be owned by a namespaced one, so the contract's end deletes it).
func tenantCredential(cc string) string { return cc + "-tenant" }

// LabelContract is the label of the TenantCluster a contract mounts its
// tenant with: the contract's UID. A TenantCluster of the contract's name
// without it (one a user made first) is never taken as the contract's
// mount: the contract waits with ReasonMountNameTaken.
const LabelContract = "market.knotless.dev/contract-uid"

// ReasonMountNameTaken: a TenantCluster of the contract's name exists and
// was not made for the contract (the Ready condition's reason while the
// contract waits).
const ReasonMountNameTaken = "MountNameTaken"

// ownsMount reports whether tc is the mount deliver made for cc.
func ownsMount(cc *marketv1alpha1.ComputeContract, tc *computev1alpha1.TenantCluster) bool {
	return cc.UID != "" && tc.Labels[LabelContract] == string(cc.UID)
}

// ReasonBidderAmbiguous: more than one workspace passes as the bidder of
// the contract (the Ready condition's reason while the contract waits):
// an impostor is present, so the tenant is delivered to none of them.
const ReasonBidderAmbiguous = "BidderAmbiguous"

// ReasonCABundleNotPinned: the VM's CA bundle is not the one the
// bidder's lease record pins (market.CAFingerprint over the whole
// bundle), or is not a bundle of certificates: the tenant is not mounted.
const ReasonCABundleNotPinned = "CABundleNotPinned"

// errBidderAmbiguous: bidderVM found more than one workspace claiming the
// contract's bidder.
var errBidderAmbiguous = errors.New(ReasonBidderAmbiguous)

// bidderVM finds the VM of the requester's contract in the bidder's
// workspace, through the index of bidders by DID: the bidder's contract
// must rest on the same accept and name this requester, the bid the
// requester accepted must be the MarketBidder's own (its record key
// carries the MarketBidder's UID: another workspace whose PDS claims the
// bidder's DID cannot make one), and the VM must be its own. It returns
// the bidder workspace's client and the VM, or nil; nil too when more
// than one workspace passes as the bidder (errBidderAmbiguous).
func (s *session) bidderVM(cc *marketv1alpha1.ComputeContract) (client.Client, *computev1alpha1.ComputeVM) {
	c, vm, _ := s.findBidderVM(cc)
	return c, vm
}

// findBidderVM is bidderVM, which says when more than one workspace
// passes as the bidder (errBidderAmbiguous).
func (s *session) findBidderVM(cc *marketv1alpha1.ComputeContract) (client.Client, *computev1alpha1.ComputeVM, error) {
	_, _, bidKey := market.SplitURI(cc.Spec.Bid.URI)
	var found client.Client
	var foundVM *computev1alpha1.ComputeVM
	claims := 0
	for _, req := range s.r.Market.Followers(market.RoleBidder, cc.Spec.BidderDID) {
		cl, err := s.r.GetCluster(s.ctx, req.ClusterName)
		if err != nil {
			continue
		}
		c := cl.GetClient()
		mb := &marketv1alpha1.MarketBidder{}
		if err := c.Get(s.ctx, req.NamespacedName, mb); err != nil || mb.Status.DID != cc.Spec.BidderDID || !market.Owns(market.Owner(string(mb.UID)), bidKey) {
			continue
		}
		bcc := &marketv1alpha1.ComputeContract{}
		if err := c.Get(s.ctx, client.ObjectKey{Namespace: mb.Namespace, Name: market.ChildName(mb.Name, cc.Spec.Accept.URI)}, bcc); err != nil ||
			!metav1.IsControlledBy(bcc, mb) || bcc.Spec.Accept != cc.Spec.Accept || bcc.Spec.RequesterDID != s.st.DID {
			continue
		}
		if claims++; claims > 1 {
			return nil, nil, errBidderAmbiguous
		}
		vm := &computev1alpha1.ComputeVM{}
		if err := c.Get(s.ctx, client.ObjectKey{Namespace: mb.Namespace, Name: bcc.Name}, vm); err != nil || !metav1.IsControlledBy(vm, bcc) {
			continue
		}
		found, foundVM = c, vm
	}
	return found, foundVM, nil
}

// runningVM is the bidder's VM of the contract once it runs, with the
// bidder workspace's client and the mount's token.
func (s *session) runningVM(cc *marketv1alpha1.ComputeContract) (client.Client, *computev1alpha1.ComputeVM, string, error) {
	c, vm, err := s.findBidderVM(cc)
	if err != nil {
		return nil, nil, "", err
	}
	if vm == nil || vm.Status.Phase != computev1alpha1.VMRunning || vm.Status.CredentialSecret == "" {
		return nil, nil, "", nil
	}
	sec := &corev1.Secret{}
	if err := c.Get(s.ctx, client.ObjectKey{Namespace: vm.Namespace, Name: vm.Status.CredentialSecret}, sec); err != nil {
		return nil, nil, "", client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(sec, vm) || len(sec.Data["token"]) == 0 {
		return nil, nil, "", nil
	}
	return c, vm, string(sec.Data["token"]), nil
}

// deliver mounts the tenant of a contract whose lease says the VM runs:
// it copies the VM's endpoint, CA and the mount's credential from the
// bidder's workspace (never through a record) once the CA matches the
// fingerprint the bidder's lease record carries, and makes the
// TenantCluster. It reports whether the mount is Ready, and what it waits
// for: a reason for the contract's Ready condition when it is not the
// phase's own (ReasonMountNameTaken), and a message.
func (s *session) deliver(cc *marketv1alpha1.ComputeContract, lease *market.Rec) (bool, string, string, error) {
	// Once mounted, the mount's own probe says whether the tenant answers
	// (liveness is judged off the record and off the bidder's view).
	tc := &computev1alpha1.TenantCluster{}
	if err := s.c.Get(s.ctx, client.ObjectKey{Name: cc.Name}, tc); err == nil {
		if !ownsMount(cc, tc) {
			return false, ReasonMountNameTaken, s.mountNameTaken(cc), nil
		}
		if tc.Spec.Credential.SecretRef.Name == tenantCredential(cc.Name) {
			ready, why := mountState(tc)
			return ready, "", why, nil
		}
	} else if !apierrors.IsNotFound(err) {
		return false, "", "", err
	}
	bc, vm, token, err := s.runningVM(cc)
	switch {
	case errors.Is(err, errBidderAmbiguous):
		return false, ReasonBidderAmbiguous, s.refuse(cc, ReasonBidderAmbiguous, "more than one workspace claims to be the contract's bidder "+cc.Spec.BidderDID+": the tenant is delivered to none of them"), nil
	case err != nil:
		return false, "", "", err
	case vm == nil:
		return false, "", "the bidder's VM is not running yet", nil
	}
	// The pin covers the whole bundle: every certificate of it is copied
	// into the mount's ca.crt and trusted there.
	if fp, err := market.CAFingerprint([]byte(vm.Status.CABundle)); err != nil || fp != lease.Lease.CAFingerprint {
		return false, ReasonCABundleNotPinned, s.refuse(cc, ReasonCABundleNotPinned, "the VM's CA bundle is not the one the bidder's lease record pins: the tenant is not mounted"), nil
	}
	// A snapshot to restore goes into the tenant before it is mounted.
	if from := s.mr.Spec.RestoreFrom; from != "" {
		if done, why, err := s.restore(cc, bc, vm, from); !done || err != nil {
			return false, "", why, err
		}
	}
	ready, why, err := s.mount(cc, vm, token)
	return ready, "", why, err
}

// mount writes the contract's TenantCluster (first, so that the
// credential never exists beside a TenantCluster of another URL) and the
// Secret it reads, labelled for it alone and bound to the VM's endpoint
// (computev1alpha1.MountCredentialURLKey) and CA
// (computev1alpha1.MountCredentialCAKey): whoever changes the
// TenantCluster's URL or CA afterwards does not get the token sent there.
func (s *session) mount(cc *marketv1alpha1.ComputeContract, vm *computev1alpha1.ComputeVM, token string) (bool, string, error) {
	ns := cc.Namespace
	name := tenantCredential(cc.Name)
	tc := &computev1alpha1.TenantCluster{ObjectMeta: metav1.ObjectMeta{Name: cc.Name}}
	if _, err := controllerutil.CreateOrUpdate(s.ctx, s.c, tc, func() error {
		if tc.ResourceVersion != "" && !ownsMount(cc, tc) {
			return errMountNameTaken
		}
		metav1.SetMetaDataLabel(&tc.ObjectMeta, LabelContract, string(cc.UID))
		tc.Spec.URL = vm.Status.Endpoint
		tc.Spec.CABundle = computev1alpha1.KeyRef{Kind: "Secret", Namespace: ns, Name: name, Key: computev1alpha1.MountCredentialCAKey}
		tc.Spec.Credential = computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: ns, Name: name}}
		return nil
	}); errors.Is(err, errMountNameTaken) {
		return false, s.mountNameTaken(cc), nil
	} else if err != nil {
		return false, "", fmt.Errorf("the TenantCluster: %w", err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if _, err := controllerutil.CreateOrUpdate(s.ctx, s.c, sec, func() error {
		metav1.SetMetaDataLabel(&sec.ObjectMeta, computev1alpha1.LabelMountCredential, tc.Name)
		sec.Type = corev1.SecretTypeOpaque
		sec.Data = map[string][]byte{"token": []byte(token), computev1alpha1.MountCredentialCAKey: []byte(vm.Status.CABundle), computev1alpha1.MountCredentialURLKey: []byte(vm.Status.Endpoint)}
		return controllerutil.SetControllerReference(cc, sec, s.c.Scheme())
	}); err != nil {
		return false, "", fmt.Errorf("the tenant's Secret: %w", err)
	}
	ready, why := mountState(tc)
	return ready, why, nil
}

// errMountNameTaken: the TenantCluster of the contract's name is not the
// contract's (found while writing it).
var errMountNameTaken = errors.New(ReasonMountNameTaken)

// mountState says whether the contract's TenantCluster is Ready.
func mountState(tc *computev1alpha1.TenantCluster) (bool, string) {
	if tc.Status.Phase != computev1alpha1.PhaseReady {
		return false, "the tenant is being mounted as TenantCluster " + tc.Name
	}
	return true, "the tenant is mounted as workspace " + tc.Name
}

// mountNameTaken is the message of a contract whose TenantCluster name is
// taken.
func (s *session) mountNameTaken(cc *marketv1alpha1.ComputeContract) string {
	return s.refuse(cc, ReasonMountNameTaken, fmt.Sprintf("TenantCluster %s exists and was not made for this contract (no label %s=%s): the tenant is not mounted until it is deleted", cc.Name, LabelContract, cc.UID))
}

// refuse returns msg, the message of a contract that waits with reason;
// the Warning Event saying so is emitted once, when the contract starts
// waiting for it. Its messages name no other workspace and nothing of
// the VM's (R17).
func (s *session) refuse(cc *marketv1alpha1.ComputeContract, reason, msg string) string {
	if c := meta.FindStatusCondition(cc.Status.Conditions, marketv1alpha1.ConditionReady); c == nil || c.Reason != reason {
		s.events.Eventf(cc, nil, corev1.EventTypeWarning, reason, "Mount", "%s", msg)
	}
	return msg
}

// undeliver removes the mount of a contract: the TenantCluster (when it is
// the one deliver made: labelled with the contract's UID) and the copied CA and credential.
func (s *session) undeliver(cc *marketv1alpha1.ComputeContract) error {
	tc := &computev1alpha1.TenantCluster{}
	if err := s.c.Get(s.ctx, client.ObjectKey{Name: cc.Name}, tc); err == nil {
		if ownsMount(cc, tc) {
			if err := s.c.Delete(s.ctx, tc); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: tenantCredential(cc.Name), Namespace: cc.Namespace}}
	if err := s.c.Delete(s.ctx, sec); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}
