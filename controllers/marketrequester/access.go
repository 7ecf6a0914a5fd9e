package marketrequester

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/log"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/serviceauth"
	"github.com/knotless-dev/knotless/internal/tenantreach"
)

// accessRules are the rules of a role's ClusterRole on a tenant, after
// Kubernetes' own view, edit and admin: view reads the workload kinds (not
// Secrets); edit also writes them and reads and writes Secrets; neither
// touches RBAC (an editor could otherwise bind any DID, whom the agent
// would then let in) or impersonates. admin may do everything. The
// requester's DID is the tenant's admin already (the bidder's agent binds
// it from the contract).
func accessRules(role marketv1alpha1.AccessRole) []rbacv1.PolicyRule {
	if role == marketv1alpha1.AccessAdmin {
		return []rbacv1.PolicyRule{
			{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}},
			{NonResourceURLs: []string{"*"}, Verbs: []string{"*"}},
		}
	}
	read := []string{"get", "list", "watch"}
	verbs := read
	if role == marketv1alpha1.AccessEdit {
		verbs = []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
	}
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "pods/log", "pods/status", "services", "endpoints", "configmaps", "persistentvolumeclaims",
			"serviceaccounts", "replicationcontrollers", "events", "limitranges", "resourcequotas"}, Verbs: verbs},
		{APIGroups: []string{""}, Resources: []string{"namespaces", "nodes"}, Verbs: read},
		{APIGroups: []string{"apps", "batch", "autoscaling", "policy", "networking.k8s.io", "discovery.k8s.io", "events.k8s.io"}, Resources: []string{"*"}, Verbs: verbs},
		{NonResourceURLs: []string{"*"}, Verbs: []string{"get"}},
	}
	if role == marketv1alpha1.AccessEdit {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets", "namespaces"}, Verbs: verbs})
	}
	return rules
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
	lines := make([]string, 0, len(sorted))
	for _, a := range sorted {
		lines = append(lines, a.DID+"="+string(a.Role))
	}
	return linesKey(lines)
}

// linesKey names a list of lines by their SHA-256 (the first 128 bits,
// "sha256:<hex>").
func linesKey(lines []string) string {
	h := sha256.New()
	for _, l := range lines {
		fmt.Fprintf(h, "%s\n", l)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))[:32]
}

// Tenant access is applied again this often while nothing changes (a
// binding deleted on the tenant comes back), and tried again after a
// failure after accessRetry, doubling up to accessRefresh.
const (
	accessRefresh = 10 * time.Minute
	accessRetry   = 30 * time.Second
	// accessDeadline bounds one application (a token, six requests).
	accessDeadline = 20 * time.Second
)

// backoff is how long to wait after fails failures in a row (before
// this one): base, doubling up to 32 times base, at most limit.
func backoff(base time.Duration, fails int, limit time.Duration) time.Duration {
	return min(base<<min(max(fails, 0), 5), limit)
}

// accessTry is when a contract's tenant access is applied next, and how
// many tries in a row failed (Reconciler.access, by contract UID).
type accessTry struct {
	key   string
	next  time.Time
	fails int
}

// grantAccess applies spec.tenantAccess into the tenant of an Active
// contract as RBAC when it changed (st.AccessApplied) or every
// accessRefresh, and says how that went in the contract's TenantAccess
// condition; a failure is tried again after a backoff that nothing the
// bidder writes shortens. The requester's side reaches the tenant with
// its own identity: a service-auth token its PDS issues for the tenant's
// service identity, at the endpoint and with the CA the bidder's lease
// publishes (checked by deal.TenantOf), through the provider's address
// policy. Nothing is read from the bidder's workspace.
func (s *session) grantAccess(cc *marketv1alpha1.ComputeContract, st *marketv1alpha1.ComputeContractStatus, lease *market.Rec) {
	want := accessKey(s.mr.Spec.TenantAccess)
	if lease == nil || lease.Lease == nil || want == "" && st.AccessApplied == "" {
		return
	}
	var last accessTry
	if v, ok := s.r.access.Load(cc.UID); ok {
		last = v.(accessTry)
	}
	if last.key == want && s.now.Before(last.next) {
		s.due(last.next)
		return
	}
	why := s.applyAccess(cc, lease)
	if why == "" {
		st.AccessApplied = want
		s.r.access.Store(cc.UID, accessTry{key: want, next: s.now.Add(accessRefresh)})
		s.due(s.now.Add(accessRefresh))
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: marketv1alpha1.ConditionTenantAccess, Status: metav1.ConditionTrue,
			Reason: marketv1alpha1.ReasonAccessApplied, Message: fmt.Sprintf("%d DIDs have a role on the tenant", len(s.mr.Spec.TenantAccess)), ObservedGeneration: cc.Generation})
		return
	}
	fails := 1
	if last.key == want {
		fails = last.fails + 1
	}
	wait := backoff(accessRetry, fails-1, accessRefresh)
	s.r.access.Store(cc.UID, accessTry{key: want, next: s.now.Add(wait), fails: fails})
	s.due(s.now.Add(wait))
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: marketv1alpha1.ConditionTenantAccess, Status: metav1.ConditionFalse,
		Reason: marketv1alpha1.ReasonAccessNotApplied, Message: "the tenant access is not applied: " + why, ObservedGeneration: cc.Generation})
}

// applyAccess applies spec.tenantAccess into the tenant of the lease,
// as the requester's DID, and returns why it could not ("" when it did).
func (s *session) applyAccess(cc *marketv1alpha1.ComputeContract, lease *market.Rec) string {
	tn, err := deal.TenantOf(cc.Spec.BidderDID, lease.Lease)
	if err != nil {
		return err.Error()
	}
	_, why := s.identityOnTenant(cc, tn, s.now.Add(2*time.Minute), func(ctx context.Context, cs kubernetes.Interface) error {
		for _, role := range []marketv1alpha1.AccessRole{marketv1alpha1.AccessView, marketv1alpha1.AccessEdit, marketv1alpha1.AccessAdmin} {
			var subjects []rbacv1.Subject
			for _, a := range s.mr.Spec.TenantAccess {
				if a.Role == role {
					subjects = append(subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: a.DID})
				}
			}
			if err := driver.ApplyRole(ctx, cs, FieldManager, accessRole(role), accessRules(role), subjects); err != nil {
				return fmt.Errorf("role %s: %w", role, err)
			}
		}
		return nil
	})
	return why
}

// identityOnTenant reaches the tenant tn as the requester's DID within
// accessDeadline: with a service-auth token for the tenant expiring at
// exp (withToken), it calls apply with a client of the tenant bearing it.
// It returns the token, or why it could not (refusal).
func (s *session) identityOnTenant(cc *marketv1alpha1.ComputeContract, tn deal.Tenant, exp time.Time, apply func(context.Context, kubernetes.Interface) error) (string, string) {
	token, err := s.withToken(cc, tn, serviceauth.Method, exp, accessDeadline, func(ctx context.Context, token string) error {
		cs, err := s.r.tenantClient(tn, token)
		if err != nil {
			return err
		}
		return apply(ctx, cs)
	})
	if err != nil {
		return "", refusal(err)
	}
	return token, ""
}

// errNoToken: the requester's PDS issued no service-auth token for the
// tenant.
var errNoToken = errors.New("the requester's PDS issued no service-auth token for the tenant")

// withToken asks the requester's PDS for a service-auth token for the
// tenant tn's service identity and the method lxm, expiring at exp, and
// calls apply with it (when not nil), all within deadline. It returns the
// token, or errNoToken or apply's error, which go to the provider's log.
func (s *session) withToken(cc *marketv1alpha1.ComputeContract, tn deal.Tenant, lxm string, exp time.Time, deadline time.Duration, apply func(context.Context, string) error) (string, error) {
	ctx, cancel := context.WithTimeout(s.ctx, deadline)
	defer cancel()
	logger := log.FromContext(ctx).WithValues("contract", cc.Name)
	token, err := s.pub.ServiceAuth(ctx, tn.ServiceID, lxm, exp)
	if err != nil {
		logger.Info("no service-auth token for the tenant", "method", lxm, "error", err.Error())
		return "", errNoToken
	}
	if apply == nil {
		return token, nil
	}
	if err := apply(ctx, token); err != nil {
		logger.Info("the tenant refused the requester's side", "error", err.Error())
		return "", err
	}
	return token, nil
}

// refusal says which step of withToken failed, not what the tenant or the
// PDS answered: that stays in the provider's log (R17: a tenant at a
// private address must not learn the caller what sits there).
func refusal(err error) string {
	if errors.Is(err, errNoToken) {
		return err.Error()
	}
	return "the tenant did not take it (the provider's log says why)"
}

// tenantClient is TenantClient, by default a client through the
// provider's address policy (tenantreach.Client).
func (r *Reconciler) tenantClient(tn deal.Tenant, token string) (kubernetes.Interface, error) {
	if r.TenantClient != nil {
		return r.TenantClient(tn, token)
	}
	return tenantreach.Client(tn, token, r.Policy)
}
