package exports_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apisv1alpha1 "github.com/kcp-dev/sdk/apis/apis/v1alpha1"
	apisv1alpha2 "github.com/kcp-dev/sdk/apis/apis/v1alpha2"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"

	"github.com/knotless-dev/knotless/exports"
)

// TestExportsAreCurrent: the APIResourceSchemas in exports/ are what kcp's
// apigen would make of the CRDs controller-gen wrote to apis/crds, and the
// one APIExport serves exactly them. apigen converts each CRD with the
// kcp SDK's CRDToAPIResourceSchema and keeps the schema already in exports/
// when its spec is the same (its JSON schemas compared by value, not by
// their bytes); this test converts the same way and compares the same way.
// make verify runs it after controller-gen instead of running apigen, so
// CI need not build apigen (about 1300 packages, a quarter of a cold run's
// tool builds); make generate still runs apigen to write the files.
func TestExportsAreCurrent(t *testing.T) {
	crds, err := filepath.Glob("../apis/crds/*.yaml")
	if err != nil || len(crds) == 0 {
		t.Fatalf("no CRDs in apis/crds (%v): run make generate", err)
	}
	want := map[string]string{} // exported schema file -> its CRD
	for _, path := range crds {
		crd := readYAML[apiextensionsv1.CustomResourceDefinition](t, os.ReadFile, path)
		converted, err := apisv1alpha1.CRDToAPIResourceSchema(&crd, "current")
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		file := "apiresourceschema-" + crd.Spec.Names.Plural + "." + crd.Spec.Group + ".yaml"
		want[file] = path
		if _, err := fs.Stat(exports.FS, file); err != nil {
			t.Errorf("%s has no exported schema %s: run make generate", path, file)
			continue
		}
		exported := readYAML[apisv1alpha1.APIResourceSchema](t, exports.FS.ReadFile, file)
		if !sameSpec(t, exported.Spec, converted.Spec) {
			t.Errorf("%s is stale: apigen would make another spec of %s: run make generate", file, path)
		}
	}
	files, err := fs.Glob(exports.FS, "apiresourceschema-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var served []string
	for _, f := range files {
		if _, ok := want[f]; !ok {
			t.Errorf("%s has no CRD in apis/crds: remove it", f)
			continue
		}
		s := readYAML[apisv1alpha1.APIResourceSchema](t, exports.FS.ReadFile, f)
		served = append(served, s.Spec.Group+"/"+s.Spec.Names.Plural+"="+s.Name)
	}
	exps, err := fs.Glob(exports.FS, "apiexport-*.yaml")
	if err != nil || len(exps) != 1 {
		t.Fatalf("exports/ has the APIExports %v (%v), want one", exps, err)
	}
	export := readYAML[apisv1alpha2.APIExport](t, exports.FS.ReadFile, exps[0])
	var listed []string
	for _, r := range export.Spec.Resources {
		listed = append(listed, r.Group+"/"+r.Name+"="+r.Schema)
	}
	slices.Sort(served)
	slices.Sort(listed)
	if !slices.Equal(served, listed) {
		t.Errorf("%s serves\n  %s\nwant the exported schemas\n  %s\nrun make generate", exps[0], strings.Join(listed, "\n  "), strings.Join(served, "\n  "))
	}
}

// sameSpec compares two schema specs as apigen does: every field by value,
// and each version's JSON schema after decoding it.
func sameSpec(t *testing.T, a, b apisv1alpha1.APIResourceSchemaSpec) bool {
	t.Helper()
	if len(a.Versions) != len(b.Versions) {
		return false
	}
	a, b = *a.DeepCopy(), *b.DeepCopy()
	for i := range a.Versions {
		var pa, pb apiextensionsv1.JSONSchemaProps
		if err := json.Unmarshal(a.Versions[i].Schema.Raw, &pa); err != nil {
			t.Fatalf("the exported schema of %s: %v", a.Names.Plural, err)
		}
		if err := json.Unmarshal(b.Versions[i].Schema.Raw, &pb); err != nil {
			t.Fatalf("the converted schema of %s: %v", b.Names.Plural, err)
		}
		if !apiequality.Semantic.DeepEqual(pa, pb) {
			return false
		}
		a.Versions[i].Schema.Raw, b.Versions[i].Schema.Raw = nil, nil
	}
	return apiequality.Semantic.DeepEqual(a, b)
}

func readYAML[T any](t *testing.T, read func(string) ([]byte, error), name string) T {
	t.Helper()
	var v T
	raw, err := read(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(raw, &v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}
