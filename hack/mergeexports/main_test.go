package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	apisv1alpha2 "github.com/kcp-dev/sdk/apis/apis/v1alpha2"
	"sigs.k8s.io/yaml"
)

func write(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestMergeMakesOneExport(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "apiexport-b.knotless.dev.yaml", "apiVersion: apis.kcp.io/v1alpha2\nkind: APIExport\nmetadata:\n  name: b.knotless.dev\nspec:\n  resources:\n  - group: b.knotless.dev\n    name: zs\n    schema: v1.zs.b.knotless.dev\n    storage:\n      crd: {}\n")
	write(t, dir, "apiexport-a.knotless.dev.yaml", "apiVersion: apis.kcp.io/v1alpha2\nkind: APIExport\nmetadata:\n  name: a.knotless.dev\nspec:\n  resources:\n  - group: a.knotless.dev\n    name: ys\n    schema: v1.ys.a.knotless.dev\n    storage:\n      crd: {}\n  - group: a.knotless.dev\n    name: xs\n    schema: v1.xs.a.knotless.dev\n    storage:\n      crd: {}\n")
	write(t, dir, "apiresourceschema-xs.a.knotless.dev.yaml", "kept")
	for range 2 { // a second run (after apigen pruned nothing) gives the same file
		if err := merge(dir, "knotless.dev"); err != nil && !strings.Contains(err.Error(), "no per-group") {
			t.Fatal(err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 2 {
		t.Fatalf("files after the merge: %v", files)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "apiexport-knotless.dev.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var e apisv1alpha2.APIExport
	if err := yaml.UnmarshalStrict(raw, &e); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range e.Spec.Resources {
		got = append(got, r.Group+"/"+r.Name+"="+r.Schema)
	}
	if e.Name != "knotless.dev" || strings.Join(got, ",") != "a.knotless.dev/xs=v1.xs.a.knotless.dev,a.knotless.dev/ys=v1.ys.a.knotless.dev,b.knotless.dev/zs=v1.zs.b.knotless.dev" {
		t.Fatalf("merged export %s: %v", e.Name, got)
	}
}

func TestMergeRefusesForeignExports(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "apiexport-tenancy.kcp.io.yaml", "apiVersion: apis.kcp.io/v1alpha2\nkind: APIExport\nmetadata:\n  name: tenancy.kcp.io\nspec: {}\n")
	if err := merge(dir, "knotless.dev"); err == nil {
		t.Fatal("merged an export of another group")
	}
}
