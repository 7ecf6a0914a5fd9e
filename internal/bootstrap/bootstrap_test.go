package bootstrap

import (
	"testing"
	"testing/fstest"

	apisv1alpha2 "github.com/kcp-dev/sdk/apis/apis/v1alpha2"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/knotless-dev/knotless/exports"
	"github.com/knotless-dev/knotless/workspacetypes"
)

func TestBaseURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://127.0.0.1:6443/clusters/root":          "https://127.0.0.1:6443",
		"https://127.0.0.1:6443/clusters/root:knotless": "https://127.0.0.1:6443",
		"https://kcp.example/prefix/clusters/root":      "https://kcp.example/prefix",
		"https://127.0.0.1:6443/":                       "https://127.0.0.1:6443",
	} {
		got, err := BaseURL(in)
		if err != nil || got != want {
			t.Errorf("BaseURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "127.0.0.1:6443", "::"} {
		if _, err := BaseURL(bad); err == nil {
			t.Errorf("BaseURL(%q) accepted", bad)
		}
	}
}

func TestEmbeddedExportsGetTheStandardClaims(t *testing.T) {
	schemas, exps, err := readExports(exports.FS)
	if err != nil {
		t.Fatal(err)
	}
	if len(schemas) == 0 || len(exps) == 0 {
		t.Fatalf("%d schemas, %d exports embedded", len(schemas), len(exps))
	}
	for _, obj := range exps {
		if err := addStandardClaims(obj); err != nil {
			t.Fatal(err)
		}
		export := &apisv1alpha2.APIExport{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, export); err != nil {
			t.Fatal(err)
		}
		have := map[string]bool{}
		for _, c := range export.Spec.PermissionClaims {
			have[c.Group+"/"+c.Resource] = len(c.Verbs) > 0
		}
		for _, want := range []string{"/secrets", "/configmaps", "/events", "events.k8s.io/events"} {
			if !have[want] {
				t.Errorf("export %s lacks claim %s", export.Name, want)
			}
		}
	}
}

func TestClaimsInYAMLWin(t *testing.T) {
	objs, err := readDir(fstest.MapFS{"apiexport-x.yaml": {Data: []byte(`apiVersion: apis.kcp.io/v1alpha2
kind: APIExport
metadata: {name: x}
spec:
  permissionClaims:
  - {group: "", resource: secrets, verbs: ["*"]}
`)}})
	if err != nil || len(objs) != 1 {
		t.Fatalf("%v %d", err, len(objs))
	}
	if err := addStandardClaims(objs[0]); err != nil {
		t.Fatal(err)
	}
	export := &apisv1alpha2.APIExport{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(objs[0].Object, export); err != nil {
		t.Fatal(err)
	}
	if n := len(export.Spec.PermissionClaims); n != len(StandardClaims()) {
		t.Fatalf("want %d claims, got %d", len(StandardClaims()), n)
	}
	if v := export.Spec.PermissionClaims[0].Verbs; len(v) != 1 || v[0] != "*" {
		t.Fatalf("the YAML's secrets claim was replaced: %v", v)
	}
}

func TestWorkspaceTypesBindOnlyExportsThatShip(t *testing.T) {
	_, exps, err := readExports(exports.FS)
	if err != nil {
		t.Fatal(err)
	}
	shipped := map[string]bool{}
	for _, e := range exps {
		shipped[e.GetName()] = true
	}
	objs, err := readDir(workspacetypes.FS)
	if err != nil {
		t.Fatal(err)
	}
	types := 0
	for _, o := range objs {
		if o.GetKind() != "WorkspaceType" {
			continue
		}
		types++
		refs, _, _ := unstructured.NestedSlice(o.Object, "spec", "defaultAPIBindings")
		for _, r := range refs {
			ref := r.(map[string]any)
			if p, _ := ref["path"].(string); p != "" {
				t.Errorf("WorkspaceType %s binds %v by path: types bind exports of their own workspace (R15)", o.GetName(), ref)
			}
			if !shipped[ref["export"].(string)] {
				t.Errorf("WorkspaceType %s binds export %v, which knotless does not ship", o.GetName(), ref["export"])
			}
		}
	}
	if types == 0 {
		t.Fatal("no WorkspaceType embedded")
	}
}
