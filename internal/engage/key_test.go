/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package engage

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"
)

// Objects of the same namespace and name in two workspaces, and of
// different namespaces in one, have different keys.
func TestKey(t *testing.T) {
	req := func(lc, ns, name string) mcreconcile.Request {
		return mcreconcile.Request{ClusterName: multicluster.ClusterName(lc), Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}
	}
	if got := Key(req("lc1", "ns", "a")); got != "lc1|ns/a" {
		t.Errorf("Key = %q", got)
	}
	seen := map[string]bool{}
	for _, r := range []mcreconcile.Request{req("lc1", "ns", "a"), req("lc2", "ns", "a"), req("lc1", "", "a"), req("lc1", "ns", "b")} {
		if k := Key(r); seen[k] {
			t.Errorf("key %q twice", k)
		} else {
			seen[k] = true
		}
	}
}
