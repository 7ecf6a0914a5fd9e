package designrules

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// tableRow is a row of docs/controllers.md's "Where each controller
// runs": | `controller` | `binary` | workspace |.
var tableRow = regexp.MustCompile("^\\| `([a-z0-9]+)` \\| `(knotless-[a-z]+)` \\| [^|]+ \\|$")

// TestControllersTableMatchesTheCommands (R06): the table of
// docs/controllers.md names, for each package under controllers/, the
// binary whose cmd/<binary>/main.go imports it, and no other.
func TestControllersTableMatchesTheCommands(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, "docs", "controllers.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string][]string{} // controller -> binaries
	for _, line := range strings.Split(string(doc), "\n") {
		if m := tableRow.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			documented[m[1]] = append(documented[m[1]], m[2])
		}
	}
	if len(documented) == 0 {
		t.Fatal("docs/controllers.md has no table of where each controller runs")
	}

	imported := map[string][]string{} // controller -> binaries
	mains, err := filepath.Glob(filepath.Join(root, "cmd", "*", "*.go"))
	if err != nil || len(mains) == 0 {
		t.Fatalf("no cmd/*/*.go: %v", err)
	}
	mains = slices.DeleteFunc(mains, func(p string) bool { return strings.HasSuffix(p, "_test.go") })
	fset := token.NewFileSet()
	for _, main := range mains {
		f, err := parser.ParseFile(fset, main, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		binary := filepath.Base(filepath.Dir(main))
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if c, ok := strings.CutPrefix(p, module+"/controllers/"); ok {
				imported[c] = append(imported[c], binary)
			}
		}
	}

	entries, err := os.ReadDir(filepath.Join(root, "controllers"))
	if err != nil {
		t.Fatal(err)
	}
	var controllers []string
	for _, e := range entries {
		if e.IsDir() {
			controllers = append(controllers, e.Name())
		}
	}
	for c := range documented {
		if !slices.Contains(controllers, c) {
			t.Errorf("docs/controllers.md lists %s, which is no package under controllers/", c)
		}
	}
	for _, c := range controllers {
		doc, cmd := slices.Sorted(slices.Values(documented[c])), slices.Sorted(slices.Values(imported[c]))
		if !slices.Equal(doc, cmd) {
			t.Errorf("controllers/%s runs in %v by docs/controllers.md, but is imported by the package main of %v", c, doc, cmd)
		}
	}
}
