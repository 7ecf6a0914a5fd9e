package designrules

import (
	"bytes"
	"go/ast"
	"go/printer"
	"go/token"
	"path"
	"slices"
	"strings"
	"testing"
)

// copiedInTheMarketWing are the helpers the market bidder and requester
// still each have a copy of; the deal engine's rewrite of the market wing
// (issue 28) removes them, and with them this list.
var copiedInTheMarketWing = []string{}

// TestNoHelperIsCopiedBetweenControllers: a function whose body is the
// same in two controller packages belongs once under internal/ (clock,
// conditions, engage.Key, market.Connect, ...), so that a fix reaches
// every controller.
func TestNoHelperIsCopiedBetweenControllers(t *testing.T) {
	fset := token.NewFileSet()
	where := map[string][]string{} // body -> "file func" in each package
	for file, f := range sources(t, "controllers") {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil || len(fd.Body.List) == 0 {
				continue
			}
			var b bytes.Buffer
			if err := printer.Fprint(&b, fset, fd.Body); err != nil {
				t.Fatal(err)
			}
			where[b.String()] = append(where[b.String()], file+" "+fd.Name.Name)
		}
	}
	for _, copies := range where {
		pkgs := map[string]bool{}
		for _, c := range copies {
			if !slices.Contains(copiedInTheMarketWing, c) {
				pkgs[path.Dir(strings.Fields(c)[0])] = true
			}
		}
		if len(pkgs) > 1 {
			slices.Sort(copies)
			t.Errorf("the same function in %d controller packages (move it to internal/): %s", len(pkgs), strings.Join(copies, ", "))
		}
	}
}
