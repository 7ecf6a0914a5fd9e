package guestadmission

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kcp-dev/logicalcluster/v3"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	identityv1alpha1 "github.com/knotless-dev/knotless/apis/identity/v1alpha1"
)

var key = []byte("0123456789abcdef0123456789abcdef")

func grant(cluster string, mut func(*identityv1alpha1.GuestIdentityGrant)) *identityv1alpha1.GuestIdentityGrant {
	g := &identityv1alpha1.GuestIdentityGrant{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "reader",
		Annotations: map[string]string{logicalcluster.AnnotationKey: cluster}},
		Spec: identityv1alpha1.GuestIdentityGrantSpec{ContractRef: identityv1alpha1.ContractRef{Name: "web-0"},
			Guest: identityv1alpha1.Guest{Namespace: "guests", ServiceAccount: "reader"}, SecretName: "kcp",
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"apps.knotless.dev"}, Resources: []string{"applications"}, Verbs: []string{"get"}}}}}
	if mut != nil {
		mut(g)
	}
	return g
}

func request(op admissionv1.Operation, user string, obj, old *identityv1alpha1.GuestIdentityGrant) admission.Request {
	raw := func(g *identityv1alpha1.GuestIdentityGrant) runtime.RawExtension {
		if g == nil {
			return runtime.RawExtension{}
		}
		b, _ := json.Marshal(g)
		return runtime.RawExtension{Raw: b}
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: op, Namespace: "default", Name: "reader",
		UserInfo: authenticationv1.UserInfo{Username: user}, Object: raw(obj), OldObject: raw(old)}}
}

// stamped applies the response's patch of the stamp to g.
func stamped(t *testing.T, g *identityv1alpha1.GuestIdentityGrant, resp admission.Response) *identityv1alpha1.GuestIdentityGrant {
	t.Helper()
	g = g.DeepCopy()
	for _, p := range resp.Patches {
		if p.Path == "/spec/admissionStamp" {
			v, _ := p.Value.(string) // a remove has no value
			g.Spec.AdmissionStamp = v
		}
	}
	return g
}

func TestHandler(t *testing.T) {
	var asked []string
	h := &Handler{Key: key, Check: func(_ context.Context, cluster, ns string, user authenticationv1.UserInfo, spec *identityv1alpha1.GuestIdentityGrantSpec) error {
		asked = append(asked, cluster+"/"+ns+"/"+user.Username)
		if user.Username == "mallory" {
			return errors.New(`it gives more than you may give in namespace default: roles.rbac.authorization.k8s.io is forbidden: user "mallory" is attempting to grant RBAC permissions not currently held`)
		}
		return nil
	}}
	ctx := context.Background()

	// bob may give what he asks: admitted and stamped for this workspace.
	g := grant("ws1", nil)
	resp := h.Handle(ctx, request(admissionv1.Create, "bob", g, nil))
	if !resp.Allowed {
		t.Fatalf("bob's grant refused: %v", resp.Result)
	}
	admitted := stamped(t, g, resp)
	if !Admitted(key, "ws1", admitted) {
		t.Fatal("the admitted grant does not carry its stamp")
	}
	if Admitted(key, "ws2", admitted) {
		t.Error("the stamp of workspace ws1 is valid in ws2")
	}
	if Admitted([]byte("another key of thirty-two bytes!"), "ws1", admitted) {
		t.Error("the stamp is valid under another key")
	}
	changed := admitted.DeepCopy()
	changed.Spec.Rules[0].Verbs = []string{"*"}
	if Admitted(key, "ws1", changed) {
		t.Error("a stamp stays valid for a changed spec")
	}
	if len(asked) != 1 || asked[0] != "ws1/default/bob" {
		t.Errorf("checked %v, want bob in ws1/default", asked)
	}

	// mallory may not: refused with kcp's reason, nothing stamped.
	resp = h.Handle(ctx, request(admissionv1.Create, "mallory", g, nil))
	if resp.Allowed || !strings.Contains(resp.Result.Message, "gives more than you may give") || !strings.Contains(resp.Result.Message, "not currently held") {
		t.Errorf("mallory's grant: allowed %v, %v", resp.Allowed, resp.Result)
	}

	// A change that keeps an admitted spec (the controller's finalizer)
	// is not checked again, whoever makes it.
	asked = nil
	withFinalizer := admitted.DeepCopy()
	withFinalizer.Finalizers = []string{"x"}
	if resp = h.Handle(ctx, request(admissionv1.Update, "mallory", withFinalizer, admitted)); !resp.Allowed || len(asked) != 0 {
		t.Errorf("a finalizer on an admitted grant: allowed %v, checked %v", resp.Allowed, asked)
	}
	// mallory's change of the spec is checked as mallory.
	if resp = h.Handle(ctx, request(admissionv1.Update, "mallory", changed, admitted)); resp.Allowed {
		t.Error("mallory changed bob's admitted grant's rules")
	}
	// An update that changes nothing but the stamp keeps the stored one:
	// a forged stamp does not stick, and a grant without a valid stamp
	// stays without one (the controller does not serve it).
	forged := admitted.DeepCopy()
	forged.Spec.AdmissionStamp = "forged"
	asked = nil
	resp = h.Handle(ctx, request(admissionv1.Update, "mallory", forged, admitted))
	if !resp.Allowed || len(asked) != 0 || !Admitted(key, "ws1", stamped(t, forged, resp)) {
		t.Errorf("a forged stamp over an admitted one: allowed %v, checked %v, admitted after %v", resp.Allowed, asked, Admitted(key, "ws1", stamped(t, forged, resp)))
	}
	unstamped := g.DeepCopy()
	resp = h.Handle(ctx, request(admissionv1.Update, "mallory", forged, unstamped))
	if !resp.Allowed || Admitted(key, "ws1", stamped(t, forged, resp)) {
		t.Errorf("a forged stamp on a grant that had none: allowed %v, admitted after %v", resp.Allowed, Admitted(key, "ws1", stamped(t, forged, resp)))
	}
	// The workspace is the stored object's.
	moved := admitted.DeepCopy()
	moved.Annotations[logicalcluster.AnnotationKey] = "ws2"
	moved.Spec.Rules[0].Verbs = []string{"list"}
	if resp = h.Handle(ctx, request(admissionv1.Update, "bob", moved, admitted)); resp.Allowed {
		t.Error("an update moved the grant's workspace annotation")
	}
	// A generated name cannot be stamped.
	if resp = h.Handle(ctx, request(admissionv1.Create, "bob", grant("ws1", func(g *identityv1alpha1.GuestIdentityGrant) { g.Name, g.GenerateName = "", "r-" }), nil)); resp.Allowed {
		t.Error("a grant with generateName was admitted")
	}

	// Bad specs are refused before kcp is asked.
	for name, mut := range map[string]func(*identityv1alpha1.GuestIdentityGrant){
		"neither": func(g *identityv1alpha1.GuestIdentityGrant) { g.Spec.Rules = nil },
		"both":    func(g *identityv1alpha1.GuestIdentityGrant) { g.Spec.ClusterRole = "view" },
		"urls":    func(g *identityv1alpha1.GuestIdentityGrant) { g.Spec.Rules[0].NonResourceURLs = []string{"/healthz"} },
		"verbs":   func(g *identityv1alpha1.GuestIdentityGrant) { g.Spec.Rules[0].Verbs = nil },
	} {
		asked = nil
		if resp = h.Handle(ctx, request(admissionv1.Create, "bob", grant("ws1", mut), nil)); resp.Allowed || len(asked) != 0 {
			t.Errorf("%s: allowed %v, checked %v", name, resp.Allowed, asked)
		}
	}
	// No workspace annotation: refused.
	if resp = h.Handle(ctx, request(admissionv1.Create, "bob", grant("", nil), nil)); resp.Allowed {
		t.Error("a grant naming no workspace was admitted")
	}
	if resp = h.Handle(ctx, request(admissionv1.Create, "bob", grant("../ws2", nil), nil)); resp.Allowed {
		t.Error("a grant naming a workspace that is no logical cluster was admitted")
	}
}

func TestPermissions(t *testing.T) {
	got, err := Permissions("default", []rbacv1.PolicyRule{
		{APIGroups: []string{"", "apps"}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
		{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "update"}, ResourceNames: []string{"a"}},
		{NonResourceURLs: []string{"/healthz"}, Verbs: []string{"get"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range got {
		names = append(names, describe(p))
	}
	want := []string{"get pods/log", "get pods.apps/log", "* *.*", "get configmaps named a", "update configmaps named a"}
	if strings.Join(names, ", ") != strings.Join(want, ", ") {
		t.Errorf("permissions %q, want %q", names, want)
	}
	for _, p := range got {
		if p.Namespace != "default" {
			t.Errorf("%s in namespace %q", describe(p), p.Namespace)
		}
	}
	many := rbacv1.PolicyRule{APIGroups: []string{"a", "b", "c", "d"}, Resources: []string{"r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "escalate"}}
	if _, err := Permissions("default", []rbacv1.PolicyRule{many}); err == nil || !strings.Contains(err.Error(), "more than 256") {
		t.Errorf("288 permissions: %v", err)
	}
}

func TestPathFor(t *testing.T) {
	p := PathFor(key)
	if !strings.HasPrefix(p, PathPrefix) || len(p) < len(PathPrefix)+40 || p != PathFor(append([]byte(nil), key...)) {
		t.Errorf("path %q: want the prefix and a secret of 43 characters, the same for the same key", p)
	}
	if PathFor([]byte("another key of thirty-two bytes!")) == p {
		t.Error("two keys give one path")
	}
}

// TestHandlerMalformed: what a hostile or broken caller sends is refused
// with an error or a denial, never a panic and never a stamp.
func TestHandlerMalformed(t *testing.T) {
	h := &Handler{Key: key, Check: func(context.Context, string, string, authenticationv1.UserInfo, *identityv1alpha1.GuestIdentityGrantSpec) error {
		return nil
	}}
	good, _ := json.Marshal(grant("ws1", nil))
	noAnn, _ := json.Marshal(grant("ws1", func(g *identityv1alpha1.GuestIdentityGrant) { g.Annotations = nil }))
	badCluster, _ := json.Marshal(grant("../ws1", nil))
	for name, tc := range map[string]struct {
		op       admissionv1.Operation
		obj, old []byte
	}{
		"no object":              {op: admissionv1.Create},
		"garbage object":         {op: admissionv1.Create, obj: []byte("{not json")},
		"a JSON array":           {op: admissionv1.Create, obj: []byte(`[1,2]`)},
		"null":                   {op: admissionv1.Create, obj: []byte(`null`)},
		"spec of the wrong type": {op: admissionv1.Create, obj: []byte(`{"metadata":{"name":"x"},"spec":"all"}`)},
		"no annotations":         {op: admissionv1.Create, obj: noAnn},
		"an invalid workspace":   {op: admissionv1.Create, obj: badCluster},
		"garbage old object":     {op: admissionv1.Update, obj: good, old: []byte("\x00\xff")},
		"no old object":          {op: admissionv1.Update, obj: good},
		"old without workspace":  {op: admissionv1.Update, obj: good, old: noAnn},
	} {
		t.Run(name, func(t *testing.T) {
			req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: tc.op, Namespace: "default", Name: "reader",
				UserInfo: authenticationv1.UserInfo{Username: "bob"}, Object: runtime.RawExtension{Raw: tc.obj}, OldObject: runtime.RawExtension{Raw: tc.old}}}
			resp := h.Handle(context.Background(), req)
			if resp.Allowed {
				t.Fatalf("allowed (patches %v)", resp.Patches)
			}
			if resp.Result == nil || resp.Result.Message == "" {
				t.Fatal("refused without saying why")
			}
		})
	}
}
