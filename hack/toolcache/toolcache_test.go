// Package toolcache tests hack/tool.sh, the one builder of pinned tools.
package toolcache

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

const repoRoot = "../.."

// toolModule writes a tool module with one tiny command, hello.
func toolModule(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":  "module example.com/hello\n\ngo 1.22\n",
		"go.sum":  "",
		"main.go": "package main\n\nfunc main() { println(\"hello\") }\n",
	}
	writeFiles(t, dir, files)
	return dir
}

// writeFiles writes each file of files (name: body) into dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// checkout copies hack/tool.sh into a new folder, as a clone would have it.
func checkout(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	script, err := os.ReadFile(filepath.Join(repoRoot, "hack", "tool.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "hack"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hack", "tool.sh"), script, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// run runs hack/tool.sh of a checkout with only env (plus PATH and Go's
// own caches) set, and returns what it printed.
func run(t *testing.T, checkout string, env []string, args ...string) string {
	t.Helper()
	out, err := runErr(t, checkout, env, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func runErr(t *testing.T, checkout string, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(checkout, "hack", "tool.sh"), args...)
	cmd.Dir = checkout
	goEnv := func(name string) string {
		out, err := exec.Command("go", "env", name).Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"GOCACHE=" + goEnv("GOCACHE"),
		"GOMODCACHE=" + goEnv("GOMODCACHE"),
		"GOFLAGS=-mod=mod",
	}, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("hack/tool.sh %v: %w\n%s", args, err, out)
	}
	return string(out), nil
}

// TestEntryPointsShareOneBuild: a tool built by one entry point (make
// test, say, in one checkout) is not built again by another (.ci/run in a
// fresh clone, or make dev): both find it in the user's cache.
func TestEntryPointsShareOneBuild(t *testing.T) {
	mod := toolModule(t)
	home := t.TempDir()
	env := []string{"HOME=" + home}
	first, second := checkout(t), checkout(t)

	if out := run(t, first, env, "--plan", mod+"=example.com/hello"); !strings.Contains(out, "will build hello") {
		t.Errorf("plan before any build: %q, want it to say hello will be built", out)
	}
	if out := run(t, first, env, mod, "example.com/hello"); !strings.Contains(out, "building hello") {
		t.Fatalf("first build printed %q, want a building line", out)
	}
	if out := run(t, second, env, mod, "example.com/hello"); strings.Contains(out, "building") {
		t.Errorf("a second checkout built the tool again:\n%s", out)
	}
	a, errA := filepath.EvalSymlinks(filepath.Join(first, "bin", "hello"))
	b, errB := filepath.EvalSymlinks(filepath.Join(second, "bin", "hello"))
	if errA != nil || errB != nil || a != b {
		t.Errorf("bin/hello of the two checkouts: %s (%v) and %s (%v), want one cached file", a, errA, b, errB)
	}
	if !strings.HasPrefix(a, filepath.Join(home, ".cache", "knotless", "tools")+"/") {
		t.Errorf("the build is in %s, want it under $HOME/.cache/knotless/tools", a)
	}
	if _, err := os.Stat(filepath.Join(home, ".cache", "knotless", "tools", ".timings", "hello")); err != nil {
		t.Errorf("the build's time was not kept: %v", err)
	}
	if out := run(t, second, env, "--plan", mod+"=example.com/hello"); !strings.Contains(out, "all cached") {
		t.Errorf("plan after the build: %q", out)
	}

	// XDG_CACHE_HOME moves the default; KNOTLESS_TOOLS_CACHE overrides both.
	xdg := t.TempDir()
	if out := run(t, first, append(env, "XDG_CACHE_HOME="+xdg), mod, "example.com/hello"); !strings.Contains(out, filepath.Join(xdg, "knotless", "tools")) {
		t.Errorf("with XDG_CACHE_HOME: %q", out)
	}
	own := t.TempDir()
	if out := run(t, first, append(env, "XDG_CACHE_HOME="+xdg, "KNOTLESS_TOOLS_CACHE="+own), mod, "example.com/hello"); !strings.Contains(out, own) {
		t.Errorf("with KNOTLESS_TOOLS_CACHE: %q", out)
	}
}

// TestNoEntryPointMovesTheCache: no script or Makefile target sets the
// cache folder to one of its own, so every entry point uses tool.sh's
// default (or the user's KNOTLESS_TOOLS_CACHE).
func TestNoEntryPointMovesTheCache(t *testing.T) {
	set := regexp.MustCompile(`KNOTLESS_TOOLS_CACHE\s*:?=|KNOTLESS_TOOLS_CACHE=\$\{KNOTLESS_TOOLS_CACHE:-[^}]*\}`)
	for _, f := range []string{"Makefile", ".ci/run", "hack/dev.sh", "hack/kind-e2e.sh", "hack/images.sh", "hack/chart-lint.sh"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		if m := set.Find(b); m != nil {
			t.Errorf("%s sets the tools cache (%q): leave the default to hack/tool.sh", f, m)
		}
	}
}

// TestConcurrentEntryPointsBuildOnce: two entry points asking for the same
// tool at once (make test in one checkout, .ci/run in another) build it
// once; the second waits for the first and finds it cached.
func TestConcurrentEntryPointsBuildOnce(t *testing.T) {
	mod := toolModule(t)
	env := []string{"HOME=" + t.TempDir()}
	checkouts := []string{checkout(t), checkout(t), checkout(t)}
	outs := make([]string, len(checkouts))
	var wg sync.WaitGroup
	for i, c := range checkouts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if outs[i], err = runErr(t, c, env, mod, "example.com/hello"); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	builds := 0
	for _, out := range outs {
		builds += strings.Count(out, "building hello")
	}
	if builds != 1 {
		t.Errorf("%d builds for %d concurrent callers, want 1:\n%s", builds, len(checkouts), fmt.Sprint(outs))
	}
}

// TestBuildsAreStatic: every tool is built with CGO_ENABLED=0, as knotless
// is (one compile of a shared package serves both; hack/kind-e2e.sh's kcp
// image is FROM scratch): no ELF interpreter even where a C compiler is
// installed and the caller asks for cgo.
func TestBuildsAreStatic(t *testing.T) {
	mod := toolModule(t)
	// net links cgo's resolver when cgo is on: a build with the caller's
	// CGO_ENABLED=1 would be dynamic.
	if err := os.WriteFile(filepath.Join(mod, "main.go"), []byte("package main\n\nimport \"net\"\n\nfunc main() { println(net.ParseIP(\"127.0.0.1\").String()) }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := checkout(t)
	run(t, c, []string{"HOME=" + t.TempDir(), "CGO_ENABLED=1"}, mod, "example.com/hello")
	bin, err := filepath.EvalSymlinks(filepath.Join(c, "bin", "hello"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has an ELF interpreter: not static", bin)
		}
	}
}

// TestBuildTags: a tool module's build-tags file is passed to go build
// (hack/tools/vault builds the minimal server) and is part of the cache
// key, so changing the tags builds again; a module without the file keeps
// the key of its go.mod and go.sum alone.
func TestBuildTags(t *testing.T) {
	mod := toolModule(t)
	files := map[string]string{
		"main.go": "package main\n\nfunc main() { println(flavour) }\n",
		"full.go": "//go:build !minimal\n\npackage main\n\nconst flavour = \"full\"\n",
		"min.go":  "//go:build minimal\n\npackage main\n\nconst flavour = \"minimal\"\n",
	}
	writeFiles(t, mod, files)
	env := []string{"HOME=" + t.TempDir()}
	c := checkout(t)
	flavour := func() string {
		out, err := exec.Command(filepath.Join(c, "bin", "hello")).CombinedOutput()
		if err != nil {
			t.Fatalf("bin/hello: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run(t, c, env, mod, "example.com/hello")
	if got := flavour(); got != "full" {
		t.Fatalf("without build-tags the tool printed %q, want full", got)
	}
	if err := os.WriteFile(filepath.Join(mod, "build-tags"), []byte("minimal\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := run(t, c, env, mod, "example.com/hello"); !strings.Contains(out, "building hello") || !strings.Contains(out, "with tags minimal") {
		t.Fatalf("after build-tags was written the build printed %q, want a new build that names its tags", out)
	}
	if got := flavour(); got != "minimal" {
		t.Errorf("with build-tags minimal the tool printed %q, want minimal", got)
	}
}
