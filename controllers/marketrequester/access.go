package marketrequester

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/serviceauth"
)

// accessRules are the rules of a role's ClusterRole on a tenant. The
// requester's DID is the tenant's admin already (the bidder's agent binds
// it from the contract).
func accessRules(role marketv1alpha1.AccessRole) []rbacv1.PolicyRule {
	verbs := []string{"*"}
	switch role {
	case marketv1alpha1.AccessView:
		verbs = []string{"get", "list", "watch"}
	case marketv1alpha1.AccessEdit:
		verbs = []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
	}
	paths := []string{"get"}
	if role == marketv1alpha1.AccessAdmin {
		paths = []string{"*"}
	}
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: verbs},
		{NonResourceURLs: []string{"*"}, Verbs: paths},
	}
}

// accessRole is the name of a role's ClusterRole (and binding) on a
// tenant.
func accessRole(role marketv1alpha1.AccessRole) string { return "knotless:access:" + string(role) }

// accessKey names the tenant access list: "" for none, else a hash of it
// in order (ComputeContract status.accessApplied).
func accessKey(access []marketv1alpha1.TenantAccess) string {
	if len(access) == 0 {
		return ""
	}
	sorted := slices.Clone(access)
	slices.SortFunc(sorted, func(a, b marketv1alpha1.TenantAccess) int { return strings.Compare(a.DID, b.DID) })
	h := sha256.New()
	for _, a := range sorted {
		fmt.Fprintf(h, "%s=%s\n", a.DID, a.Role)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))[:32]
}

// grantAccess applies spec.tenantAccess into the tenant of an Active
// contract as RBAC, once for each change of it (st.AccessApplied), and
// says how that went in the contract's TenantAccess condition. The
// requester's side reaches the tenant with its own identity: a
// service-auth token its PDS issues for the tenant's service identity,
// at the endpoint and with the CA the bidder's lease publishes (checked
// by deal.TenantOf), through the provider's address policy. Nothing is
// read from the bidder's workspace.
func (s *session) grantAccess(cc *marketv1alpha1.ComputeContract, st *marketv1alpha1.ComputeContractStatus, lease *market.Rec) {
	want := accessKey(s.mr.Spec.TenantAccess)
	if st.AccessApplied == want || lease == nil || lease.Lease == nil {
		return
	}
	why := s.applyAccess(cc, lease)
	if why == "" {
		st.AccessApplied = want
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: marketv1alpha1.ConditionTenantAccess, Status: metav1.ConditionTrue,
			Reason: marketv1alpha1.ReasonAccessApplied, Message: fmt.Sprintf("%d DIDs have a role on the tenant", len(s.mr.Spec.TenantAccess)), ObservedGeneration: cc.Generation})
		return
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: marketv1alpha1.ConditionTenantAccess, Status: metav1.ConditionFalse,
		Reason: marketv1alpha1.ReasonAccessNotApplied, Message: "the tenant access is not applied: " + why, ObservedGeneration: cc.Generation})
	s.due(s.now.Add(accessRetry))
}

// accessRetry is when tenant access that could not be applied is tried
// again.
const accessRetry = 30 * time.Second

// applyAccess applies spec.tenantAccess into the tenant of the lease and
// returns why it could not ("" when it did).
func (s *session) applyAccess(cc *marketv1alpha1.ComputeContract, lease *market.Rec) string {
	tn, err := deal.TenantOf(cc.Spec.BidderDID, lease.Lease)
	if err != nil {
		return err.Error()
	}
	token, err := s.pub.ServiceAuth(s.ctx, tn.ServiceID, serviceauth.Method, time.Now().Add(2*time.Minute))
	if err != nil {
		return "a service-auth token from the requester's PDS: " + err.Error()
	}
	cfg := &rest.Config{Host: tn.Endpoint, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: tn.CA}, Timeout: 15 * time.Second}
	if s.r.Policy != nil {
		cfg.Dial = s.r.Policy.Dialer(10 * time.Second).DialContext
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err.Error()
	}
	for _, role := range []marketv1alpha1.AccessRole{marketv1alpha1.AccessView, marketv1alpha1.AccessEdit, marketv1alpha1.AccessAdmin} {
		var subjects []rbacv1.Subject
		for _, a := range s.mr.Spec.TenantAccess {
			if a.Role == role {
				subjects = append(subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: a.DID})
			}
		}
		if err := driver.ApplyRole(s.ctx, cs, FieldManager, accessRole(role), accessRules(role), subjects); err != nil {
			return fmt.Sprintf("%s on the tenant: %v", accessRole(role), err)
		}
	}
	return ""
}
