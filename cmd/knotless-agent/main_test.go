package main

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
)

// The agent caches only the Secrets labelled for it, not every Secret of
// its workspace (the workspace's other credentials stay out of its
// memory).
func TestAgentCachesOnlyItsSecrets(t *testing.T) {
	for obj, by := range cacheOptions().ByObject {
		if _, ok := obj.(*corev1.Secret); !ok {
			continue
		}
		if by.Label == nil || !by.Label.Matches(labels.Set{computev1alpha1.LabelAgent: "true"}) || by.Label.Matches(labels.Set{"other": "x"}) {
			t.Fatalf("Secrets are cached by %v, want only those with %s=true", by.Label, computev1alpha1.LabelAgent)
		}
		return
	}
	t.Fatal("every Secret of the workspace is cached")
}
