package apis_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/knotless-dev/knotless/apis"
)

// TestExamplesDecode: every object of docs/examples decodes strictly into
// its registered type, so a renamed or misspelt field in an example fails
// here rather than for a user.
func TestExamplesDecode(t *testing.T) {
	s := apis.NewScheme()
	files, err := filepath.Glob("../docs/examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(raw), "\n---\n") {
			var tm struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil || tm.Kind == "" {
				t.Errorf("%s #%d: no kind (%v)", f, i, err)
				continue
			}
			gv, err := schema.ParseGroupVersion(tm.APIVersion)
			if err != nil {
				t.Errorf("%s #%d: %v", f, i, err)
				continue
			}
			obj, err := s.New(gv.WithKind(tm.Kind))
			if err != nil {
				t.Errorf("%s #%d: %v", f, i, err)
				continue
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Errorf("%s #%d (%s): %v", f, i, tm.Kind, err)
			}
		}
	}
}
