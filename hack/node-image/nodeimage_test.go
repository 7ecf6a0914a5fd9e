// Package nodeimage tests hack/node-image/build.sh's cache keys: the node
// image's tag must change with every input it is built from, and only then
// (a second `make node-image` with the same inputs is a no-op).
package nodeimage

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const repoRoot = "../.."

// checkout copies what build.sh reads into a temporary tree laid out like
// the repository.
func checkout(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	copyTree(t, filepath.Join(repoRoot, "hack/node-image"), filepath.Join(dir, "hack/node-image"))
	for _, m := range []string{"kubernetes", "etcd", "coredns"} {
		copyTree(t, filepath.Join(repoRoot, "hack/tools", m), filepath.Join(dir, "hack/tools", m))
	}
	return dir
}

func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.Walk(from, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		if info.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		copyFile(t, p, filepath.Join(to, rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, info.Mode().Perm()); err != nil {
		t.Fatal(err)
	}
}

func buildSh(t *testing.T, dir, cache string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(dir, "hack/node-image/build.sh"), args...)
	cmd.Env = append(os.Environ(), "KNOTLESS_TOOLS_CACHE="+cache)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("build.sh %v: %v\n%s%s", args, err, out, stderr)
	}
	return strings.TrimSpace(string(out))
}

func appendTo(t *testing.T, path, text string) (restore func()) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(append([]byte{}, b...), text...), 0o644); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEveryInputChangesTheTag: the tag is stable for the same inputs and
// changes when any input changes: a node file, the root filesystem recipe,
// a tool module's pins, nodenet's source, the kube-proxy image's wrapper,
// the way a Go part is built. A test file of nodenet is not an input.
func TestEveryInputChangesTheTag(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go")
	}
	dir := checkout(t)
	cache := t.TempDir()
	base := buildSh(t, dir, cache, "--print-image")
	if !strings.HasPrefix(base, "knotless.dev/node:v1.36.3-") {
		t.Fatalf("tag %q, want knotless.dev/node:v1.36.3-<key>", base)
	}
	if again := buildSh(t, dir, cache, "--print-image"); again != base {
		t.Fatalf("same inputs, two tags: %s and %s", base, again)
	}
	for _, c := range []struct {
		file string
		same bool
	}{
		{file: "hack/node-image/files/etc/default/kubelet"},
		{file: "hack/node-image/files/usr/local/bin/entrypoint"},
		{file: "hack/node-image/rootfs.sh"},
		{file: "hack/node-image/images/iptables-wrapper"},
		{file: "hack/node-image/nodenet/main.go"},
		{file: "hack/tools/kubernetes/go.sum"},
		{file: "hack/tools/etcd/go.sum"},
		{file: "hack/tools/coredns/go.sum"},
		{file: "hack/tools/coredns/main.go"},
		{file: "hack/node-image/nodenet/main_test.go", same: true},
	} {
		restore := appendTo(t, filepath.Join(dir, c.file), "\n")
		got := buildSh(t, dir, cache, "--print-image")
		restore()
		if (got == base) != c.same {
			t.Errorf("after changing %s the tag is %s (before %s); want it %s", c.file, got, base,
				map[bool]string{true: "unchanged", false: "changed"}[c.same])
		}
	}
	// A Go file added to CoreDNS's tool module (a plugin, say) is an input.
	extra := filepath.Join(dir, "hack/tools/coredns/extra.go")
	if err := os.WriteFile(extra, []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := buildSh(t, dir, cache, "--print-image"); got == base {
		t.Errorf("after adding %s the tag is unchanged (%s)", extra, got)
	}
	if err := os.Remove(extra); err != nil {
		t.Fatal(err)
	}
	if again := buildSh(t, dir, cache, "--print-image"); again != base {
		t.Errorf("inputs restored, tag %s, want %s", again, base)
	}

	// The recipe is an input too: how the Go parts are built.
	script := filepath.Join(dir, "hack/node-image/build.sh")
	b, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(string(b), "CGO_ENABLED=0 nice", "CGO_ENABLED=1 nice", 1)
	if changed == string(b) {
		t.Fatal("build.sh has no CGO_ENABLED=0 go build any more; update this test")
	}
	if err := os.WriteFile(script, []byte(changed), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := buildSh(t, dir, cache, "--print-image"); got == base {
		t.Errorf("a different go build recipe gave the same tag %s", got)
	}
}

// TestPlanOnAnEmptyCache: with nothing cached every part is to be built,
// each in the cache folder under the given tools cache.
func TestPlanOnAnEmptyCache(t *testing.T) {
	dir := checkout(t)
	cache := t.TempDir()
	plan := buildSh(t, dir, cache, "--plan")
	for _, part := range []string{"kubernetes", "etcd", "coredns", "pause", "nodenet", "rootfs-node", "rootfs-proxy", "images", "node"} {
		if !strings.Contains(plan, "\n"+part+": will build") {
			t.Errorf("plan does not build %s:\n%s", part, plan)
		}
	}
	if !strings.Contains(plan, filepath.Join(cache, "node-image")+"/") {
		t.Errorf("plan does not build into %s/node-image:\n%s", cache, plan)
	}
}
