package bootstrap

import (
	"slices"
	"testing"

	apisv1alpha2 "github.com/kcp-dev/sdk/apis/apis/v1alpha2"
	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/knotless-dev/knotless/exports"
	"github.com/knotless-dev/knotless/workspacetypes"
)

// allows says whether rules let verb act on resource (and subresource)
// of group.
func allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		in := func(list []string, v string) bool { return slices.Contains(list, "*") || slices.Contains(list, v) }
		if in(r.APIGroups, group) && in(r.Resources, resource) && in(r.Verbs, verb) && len(r.ResourceNames) == 0 {
			return true
		}
	}
	return false
}

// The export's maximal permission policy lets a workspace's users do
// anything with every kind knotless serves, but create a StateSync: a
// StateSync makes the agent export or import a tenant as its admin, so
// only the provider (knotless:provider, bound to its own identity)
// creates one. An export without the policy would leave that to each
// workspace's own RBAC, which its owner controls.
func TestOnlyTheProviderCreatesStateSyncs(t *testing.T) {
	_, exps, err := readExports(exports.FS)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := readDir(workspacetypes.FS)
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string][]rbacv1.PolicyRule{}
	bound := map[string][]rbacv1.Subject{}
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRole":
			var r rbacv1.ClusterRole
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
				t.Fatal(err)
			}
			roles[r.Name] = r.Rules
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b); err != nil {
				t.Fatal(err)
			}
			bound[b.RoleRef.Name] = b.Subjects
		}
	}
	everyone := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "Group", Name: "apis.kcp.io:binding:system:authenticated"}}
	if !slices.Equal(bound["knotless:maximal-permissions"], everyone) {
		t.Fatalf("knotless:maximal-permissions is bound to %v, want %v", bound["knotless:maximal-permissions"], everyone)
	}
	verbs := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
	for _, obj := range exps {
		if err := addStandardClaims(obj); err != nil {
			t.Fatal(err)
		}
		var e apisv1alpha2.APIExport
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &e); err != nil {
			t.Fatal(err)
		}
		if p := e.Spec.MaximalPermissionPolicy; p == nil || p.Local == nil {
			t.Fatalf("APIExport %s has no local maximal permission policy", e.Name)
		}
		for _, r := range e.Spec.Resources {
			for _, res := range []string{r.Name, r.Name + "/status"} {
				for _, v := range verbs {
					want := !(res == "statesyncs" && v == "create")
					if got := allows(roles["knotless:maximal-permissions"], r.Group, res, v); got != want {
						t.Errorf("a workspace's users may %s %s.%s: %v, want %v", v, res, r.Group, got, want)
					}
				}
			}
		}
	}
	if !allows(roles[ProviderRole], "compute.knotless.dev", "statesyncs", "create") {
		t.Errorf("%s does not let the provider create StateSyncs", ProviderRole)
	}
}

// The provider's binding names it as kcp's maximal permission policy
// checks it.
func TestPolicyUser(t *testing.T) {
	for _, tc := range []struct {
		u    authenticationv1.UserInfo
		want string
	}{
		{authenticationv1.UserInfo{Username: "knotless"}, "apis.kcp.io:binding:knotless"},
		{authenticationv1.UserInfo{Username: "system:serviceaccount:ops:knotless", Extra: map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/cluster-name": {"2x7uf0bml0q9ms3b"}}},
			"apis.kcp.io:binding:system:kcp:serviceaccount:2x7uf0bml0q9ms3b:ops:knotless"},
	} {
		if got := PolicyUser(tc.u); got != tc.want {
			t.Errorf("PolicyUser(%s) = %q, want %q", tc.u.Username, got, tc.want)
		}
	}
}
