package designrules

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// root is the module's root, two levels above this package.
const root = "../.."

// sources parses the non-test, non-generated Go files below dirs.
func sources(t *testing.T, dirs ...string) map[string]*ast.File {
	t.Helper()
	out := map[string]*ast.File{}
	fset := token.NewFileSet()
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || strings.Contains(p, "zz_generated") {
				return err
			}
			f, err := parser.ParseFile(fset, p, nil, 0)
			out[strings.TrimPrefix(p, root+"/")] = f
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestEveryControllerIsRegisteredAndTested (R06): each package under
// controllers/ is imported by a command and has a test of its Reconcile.
func TestEveryControllerIsRegisteredAndTested(t *testing.T) {
	imported := map[string]bool{}
	for _, f := range sources(t, "cmd") {
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			imported[p] = true
		}
	}
	entries, err := os.ReadDir(filepath.Join(root, "controllers"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if !imported["github.com/knotless-dev/knotless/controllers/"+e.Name()] {
			t.Errorf("controllers/%s is registered by no command (R06)", e.Name())
		}
		tests, _ := filepath.Glob(filepath.Join(root, "controllers", e.Name(), "*_test.go"))
		reconciled := false
		for _, f := range tests {
			b, _ := os.ReadFile(f)
			reconciled = reconciled || strings.Contains(string(b), ".Reconcile(")
		}
		if !reconciled {
			t.Errorf("controllers/%s has no test that calls its Reconcile (R06)", e.Name())
		}
	}
}

// readOnlyTables are package-level variables that are lookup tables or
// API conventions, never written after initialisation.
var readOnlyTables = []string{
	"controllers/component/controller.go failedReasons",
	"mountproxy/server.go forwardMessages",
	"internal/netpolicy/netpolicy.go never",
	"internal/netpolicy/netpolicy.go embedding",
	"apis/apps/v1alpha1/groupversion_info.go GroupVersion",
	"apis/atproto/v1alpha1/groupversion_info.go GroupVersion",
	"apis/compute/v1alpha1/groupversion_info.go GroupVersion",
	"apis/gateway/v1alpha1/groupversion_info.go GroupVersion",
	"apis/identity/v1alpha1/groupversion_info.go GroupVersion",
	"apis/market/v1alpha1/groupversion_info.go GroupVersion",
	// The catalog of the embedded lexicons, built once from files compiled
	// into the binary and never changed.
	"internal/lexicon/lexicon.go loadCatalog",
	// Set by the linker (-ldflags -X), never written by the program.
	"cmd/internal/buildinfo/buildinfo.go Version",
	"cmd/internal/buildinfo/buildinfo.go Commit",
}

// TestNoPackageLevelMutableState (R11): no init functions, and
// package-level variables only for sentinel errors, parsed constants,
// embedded files, interface assertions and the read-only tables above.
func TestNoPackageLevelMutableState(t *testing.T) {
	for path, f := range sources(t, "cmd", "controllers", "internal", "mountproxy", "apis", "exports", "workspacetypes") {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == "init" {
				t.Errorf("%s: func init (R11)", path)
			}
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if n.Name == "_" || slices.Contains(readOnlyTables, path+" "+n.Name) {
						continue
					}
					if i < len(vs.Values) && constructor(vs.Values[i]) {
						continue
					}
					if i >= len(vs.Values) && strings.HasSuffix(path, "embed.go") {
						continue // //go:embed
					}
					t.Errorf("%s: package-level variable %s (R11): pass it as an argument or make it a constant", path, n.Name)
				}
			}
		}
	}
}

// constructor reports whether e builds an immutable value: a sentinel
// error or a parsed address.
func constructor(e ast.Expr) bool {
	c, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	s, ok := c.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, _ := s.X.(*ast.Ident)
	switch {
	case x == nil:
		return false
	case x.Name == "errors" && s.Sel.Name == "New":
		return true
	case x.Name == "netip" && strings.HasPrefix(s.Sel.Name, "MustParse"):
		return true
	}
	return false
}

// TestControllersReadNoAnnotations (R12): controllers signal each other
// through typed spec, status and conditions, never annotations.
func TestControllersReadNoAnnotations(t *testing.T) {
	for path, f := range sources(t, "controllers", "internal/suspend", "internal/mapping", "internal/predicates", "internal/tenant", "internal/repoconn", "internal/ssa",
		"internal/conditions", "internal/keyref", "internal/names") {
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.IndexExpr:
				if s, ok := x.X.(*ast.SelectorExpr); ok && s.Sel.Name == "Annotations" {
					t.Errorf("%s: reads an annotation (R12)", path)
				}
			case *ast.CallExpr:
				if s, ok := x.Fun.(*ast.SelectorExpr); ok && s.Sel.Name == "GetAnnotations" {
					t.Errorf("%s: reads annotations (R12)", path)
				}
			}
			return true
		})
	}
}
