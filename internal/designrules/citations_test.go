package designrules

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// codeSpan is a Markdown code span, which may wrap across lines.
	codeSpan = regexp.MustCompile("`([^`]+)`")
	// testName is a Go test, benchmark or fuzz target's name.
	testName = regexp.MustCompile(`^(Test|Benchmark|Fuzz)[A-Z0-9_]\w*$`)
)

// citedTests returns what docs/design-rules.md cites: for each code span
// that starts with a _test.go path, the path and the names after it;
// names cited without a path are listed under "".
func citedTests(t *testing.T) map[string][]string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(root, "docs", "design-rules.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, m := range codeSpan.FindAllStringSubmatch(string(doc), -1) {
		fields := strings.FieldsFunc(m[1], func(r rune) bool { return r == ',' || r == ' ' || r == '\n' })
		if len(fields) == 0 {
			continue
		}
		file := ""
		if strings.HasSuffix(fields[0], "_test.go") {
			file, fields = fields[0], fields[1:]
		}
		for _, f := range fields {
			if testName.MatchString(f) && f != "TestName" { // the intro's example
				out[file] = append(out[file], f)
			}
		}
	}
	return out
}

// testFuncs lists the top-level functions of every _test.go file of the
// module by path (relative to the module root).
func testFuncs(t *testing.T) map[string]map[string]bool {
	t.Helper()
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)\w*)\(`)
	out := map[string]map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "_artifacts" || strings.HasPrefix(d.Name(), ".")) && p != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(p, root+"/")
		out[rel] = map[string]bool{}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			out[rel][m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestEveryCitedTestExists: a rule is proved only by tests that exist;
// each `file TestName` of docs/design-rules.md names a function of that
// file, and a name cited without a file exists in some test file.
func TestEveryCitedTestExists(t *testing.T) {
	funcs := testFuncs(t)
	cited := citedTests(t)
	if len(cited) < 20 {
		t.Fatalf("found only %d cited files in docs/design-rules.md; is the citation format `path TestName` still used?", len(cited))
	}
	for file, names := range cited {
		for _, name := range names {
			if file != "" {
				if !funcs[file][name] {
					t.Errorf("docs/design-rules.md cites %s %s, which does not exist", file, name)
				}
				continue
			}
			found := false
			for _, fs := range funcs {
				found = found || fs[name]
			}
			if !found {
				t.Errorf("docs/design-rules.md cites %s, which no test file declares", name)
			}
		}
	}
}
