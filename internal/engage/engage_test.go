package engage

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/cluster"
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

// A sibling export's cluster that is not engaged yet must be retried:
// multicluster-runtime drops reconciles that fail with ErrClusterNotFound.
func TestSiblingNotEngagedIsRetried(t *testing.T) {
	get := func(context.Context, multicluster.ClusterName) (cluster.Cluster, error) {
		return nil, fmt.Errorf("cluster x not found: %w", multicluster.ErrClusterNotFound)
	}
	_, err := Sibling(context.Background(), get, "atproto.knotless.dev", "abc")
	if err == nil || errors.Is(err, multicluster.ErrClusterNotFound) || !strings.Contains(err.Error(), "not engaged for atproto.knotless.dev yet") {
		t.Fatalf("got %v", err)
	}
}
