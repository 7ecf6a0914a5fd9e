package engage

import (
	"errors"
	"testing"

	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
)

func TestProviderRefusesBadInput(t *testing.T) {
	if _, err := New(nil, "knotless.dev", Options{}); err == nil {
		t.Fatal("no scheme accepted")
	}
}

func TestGetBeforeStartIsNotFound(t *testing.T) {
	p := &Provider{exportProvider: &exportProvider{}}
	if _, err := p.Get(t.Context(), "2brd12f600howkdv"); !errors.Is(err, multicluster.ErrClusterNotFound) {
		t.Fatalf("want ErrClusterNotFound, got %v", err)
	}
	if p.Engaged() != 0 {
		t.Fatal("engaged clusters before start")
	}
}
