package apis_test

import (
	"io/fs"
	"strings"
	"testing"

	apisv1alpha1 "github.com/kcp-dev/sdk/apis/apis/v1alpha1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/knotless-dev/knotless/apis"
	"github.com/knotless-dev/knotless/exports"
)

// TestEveryExportedSchemaHasARegisteredType enforces R14: every
// APIResourceSchema in exports/ has a Go type registered in the scheme, with
// a generated DeepCopyObject, and every registered knotless kind is
// exported.
func TestEveryExportedSchemaHasARegisteredType(t *testing.T) {
	s := apis.NewScheme()
	files, err := fs.Glob(exports.FS, "apiresourceschema-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("exports/ has no APIResourceSchema")
	}
	exported := map[schema.GroupVersionKind]bool{}
	for _, f := range files {
		raw, err := fs.ReadFile(exports.FS, f)
		if err != nil {
			t.Fatal(err)
		}
		var ars apisv1alpha1.APIResourceSchema
		if err := yaml.UnmarshalStrict(raw, &ars); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, v := range ars.Spec.Versions {
			for _, kind := range []string{ars.Spec.Names.Kind, ars.Spec.Names.ListKind} {
				gvk := schema.GroupVersionKind{Group: ars.Spec.Group, Version: v.Name, Kind: kind}
				exported[gvk] = true
				obj, err := s.New(gvk)
				if err != nil {
					t.Errorf("%s: %s has no registered Go type: %v", f, gvk, err)
					continue
				}
				// DeepCopyObject must be the generated one: a copy is a new
				// object of the same type.
				if cp := obj.DeepCopyObject(); cp == obj || cp == nil {
					t.Errorf("%s: DeepCopyObject of %s does not copy", f, gvk)
				}
			}
		}
	}
	for gvk := range s.AllKnownTypes() {
		if strings.HasSuffix(gvk.Group, ".knotless.dev") && gvk.Version != "__internal" &&
			!strings.HasSuffix(gvk.Kind, "Options") && gvk.Kind != "WatchEvent" && !exported[gvk] {
			t.Errorf("%s is registered but not exported (run make generate)", gvk)
		}
	}
}
