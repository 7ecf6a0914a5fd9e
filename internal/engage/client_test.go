/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package engage

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/kcp-dev/logicalcluster/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/knotless-dev/knotless/apis"
)

// apiServer answers discovery at /clusters/* of a virtual workspace and
// records the path of every other request.
func apiServer(t *testing.T, prefix string) (*httptest.Server, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case prefix + "/clusters/*/api":
			_ = json.NewEncoder(w).Encode(map[string]any{"kind": "APIVersions", "versions": []string{"v1"}})
			return
		case prefix + "/clusters/*/apis":
			_ = json.NewEncoder(w).Encode(map[string]any{"kind": "APIGroupList", "groups": []any{}})
			return
		case prefix + "/clusters/*/api/v1":
			_ = json.NewEncoder(w).Encode(map[string]any{"kind": "APIResourceList", "groupVersion": "v1", "resources": []any{
				map[string]any{"name": "configmaps", "namespaced": true, "kind": "ConfigMap", "verbs": []string{"create", "get", "list"}},
			}})
			return
		}
		mu.Lock()
		paths = append(paths, r.Method+" "+r.URL.Path)
		mu.Unlock()
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), paths...)
	}
}

func TestWorkspaceClientWritesToItsWorkspace(t *testing.T) {
	const prefix = "/services/apiexport/root:org:knotless/knotless.dev"
	srv, paths := apiServer(t, prefix)
	scheme := apis.NewScheme()
	sh, err := newShared(&rest.Config{Host: srv.URL + prefix}, scheme)
	if err != nil {
		t.Fatal(err)
	}
	cached := configMap("ws-a", "default", "cached")
	cache := fake.NewClientBuilder().WithScheme(scheme).WithObjects(cached).Build()
	a := &workspaceClient{shared: sh.client, scope: &scope{cluster: logicalcluster.Name("ws-a"), cache: cache}}
	b := &workspaceClient{shared: sh.client, scope: &scope{cluster: logicalcluster.Name("ws-b"), cache: fake.NewClientBuilder().WithScheme(scheme).Build()}}

	cm := &corev1.ConfigMap{}
	cm.Name, cm.Namespace = "new", "default"
	if err := a.Create(t.Context(), cm.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	if err := b.Create(t.Context(), cm.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	got := paths()
	want := []string{
		"POST " + prefix + "/clusters/ws-a/api/v1/namespaces/default/configmaps",
		"POST " + prefix + "/clusters/ws-b/api/v1/namespaces/default/configmaps",
	}
	if !equal(got, want) {
		t.Fatalf("requests %v, want %v", got, want)
	}

	// Reads come from the workspace's own cache, never the API.
	var read corev1.ConfigMap
	if err := a.Get(t.Context(), client.ObjectKeyFromObject(cached), &read); err != nil || read.Name != "cached" {
		t.Fatalf("cached read in ws-a: %v", err)
	}
	if err := b.Get(t.Context(), client.ObjectKeyFromObject(cached), &read); err == nil {
		t.Fatal("ws-b read ws-a's cache")
	}
	if len(paths()) != 2 {
		t.Fatalf("a cached read reached the API: %v", paths())
	}

	// The shared client without a workspace refuses to send anything.
	if err := sh.client.Create(t.Context(), cm.DeepCopy()); !errors.Is(err, errNoWorkspace) {
		t.Fatalf("a write without a workspace: %v", err)
	}
	if err := sh.client.Get(t.Context(), client.ObjectKeyFromObject(cached), &read); !errors.Is(err, errNoWorkspace) {
		t.Fatalf("a read without a workspace: %v", err)
	}
	if len(paths()) != 2 {
		t.Fatalf("a request without a workspace was sent: %v", paths())
	}
}
