package marketrequester

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/mount"
	"github.com/knotless-dev/knotless/internal/serviceauth"
	"github.com/knotless-dev/knotless/internal/tenant"
	"github.com/knotless-dev/knotless/internal/tenantreach"
)

// The objects a contract's tenant is mounted with, in the requester's
// workspace: a Secret with the tenant's URL and CA bundle (owned by the
// requester's contract; no credential), and the TenantCluster
// (cluster-scoped, named like the contract; a cluster-scoped object
// cannot be owned by a namespaced one, so the contract's end deletes it)
// whose credential is the market's. The mount's token is kept in the
// provider's own workspace (tenant.MarketCredential), which no user of
// the requester's workspace can read.
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

// ReasonCABundleNotPinned: the CA bundle of the bidder's lease record is
// not the one the record pins (market.CAFingerprint over the whole
// bundle): the tenant is not mounted.
const ReasonCABundleNotPinned = "CABundleNotPinned"

// The mount's token is a service-auth token the requester's PDS issues
// for the tenant's service identity: it lives mountTokenLife (within the
// agent's serviceauth.MaxLifetime) and is minted again once less than
// mountTokenRenew of it is left, or after a failure mountTokenRetry
// later, doubling up to mountTokenMaxWait. What was minted (its expiry,
// audience and the spec.tenantAdmins the tenant was given with it) is
// kept in memory (Reconciler.minted), never read back from the Secret,
// which the workspace's members may write: a change of the audience or
// the admins is applied with a new token, and a provider that starts
// again mints once more.
const (
	mountTokenLife    = 8 * time.Minute
	mountTokenRenew   = 4 * time.Minute
	mountTokenRetry   = 30 * time.Second
	mountTokenMaxWait = 10 * time.Minute
)

// ReasonTenantNotPublished: the bidder's running lease does not say how
// to reach its tenant (an https endpoint, a CA bundle its caFingerprint
// pins, one of the bidder's service identities): the tenant is not
// mounted.
const ReasonTenantNotPublished = "TenantNotPublished"

// ReasonTenantRefused: the requester's side could not reach the tenant
// with its identity (its PDS issued no token, or the tenant did not take
// the mount's admins); tried again after mountTokenRetry.
const ReasonTenantRefused = "TenantRefused"

// mountAdminRole is the ClusterRole (and its binding) on a tenant of the
// kcp users and groups spec.tenantAdmins names, who have rights there
// only through this binding. mountRole is the mount's: it binds the
// mount's own user on the tenant (serviceauth.MountUser of the
// requester's DID, whose tokens the mount presents) to impersonating
// those users and groups, the provider's probe user, and no one else.
const (
	mountAdminRole = "knotless:mount-admin"
	mountRole      = "knotless:mount"
)

// deliver mounts the tenant of a contract whose lease says the VM runs,
// with what the bidder's signed lease record says (endpoint, the CA
// bundle it pins, the tenant's service identity: deal.TenantOf) and the
// requester's own identity: a service-auth token its PDS issues for the
// tenant and serviceauth.MountMethod, which the mount presents while
// impersonating the kcp user. It first binds spec.tenantAdmins as the
// tenant's admins, and the mount's user to impersonating them alone,
// with the requester's DID (applyMountAdmins). A snapshot to restore
// (spec.restoreFrom) is imported first, the same way (restoreFirst).
// Nothing is read from the bidder's workspace. It
// reports whether the mount is Ready and what it waits for (a reason for
// the contract's Ready condition when it is not the phase's own, and a
// message), and asks to be looked at again when it must (s.due).
func (s *session) deliver(cc *marketv1alpha1.ComputeContract, lease *market.Rec) (bool, string, string, error) {
	tc := &computev1alpha1.TenantCluster{}
	switch err := s.c.Get(s.ctx, client.ObjectKey{Name: cc.Name}, tc); {
	case err == nil && !ownsMount(cc, tc):
		s.due(s.now.Add(2 * time.Second))
		return false, ReasonMountNameTaken, s.mountNameTaken(cc), nil
	case apierrors.IsNotFound(err):
		tc = nil
	case err != nil:
		return false, "", "", err
	}
	// held is the answer while the tenant cannot be reached anew: a mount
	// in place keeps serving with the token it has, and its own probe says
	// when the tenant stops answering (the contract's grace runs from
	// there, and a release follows); without one the contract waits.
	held := func(reason, msg string) (bool, string, string, error) {
		msg = s.refuse(cc, reason, msg)
		if tc != nil {
			ready, _ := mountState(tc)
			return ready, reason, msg, nil
		}
		return false, reason, msg, nil
	}
	tn, err := deal.TenantOf(cc.Spec.BidderDID, lease.Lease)
	switch {
	case errors.Is(err, deal.ErrCABundleNotPinned):
		s.due(s.now.Add(mountTokenRetry))
		return held(ReasonCABundleNotPinned, "the CA bundle of the bidder's lease is not the one it pins: the tenant is not mounted anew")
	case err != nil:
		s.due(s.now.Add(mountTokenRetry))
		return held(ReasonTenantNotPublished, "the bidder's lease does not say how to reach the tenant ("+err.Error()+"): the tenant is not mounted anew")
	}
	if s.r.Mounts == nil {
		return false, "", "", errNoMountStore
	}
	s.publishReach(cc, tn)
	mt, current := s.mountToken(cc, tn)
	if current && mt.fresh(s.now, tn.ServiceID, s.adminsKey()) {
		// What a member changed of the mount in the workspace is put back;
		// nothing is minted for it.
		s.due(mt.expires.Add(-mountTokenRenew))
		return s.mount(cc, tn, "", time.Time{})
	}
	// A snapshot to restore goes into the tenant before it is mounted,
	// whatever TenantCluster the workspace holds (a member could make one
	// labelled for the contract first): restoreFirst knows what it
	// restored, and never restores a contract that was Active.
	if done, why := s.restoreFirst(cc, tn); !done {
		return false, "", why, nil
	}
	token, exp, why := s.mintMount(cc, tn, mt, current)
	if why != "" {
		return held(ReasonTenantRefused, why)
	}
	ready, reason, why, err := s.mount(cc, tn, token, exp)
	if errors.Is(err, errCredentialNotKept) {
		// The provider's own workspace did not take the token: the next
		// one is minted after the same wait as after a refusal, not at
		// every retry of the reconcile.
		var last mintTry
		if v, ok := s.r.mints.Load(cc.UID); ok {
			last = v.(mintTry)
		}
		wait := backoff(mountTokenRetry, last.fails, mountTokenMaxWait)
		s.r.mints.Store(cc.UID, mintTry{next: s.now.Add(wait), fails: last.fails + 1, why: err.Error()})
	}
	if err == nil {
		// The failures in a row end only with a mount that took its token.
		s.r.mints.Delete(cc.UID)
		s.due(exp.Add(-mountTokenRenew))
		if !ready {
			s.due(s.now.Add(2 * time.Second))
		}
	}
	return ready, reason, why, err
}

// mintMount mints the token of cc's mount, for the tenant tn, and binds
// spec.tenantAdmins there with it; mt is the token in place (current:
// the mount is the tenant's). A failure waits mountTokenRetry, doubling
// up to mountTokenMaxWait (in memory: nothing the bidder writes shortens
// it). It returns the token and its expiry, or why there is none.
func (s *session) mintMount(cc *marketv1alpha1.ComputeContract, tn deal.Tenant, mt mountedToken, current bool) (string, time.Time, string) {
	var last mintTry
	if v, ok := s.r.mints.Load(cc.UID); ok {
		last = v.(mintTry)
	}
	if s.now.Before(last.next) {
		s.due(last.next)
		return "", time.Time{}, last.why
	}
	exp := s.now.Add(mountTokenLife)
	_, why := s.identityOnTenant(cc, tn, exp, s.applyMountAdmins)
	var token string
	if why == "" {
		var err error
		if token, err = s.withToken(cc, tn, serviceauth.MountMethod, exp, accessDeadline, nil); err != nil {
			why = refusal(err)
		}
	}
	if why != "" {
		wait := backoff(mountTokenRetry, last.fails, mountTokenMaxWait)
		msg := "the tenant is not reached with the requester's identity: " + why
		if current && s.now.Before(mt.expires) {
			msg += "; the mount keeps its token until " + market.Time(mt.expires)
		}
		s.r.mints.Store(cc.UID, mintTry{next: s.now.Add(wait), fails: last.fails + 1, why: msg})
		s.due(s.now.Add(wait))
		return "", time.Time{}, msg
	}
	return token, exp, ""
}

// mintTry is when the token of a contract's mount is minted next after
// a failure, how many tries in a row failed, and what the last said
// (Reconciler.mints, by contract UID).
type mintTry struct {
	next  time.Time
	fails int
	why   string
}

// mountedToken is a token this process minted for a contract's mount
// (Reconciler.minted): when it expires, the audience it is for, the
// spec.tenantAdmins the tenant was given with it (adminsKey), and the
// SHA-256 of the token, by which it is recognised in the market
// credential.
type mountedToken struct {
	expires               time.Time
	audience, admins, sum string
}

// fresh reports whether the token serves the tenant of service identity
// aud with admins for more than mountTokenRenew still.
func (t mountedToken) fresh(now time.Time, aud, admins string) bool {
	return t.audience == aud && t.admins == admins && t.expires.Sub(now) > mountTokenRenew
}

// tokenSum is the SHA-256 of a token, in hex.
func tokenSum(token []byte) string {
	sum := sha256.Sum256(token)
	return hex.EncodeToString(sum[:])
}

// mountToken returns the token this process minted for cc's mount, and
// whether the mount's credential in the provider's workspace holds it,
// for the tenant tn (endpoint and CA). What the requester's workspace
// holds of the mount is not looked at: it is written again at every pass
// (mount), and nothing its members write there makes a token be minted.
func (s *session) mountToken(cc *marketv1alpha1.ComputeContract, tn deal.Tenant) (mountedToken, bool) {
	v, ok := s.r.minted.Load(cc.UID)
	if !ok {
		return mountedToken{}, false
	}
	mt := v.(mountedToken)
	mc, ok, err := tenant.ReadMarket(s.ctx, s.r.Mounts, s.lc, cc.Name)
	if err != nil {
		log.FromContext(s.ctx).Info("the mount's credential could not be read", "contract", cc.Name, "error", err.Error())
	}
	if err != nil || !ok || mc.Contract != string(cc.UID) || mc.URL != tn.Endpoint || !bytes.Equal(mc.CA, tn.CA) || tokenSum([]byte(mc.Token)) != mt.sum {
		return mountedToken{}, false
	}
	return mt, true
}

// errNoMountStore: the provider runs without a client of its own
// workspace (Reconciler.Mounts), where mounts' credentials are kept.
var errNoMountStore = errors.New("the provider has no store for the mounts' credentials")

// errCredentialNotKept is the error of a mount whose credential the
// provider's workspace did not take; why is in the provider's log only,
// since the contract's status shows it to the requester's workspace and
// must not tell of the provider's (R17).
var errCredentialNotKept = errors.New("the provider could not keep the mount's credential (the provider's log says why)")

// adminsKey names spec.tenantAdmins (mountedToken.admins).
func (s *session) adminsKey() string {
	var lines []string
	for _, n := range s.mr.Spec.TenantAdmins.Users {
		lines = append(lines, "user="+n)
	}
	for _, n := range s.mr.Spec.TenantAdmins.Groups {
		lines = append(lines, "group="+n)
	}
	return linesKey(lines)
}

// applyMountAdmins binds spec.tenantAdmins (kcp users and groups, as
// mountAdmins keeps them) to
// mountAdminRole on the tenant of cs, and the mount's user to
// impersonating them (mountRole).
func (s *session) applyMountAdmins(ctx context.Context, cs kubernetes.Interface) error {
	users, groups := s.mountAdmins()
	var subjects []rbacv1.Subject
	for _, n := range groups {
		subjects = append(subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: n})
	}
	for _, n := range users {
		subjects = append(subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: n})
	}
	if err := driver.ApplyRole(ctx, cs, FieldManager, mountAdminRole, accessRules(marketv1alpha1.AccessAdmin), subjects); err != nil {
		return err
	}
	return driver.ApplyRole(ctx, cs, FieldManager, mountRole, mountRules(users, groups),
		[]rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: serviceauth.MountUser(s.st.DID)}})
}

// mountAdmins are the users and groups of spec.tenantAdmins the mount
// asserts on the tenant, sorted: no system: name (which means something
// of its own on a tenant), no did: name (a DID, or the mount's own user,
// has rights of its own there) and no name with a space or a control
// character (the mount proxy reads the names a line each).
func (s *session) mountAdmins() (users, groups []string) {
	keep := func(names []string) []string {
		out := slices.DeleteFunc(slices.Clone(names), func(n string) bool {
			return n == "" || strings.HasPrefix(n, "system:") || strings.HasPrefix(n, "did:") ||
				strings.ContainsFunc(n, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) })
		})
		slices.Sort(out)
		return slices.Compact(out)
	}
	return keep(s.mr.Spec.TenantAdmins.Users), keep(s.mr.Spec.TenantAdmins.Groups)
}

// mountRules let the mount's user impersonate the users and groups
// named, and the provider's probe user (mount.ProbeUser, which reads
// /version to see that the tenant answers); nothing else, not even
// system:authenticated (a user impersonated without groups has it), nor
// any extra or UID.
func mountRules(users, groups []string) []rbacv1.PolicyRule {
	rules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"users"}, Verbs: []string{"impersonate"}, ResourceNames: append([]string{mount.ProbeUser}, users...)}}
	if len(groups) > 0 {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"groups"}, Verbs: []string{"impersonate"}, ResourceNames: groups})
	}
	return rules
}

// mount writes the contract's TenantCluster, the Secret with the
// tenant's URL and CA bundle it reads (labelled for it alone) and, with a
// newly minted token (token not ""), first the market credential in the
// provider's workspace: the token, bound to the contract, its
// TenantCluster, the tenant's endpoint and CA, with the users and groups
// the mount may assert (tenant.MarketCredential). Whoever changes the
// TenantCluster's URL or CA afterwards does not get the token sent
// there, and no user of the requester's workspace can read it. The token
// is the requester's service-auth token for the tenant's mount alone,
// expiring at exp.
func (s *session) mount(cc *marketv1alpha1.ComputeContract, tn deal.Tenant, token string, exp time.Time) (bool, string, string, error) {
	ns := cc.Namespace
	name := tenantCredential(cc.Name)
	tc := &computev1alpha1.TenantCluster{ObjectMeta: metav1.ObjectMeta{Name: cc.Name}}
	if _, err := controllerutil.CreateOrUpdate(s.ctx, s.c, tc, func() error {
		if tc.ResourceVersion != "" && !ownsMount(cc, tc) {
			return errMountNameTaken
		}
		metav1.SetMetaDataLabel(&tc.ObjectMeta, LabelContract, string(cc.UID))
		tc.Spec.URL = tn.Endpoint
		tc.Spec.CABundle = computev1alpha1.KeyRef{Kind: "Secret", Namespace: ns, Name: name, Key: computev1alpha1.MountCredentialCAKey}
		tc.Spec.Credential = computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: ns, Name: name}, Market: true}
		tc.Spec.Workspace = ""
		return nil
	}); errors.Is(err, errMountNameTaken) {
		return false, ReasonMountNameTaken, s.mountNameTaken(cc), nil
	} else if err != nil {
		return false, "", "", fmt.Errorf("the TenantCluster: %w", err)
	}
	if token != "" {
		users, groups := s.mountAdmins()
		want := tenant.MarketCredential{LogicalCluster: s.lc, Name: tc.Name, Contract: string(cc.UID), URL: tn.Endpoint, CA: tn.CA, Token: token,
			Users: users, Groups: groups, Expires: exp}.Secret()
		cred := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: want.Namespace, Name: want.Name}}
		if _, err := controllerutil.CreateOrUpdate(s.ctx, s.r.Mounts, cred, func() error {
			cred.Labels, cred.Type, cred.Data = want.Labels, want.Type, want.Data
			return nil
		}); err != nil {
			log.FromContext(s.ctx).Error(err, "keeping the mount's credential", "contract", cc.Name)
			return false, "", "", errCredentialNotKept
		}
		s.r.minted.Store(cc.UID, mountedToken{expires: exp, audience: tn.ServiceID, admins: s.adminsKey(), sum: tokenSum([]byte(token))})
	}
	// The Secret last: its change makes the TenantCluster be looked at
	// again, by then with its credential.
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if _, err := controllerutil.CreateOrUpdate(s.ctx, s.c, sec, func() error {
		metav1.SetMetaDataLabel(&sec.ObjectMeta, computev1alpha1.LabelMountCredential, tc.Name)
		sec.Type = corev1.SecretTypeOpaque
		sec.Data = map[string][]byte{computev1alpha1.MountCredentialCAKey: tn.CA, computev1alpha1.MountCredentialURLKey: []byte(tn.Endpoint)}
		return controllerutil.SetControllerReference(cc, sec, s.c.Scheme())
	}); err != nil {
		return false, "", "", fmt.Errorf("the tenant's Secret: %w", err)
	}
	ready, why := mountState(tc)
	return ready, "", why, nil
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
// the one deliver made: labelled with the contract's UID), the Secret
// with its URL and CA, and its credential in the provider's workspace
// (when it is the contract's: another contract of the name, in another
// namespace, leaves it).
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
	if s.r.Mounts != nil {
		if err := tenant.DeleteMarket(s.ctx, s.r.Mounts, s.lc, cc.Name, string(cc.UID)); err != nil {
			log.FromContext(s.ctx).Error(err, "deleting the mount's credential", "contract", cc.Name)
			return errCredentialNotKept
		}
	}
	s.r.minted.Delete(cc.UID)
	s.r.Reaches.Delete(s.lc, cc.UID)
	return nil
}

// publishReach tells the other controllers of the requester's side how
// the tenant of cc is reached (tenantreach.Registry): at tn, which the
// bidder's lease says and deal.TenantOf checked, as the requester's DID,
// with service-auth tokens its repo mints when asked.
func (s *session) publishReach(cc *marketv1alpha1.ComputeContract, tn deal.Tenant) {
	if s.r.Reaches == nil {
		return
	}
	r, c, lc, repo := s.r, s.c, s.lc, s.repo.DeepCopy()
	s.r.Reaches.Put(s.lc, cc.UID, tenantreach.Reach{Tenant: tn, Client: func(ctx context.Context, exp time.Time) (kubernetes.Interface, error) {
		pub, err := market.Connect(ctx, r.Connect, r.Pool, c, lc, repo)
		if err != nil {
			return nil, err
		}
		token, err := pub.ServiceAuth(ctx, tn.ServiceID, serviceauth.Method, exp)
		if err != nil {
			return nil, fmt.Errorf("no service-auth token for the tenant: %w", err)
		}
		return r.tenantClient(tn, token)
	}})
}
