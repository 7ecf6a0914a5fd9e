package engage

import (
	"testing"
	"time"

	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
)

func TestBackoffDoublesUpToMaxWithJitter(t *testing.T) {
	b := Backoff{Initial: time.Second, Max: 8 * time.Second}.withDefaults()
	want := []time.Duration{1, 2, 4, 8, 8, 8}
	for attempt, w := range want {
		w *= time.Second
		for range 50 {
			d := b.Delay(attempt)
			if d > w || d < w-w/5 {
				t.Fatalf("attempt %d: delay %s outside [%s, %s]", attempt, d, w-w/5, w)
			}
		}
	}
	if got := (Backoff{}).withDefaults(); got.Initial != time.Second || got.Max != 30*time.Second || got.Healthy != time.Minute {
		t.Fatalf("defaults: %+v", got)
	}
}

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
