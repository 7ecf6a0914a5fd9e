package engage

import (
	"testing"

	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
)

func TestClusterNamesCarryTheExport(t *testing.T) {
	n := ClusterName("apps.knotless.dev", "2brd12f600howkdv")
	if n != "apps.knotless.dev#2brd12f600howkdv" {
		t.Fatalf("got %q", n)
	}
	e, lc, ok := SplitClusterName(n)
	if !ok || e != "apps.knotless.dev" || lc != "2brd12f600howkdv" {
		t.Fatalf("split: %q %q %v", e, lc, ok)
	}
	if _, _, ok := SplitClusterName("no-separator"); ok {
		t.Fatal("a name without separator split")
	}
}

func TestProviderRefusesBadInput(t *testing.T) {
	if _, err := New(nil, []string{"a"}, Options{}); err == nil {
		t.Fatal("no scheme accepted")
	}
}

func TestGetOfUnknownExportIsNotFound(t *testing.T) {
	p := &Provider{exports: map[string]*exportProvider{"apps": {}}}
	for _, name := range []multicluster.ClusterName{"nosep", "other#x", "apps#x"} {
		if _, err := p.Get(t.Context(), name); err != multicluster.ErrClusterNotFound {
			t.Errorf("%s: want ErrClusterNotFound, got %v", name, err)
		}
	}
}
