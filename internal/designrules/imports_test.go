package designrules

import (
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// module is the module path of knotless.
const module = "github.com/knotless-dev/knotless"

// imports returns, for each Go file below dir (tests included), the
// module-relative paths of the knotless packages it imports.
func imports(t *testing.T, dir string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") {
			return err
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		file := strings.TrimPrefix(filepath.ToSlash(p), root+"/")
		for _, imp := range f.Imports {
			ip, _ := strconv.Unquote(imp.Path.Value)
			if rel, ok := strings.CutPrefix(ip, module+"/"); ok {
				out[file] = append(out[file], rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// binaryPackages are the packages of one binary each: its commands and
// the mount shim, which only knotless-mountproxy serves.
func binaryPackage(rel string) bool {
	return rel == "mountproxy" || strings.HasPrefix(rel, "mountproxy/") || rel == "cmd" || strings.HasPrefix(rel, "cmd/")
}

// controllerImportsWaived are imports of one controller package by
// another's tests that the deal engine's rewrite (issue 28) removes.
var controllerImportsWaived = []string{
	"controllers/marketrequester/deal_test.go controllers/marketbidder",
}

// TestImportsGoDownTheLayers: the layers are cmd (one folder per binary)
// above controllers (one package per controller) and the mount shim above
// internal (what they share) above apis. No controller package imports
// another — what two controllers share is under internal/ — and nothing
// under internal/ imports a controller or a binary's package, so the
// shared code never depends on what it is shared by.
func TestImportsGoDownTheLayers(t *testing.T) {
	for file, imps := range imports(t, "controllers") {
		own := path.Dir(file)
		for _, rel := range imps {
			if strings.HasPrefix(rel, "controllers/") && !strings.HasPrefix(rel+"/", own+"/") && !slices.Contains(controllerImportsWaived, file+" "+rel) {
				t.Errorf("%s imports %s: a controller package imports no other controller package (move what they share under internal/)", file, rel)
			}
			if binaryPackage(rel) && rel != "mountproxy" {
				t.Errorf("%s imports %s, a binary's package", file, rel)
			}
		}
	}
	for file, imps := range imports(t, "mountproxy") {
		for _, rel := range imps {
			if strings.HasPrefix(rel, "controllers/") || strings.HasPrefix(rel, "cmd/") {
				t.Errorf("%s imports %s: the mount shim imports no controller or command", file, rel)
			}
		}
	}
	for file, imps := range imports(t, "internal") {
		for _, rel := range imps {
			if strings.HasPrefix(rel, "controllers/") || binaryPackage(rel) {
				t.Errorf("%s imports %s: nothing under internal/ imports a controller or a binary's package (move what it needs under internal/)", file, rel)
			}
		}
	}
}
