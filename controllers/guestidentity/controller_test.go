package guestidentity

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	kfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	identityv1alpha1 "github.com/knotless-dev/knotless/apis/identity/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/guestadmission"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/tenantreach"
)

const ws = "ws-alice"

var (
	t0  = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	key = []byte("0123456789abcdef0123456789abcdef")
)

type fixture struct {
	r      *Reconciler
	cl     *clustertest.Cluster
	ws     *kfake.Clientset
	tenant *kfake.Clientset
	now    time.Time
}

// newFixture is a workspace holding objs and an Active contract web-0
// whose tenant has the guest (namespace guests, ServiceAccount reader)
// and tenantObjs.
func newFixture(t *testing.T, objs []client.Object, tenantObjs ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{now: t0}
	cc := &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0", UID: "cc-uid"},
		Spec:   marketv1alpha1.ComputeContractSpec{Side: marketv1alpha1.SideRequester, RequesterDID: "did:plc:alice", BidderDID: "did:plc:acme"},
		Status: marketv1alpha1.ComputeContractStatus{Phase: marketv1alpha1.ContractActive}}
	f.cl = clustertest.NewWithClient(clustertest.NewClientBuilder().WithObjects(append(objs, cc)...).Build())
	f.tenant = kfake.NewClientset(append(tenantObjs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "guests"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "guests", Name: "reader"}})...)
	f.ws = kfake.NewClientset()
	// kcp answers a TokenRequest with a token that lives what was asked.
	f.ws.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "token" {
			return false, nil, nil
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenRequest)
		if _, err := f.ws.Tracker().Get(corev1.SchemeGroupVersion.WithResource("serviceaccounts"), a.GetNamespace(), a.(k8stesting.CreateActionImpl).Name); err != nil {
			return true, nil, err
		}
		tr.Status = authenticationv1.TokenRequestStatus{Token: "token-" + f.now.Format(time.TimeOnly), ExpirationTimestamp: metav1.NewTime(f.now.Add(time.Duration(*tr.Spec.ExpirationSeconds) * time.Second))}
		return true, tr, nil
	})
	reaches := &tenantreach.Registry{}
	reaches.Put(ws, cc.UID, tenantreach.Reach{Tenant: deal.Tenant{Endpoint: "https://tenant.example:6443"},
		Client: func(context.Context, time.Time) (kubernetes.Interface, error) { return f.tenant, nil }})
	f.r = &Reconciler{GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{ws: f.cl}), Reaches: reaches, Key: key,
		Guest:     KCP{Server: "https://kcp.example:6443", CA: []byte("fp-ca"), TLSServerName: "kcp.internal"},
		Workspace: func(string) (kubernetes.Interface, error) { return f.ws, nil }, Now: func() time.Time { return f.now }}
	return f
}

// grant is the grant name, changed by mut and stamped as the webhook
// admits it.
func grant(name string, mut func(*identityv1alpha1.GuestIdentityGrant)) *identityv1alpha1.GuestIdentityGrant {
	g := &identityv1alpha1.GuestIdentityGrant{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name + "-uid"), Generation: 1},
		Spec: identityv1alpha1.GuestIdentityGrantSpec{ContractRef: identityv1alpha1.ContractRef{Name: "web-0"},
			Guest: identityv1alpha1.Guest{Namespace: "guests", ServiceAccount: "reader"}, SecretName: "kcp-access",
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"apps.knotless.dev"}, Resources: []string{"applications"}, Verbs: []string{"get"}}}}}
	if mut != nil {
		mut(g)
	}
	g.Spec.AdmissionStamp = guestadmission.Stamp(key, ws, "default", name, &g.Spec)
	return g
}

// unadmitted is grant with mut applied after the stamp.
func unadmitted(mut func(*identityv1alpha1.GuestIdentityGrant)) *identityv1alpha1.GuestIdentityGrant {
	g := grant("g", nil)
	mut(g)
	return g
}

func (f *fixture) reconcile(t *testing.T, name string) reconcile.Result {
	t.Helper()
	res, err := f.r.Reconcile(t.Context(), mcreconcile.Request{ClusterName: ws, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func (f *fixture) ready(t *testing.T, name string) *metav1.Condition {
	t.Helper()
	g := &identityv1alpha1.GuestIdentityGrant{}
	if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: name}, g); err != nil {
		t.Fatal(err)
	}
	return clustertest.Condition(t, g.Status.Conditions, identityv1alpha1.ConditionReady)
}

func TestGrantMakesTheIdentityAndWritesTheGuestsSecret(t *testing.T) {
	f := newFixture(t, []client.Object{grant("reader", nil)})
	res := f.reconcile(t, "reader")
	if c := f.ready(t, "reader"); c.Reason != identityv1alpha1.ReasonGranted {
		t.Fatalf("Ready %s: %s", c.Reason, c.Message)
	}
	if res.RequeueAfter != 40*time.Minute {
		t.Errorf("looked at again in %s, want 40m (two thirds of the token's hour)", res.RequeueAfter)
	}
	ctx := t.Context()
	name := "knotless-guest-reader-uid"
	if _, err := f.ws.CoreV1().ServiceAccounts("default").Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Errorf("the ServiceAccount: %v", err)
	}
	role, err := f.ws.RbacV1().Roles("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil || len(role.Rules) != 1 || role.Rules[0].Resources[0] != "applications" {
		t.Errorf("the Role: %+v, %v", role, err)
	}
	rb, err := f.ws.RbacV1().RoleBindings("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil || rb.RoleRef.Kind != "Role" || rb.Subjects[0].Name != name {
		t.Errorf("the RoleBinding: %+v, %v", rb, err)
	}
	sec, err := f.tenant.CoreV1().Secrets("guests").Get(ctx, "kcp-access", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(sec.Data[KeyKubeconfig])
	if err != nil || cfg.Host != "https://kcp.example:6443/clusters/"+ws || cfg.BearerToken != "token-12:00:00" || cfg.ServerName != "kcp.internal" || string(cfg.CAData) != "fp-ca" {
		t.Errorf("the kubeconfig: %+v, %v", cfg, err)
	}
	if string(sec.Data[KeyToken]) != "token-12:00:00" || string(sec.Data[KeyNamespace]) != "default" || sec.Labels[LabelGrant] != "reader-uid" {
		t.Errorf("the Secret: %v %v", sec.Labels, sec.Data)
	}

	// Before the renewal: nothing new. At it: a new token in the Secret.
	f.now = t0.Add(39 * time.Minute)
	f.reconcile(t, "reader")
	f.now = t0.Add(41 * time.Minute)
	f.reconcile(t, "reader")
	sec, _ = f.tenant.CoreV1().Secrets("guests").Get(ctx, "kcp-access", metav1.GetOptions{})
	if string(sec.Data[KeyToken]) != "token-12:41:00" {
		t.Errorf("the token after the renewal time: %q", sec.Data[KeyToken])
	}

	// Deleted: the ServiceAccount (its tokens with it), the RBAC and the
	// Secret in the tenant go, then the finalizer.
	g := &identityv1alpha1.GuestIdentityGrant{}
	_ = f.cl.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "reader"}, g)
	if err := f.cl.Client.Delete(ctx, g); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "reader")
	if _, err := f.ws.CoreV1().ServiceAccounts("default").Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the ServiceAccount after deletion: %v", err)
	}
	if _, err := f.ws.RbacV1().RoleBindings("default").Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the RoleBinding after deletion: %v", err)
	}
	if _, err := f.tenant.CoreV1().Secrets("guests").Get(ctx, "kcp-access", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the tenant's Secret after deletion: %v", err)
	}
	if err := f.cl.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "reader"}, g); !apierrors.IsNotFound(err) {
		t.Errorf("the grant after its finalizer: %v", err)
	}
}

func TestClusterRoleIsBoundWithoutARole(t *testing.T) {
	f := newFixture(t, []client.Object{grant("viewer", func(g *identityv1alpha1.GuestIdentityGrant) {
		g.Spec.Rules, g.Spec.ClusterRole = nil, "view"
	})})
	f.reconcile(t, "viewer")
	rb, err := f.ws.RbacV1().RoleBindings("default").Get(t.Context(), "knotless-guest-viewer-uid", metav1.GetOptions{})
	if err != nil || rb.RoleRef.Kind != "ClusterRole" || rb.RoleRef.Name != "view" {
		t.Errorf("the RoleBinding: %+v, %v", rb, err)
	}
	if _, err := f.ws.RbacV1().Roles("default").Get(t.Context(), "knotless-guest-viewer-uid", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a Role for a ClusterRole grant: %v", err)
	}
}

// TestBadGrantsGetAConditionAndNothingElse: what makes a grant
// unservable is said in its condition, and nothing is made in the
// workspace or the tenant.
func TestBadGrantsGetAConditionAndNothingElse(t *testing.T) {
	for name, c := range map[string]struct {
		grant  *identityv1alpha1.GuestIdentityGrant
		tenant []runtime.Object
		server string
		reason string
		msg    string
		// squatter: a ServiceAccount of the grant's name that knotless
		// did not make is in the workspace.
		squatter bool
	}{
		"unstamped": {grant: unadmitted(func(g *identityv1alpha1.GuestIdentityGrant) { g.Spec.AdmissionStamp = "" }), reason: identityv1alpha1.ReasonNotAdmitted},
		"edited":    {grant: unadmitted(func(g *identityv1alpha1.GuestIdentityGrant) { g.Spec.Rules[0].Verbs = []string{"*"} }), reason: identityv1alpha1.ReasonNotAdmitted},
		"other name": {grant: unadmitted(func(g *identityv1alpha1.GuestIdentityGrant) {
			g.Spec.AdmissionStamp = grant("h", nil).Spec.AdmissionStamp
		}), reason: identityv1alpha1.ReasonNotAdmitted},
		"too long": {grant: grant("g", func(g *identityv1alpha1.GuestIdentityGrant) {
			g.Spec.Duration = &metav1.Duration{Duration: 2 * time.Hour}
		}), reason: identityv1alpha1.ReasonInvalidSpec, msg: "at most 1h0m0s"},
		"too short": {grant: grant("g", func(g *identityv1alpha1.GuestIdentityGrant) {
			g.Spec.Duration = &metav1.Duration{Duration: time.Minute}
		}), reason: identityv1alpha1.ReasonInvalidSpec, msg: "at least 10m0s"},
		"both":        {grant: grant("g", func(g *identityv1alpha1.GuestIdentityGrant) { g.Spec.ClusterRole = "view" }), reason: identityv1alpha1.ReasonInvalidSpec, msg: "not both"},
		"no contract": {grant: grant("g", func(g *identityv1alpha1.GuestIdentityGrant) { g.Spec.ContractRef.Name = "web-9" }), reason: identityv1alpha1.ReasonContractNotFound},
		"no namespace": {grant: grant("g", func(g *identityv1alpha1.GuestIdentityGrant) { g.Spec.Guest.Namespace = "elsewhere" }),
			reason: identityv1alpha1.ReasonGuestNotFound, msg: "no namespace elsewhere"},
		"no service account": {grant: grant("g", func(g *identityv1alpha1.GuestIdentityGrant) { g.Spec.Guest.ServiceAccount = "writer" }),
			reason: identityv1alpha1.ReasonGuestNotFound, msg: "no ServiceAccount writer"},
		"secret taken": {grant: grant("g", nil), tenant: []runtime.Object{&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "guests", Name: "kcp-access"}}},
			reason: identityv1alpha1.ReasonSecretNameTaken},
		"not enabled": {grant: grant("g", nil), server: "-", reason: identityv1alpha1.ReasonNotEnabled},
		"kube namespace": {grant: grant("g", func(g *identityv1alpha1.GuestIdentityGrant) { g.Spec.Guest.Namespace = "kube-system" }),
			reason: identityv1alpha1.ReasonInvalidSpec, msg: "kube-*"},
		"name squatted": {grant: grant("g", nil), squatter: true, reason: identityv1alpha1.ReasonNameTaken},
	} {
		t.Run(name, func(t *testing.T) {
			if c.grant.Name != "g" {
				t.Fatal("one grant per case")
			}
			f := newFixture(t, []client.Object{c.grant}, c.tenant...)
			if c.server == "-" {
				f.r.Guest.Server = ""
			}
			if c.squatter {
				if _, err := f.ws.CoreV1().ServiceAccounts("default").Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "knotless-guest-g-uid"}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			f.reconcile(t, "g")
			cond := f.ready(t, "g")
			if cond.Reason != c.reason || !strings.Contains(cond.Message, c.msg) {
				t.Errorf("Ready %s: %s; want %s saying %q", cond.Reason, cond.Message, c.reason, c.msg)
			}
			if _, err := f.tenant.CoreV1().Secrets("guests").Get(t.Context(), "kcp-access", metav1.GetOptions{}); c.tenant == nil && !apierrors.IsNotFound(err) {
				t.Errorf("a Secret was written in the tenant: %v", err)
			}
			for _, a := range f.ws.Actions() {
				if a.GetVerb() == "create" && a.GetSubresource() == "token" {
					t.Error("a token was requested")
				}
			}
		})
	}
}

// TestGrantNoLongerAdmittedIsRevoked: a granted grant whose stamp stops
// matching (its spec changed behind the webhook) loses its
// ServiceAccount, so its tokens stop.
func TestGrantNoLongerAdmittedIsRevoked(t *testing.T) {
	f := newFixture(t, []client.Object{grant("reader", nil)})
	f.reconcile(t, "reader")
	ctx := t.Context()
	g := &identityv1alpha1.GuestIdentityGrant{}
	if err := f.cl.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "reader"}, g); err != nil {
		t.Fatal(err)
	}
	g.Spec.Rules[0].Verbs = []string{"*"}
	g.Generation++
	if err := f.cl.Client.Update(ctx, g); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "reader")
	if c := f.ready(t, "reader"); c.Reason != identityv1alpha1.ReasonNotAdmitted {
		t.Errorf("Ready %s: %s", c.Reason, c.Message)
	}
	if _, err := f.ws.CoreV1().ServiceAccounts("default").Get(ctx, "knotless-guest-reader-uid", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the ServiceAccount of a grant no longer admitted: %v", err)
	}
}

// TestContractEndedRevokes: a granted grant whose contract ends (its
// tenant is released) loses its ServiceAccount, so a copy of its token
// stops working.
func TestContractEndedRevokes(t *testing.T) {
	f := newFixture(t, []client.Object{grant("reader", nil)})
	f.reconcile(t, "reader")
	ctx := t.Context()
	cc := &marketv1alpha1.ComputeContract{}
	if err := f.cl.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "web-0"}, cc); err != nil {
		t.Fatal(err)
	}
	cc.Status.Phase = marketv1alpha1.ContractCompleted
	if err := f.cl.Client.Status().Update(ctx, cc); err != nil {
		t.Fatal(err)
	}
	if res := f.reconcile(t, "reader"); res.RequeueAfter != 0 {
		t.Errorf("a grant of an ended contract is looked at again in %s, want on the contract's changes only", res.RequeueAfter)
	}
	if c := f.ready(t, "reader"); c.Reason != identityv1alpha1.ReasonTenantNotReady || !strings.Contains(c.Message, "not Active") {
		t.Errorf("Ready %s: %s", c.Reason, c.Message)
	}
	if _, err := f.ws.CoreV1().ServiceAccounts("default").Get(ctx, "knotless-guest-reader-uid", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the ServiceAccount of a grant whose contract ended: %v", err)
	}
}
