/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package mountregistry

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apisv1alpha1 "github.com/kcp-dev/sdk/apis/apis/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/log"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/internal/backoff"
)

// TestReadiness: ready only once every listed TenantCluster was observed
// at its listed resourceVersion or a later one, or found gone after the
// list began; then it stays ready.
func TestReadiness(t *testing.T) {
	a, b := key{"lc1", "", "a"}, key{"lc2", "", "b"}
	type step struct {
		observe *key
		rv      string
		gone    bool
		begin   bool
		list    map[key]string
		ready   bool
	}
	obs := func(k key, rv string, gone bool, ready bool) step {
		return step{observe: &k, rv: rv, gone: gone, ready: ready}
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"not ready before the list, even with every object observed", []step{
			obs(a, "10", false, false),
			{begin: true},
			{list: map[key]string{a: "10"}, ready: true},
		}},
		{"an empty list is ready at once", []step{{begin: true}, {list: map[key]string{}, ready: true}}},
		{"older resourceVersion does not count, a later one does", []step{
			{begin: true},
			{list: map[key]string{a: "10", b: "20"}},
			obs(a, "9", false, false),
			obs(b, "20", false, false),
			obs(a, "11", false, true),
		}},
		{"not found before the list does not answer for a listed object", []step{
			obs(a, "", true, false),
			{begin: true},
			{list: map[key]string{a: "10"}},
			obs(a, "10", false, true),
		}},
		{"not found after the list began counts", []step{
			{begin: true},
			obs(a, "", true, false),
			{list: map[key]string{a: "10"}, ready: true},
		}},
		{"being deleted counts by resourceVersion", []step{
			obs(a, "12", true, false),
			{begin: true},
			{list: map[key]string{a: "12"}, ready: true},
		}},
		{"resourceVersions that are not numbers must be equal", []step{
			{begin: true},
			{list: map[key]string{a: "x2"}},
			obs(a, "x3", false, false),
			obs(a, "x2", false, true),
		}},
		{"ready is kept", []step{
			{begin: true},
			{list: map[key]string{a: "1"}},
			obs(a, "1", false, true),
			obs(a, "", true, true),
			obs(b, "1", false, true),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReadiness()
			for i, s := range tc.steps {
				switch {
				case s.begin:
					r.beginList()
					continue
				case s.observe != nil:
					r.Observed(s.observe.cluster, s.observe.namespace, s.observe.name, s.rv, s.gone)
				default:
					r.expect(s.list)
				}
				if got := r.Ready(); got != s.ready {
					t.Fatalf("step %d: ready %v, want %v (%v)", i, got, s.ready, r.Check(nil))
				}
				if err := r.Check(nil); (err == nil) != s.ready {
					t.Fatalf("step %d: Check %v, want ready %v", i, err, s.ready)
				}
			}
		})
	}
	var nilReadiness *Readiness
	nilReadiness.Observed("lc", "", "a", "1", false) // a Reconciler without Readiness
}

// TestReadinessCheckSaysHowFar: the check's error counts, and names no
// workspace, tenant or address.
func TestReadinessCheckSaysHowFar(t *testing.T) {
	r := NewReadiness()
	if err := r.Check(nil); err == nil || !strings.Contains(err.Error(), "not been listed") {
		t.Fatalf("before the list: %v", err)
	}
	r.beginList()
	r.expect(map[key]string{{"lc1", "", "secret-name"}: "1", {"lc2", "", "b"}: "1"})
	r.Observed("lc1", "", "secret-name", "1", false)
	err := r.Check(nil)
	if err == nil || err.Error() != "the registry has read 1 of 2 TenantClusters" {
		t.Fatalf("Check: %v", err)
	}
}

// fakeVW is an APIExport virtual workspace that lists APIBindings and
// TenantClusters across clusters, a page of one item at a time, and
// fails its first request.
type fakeVW struct {
	*httptest.Server
	mu       sync.Mutex
	requests []string
	failures int
}

func newFakeVW(t *testing.T, bindings, tenants []map[string]any) *fakeVW {
	t.Helper()
	vw := &fakeVW{failures: 1}
	const prefix = "/services/apiexport/lc0/knotless.dev/clusters/*"
	vw.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		vw.mu.Lock()
		vw.requests = append(vw.requests, r.URL.RequestURI())
		fail := vw.failures > 0
		vw.failures--
		vw.mu.Unlock()
		if fail {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		var items []map[string]any
		switch r.URL.Path {
		case prefix + "/apis/apis.kcp.io/v1alpha1/apibindings":
			items = bindings
		case prefix + "/apis/compute.knotless.dev/v1alpha1/tenantclusters":
			items = tenants
		default:
			http.NotFound(w, r)
			return
		}
		if r.URL.Query().Get("limit") != "1" {
			http.Error(w, "want limit=1", http.StatusBadRequest)
			return
		}
		i := 0
		_, _ = fmt.Sscan(r.URL.Query().Get("continue"), &i)
		list := map[string]any{"metadata": map[string]any{}, "items": items[i:min(i+1, len(items))]}
		if i+1 < len(items) {
			list["metadata"] = map[string]any{"continue": fmt.Sprint(i + 1)}
		}
		_ = json.NewEncoder(w).Encode(list)
	}))
	t.Cleanup(vw.Close)
	return vw
}

func obj(cluster, name, rv string, ready string) map[string]any {
	o := map[string]any{"metadata": map[string]any{"name": name, "resourceVersion": rv, "annotations": map[string]any{"kcp.io/cluster": cluster}}}
	if ready != "" {
		o["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": ready}}}
	}
	return o
}

func sliceClient(t *testing.T, urls ...string) client.Reader {
	t.Helper()
	s := runtime.NewScheme()
	if err := apisv1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	slice := &apisv1alpha1.APIExportEndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "knotless.dev"}}
	for _, u := range urls {
		slice.Status.APIExportEndpoints = append(slice.Status.APIExportEndpoints, apisv1alpha1.APIExportEndpoint{URL: u})
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(slice).Build()
}

// TestInitialList lists, through every URL of the endpoint slice and page
// by page, the TenantClusters of workspaces whose binding is Ready, after
// retrying a failed list; the readiness then waits for exactly those.
func TestInitialList(t *testing.T) {
	vw := newFakeVW(t,
		[]map[string]any{obj("lc1", "knotless.dev", "1", "True"), obj("lc2", "knotless.dev", "2", "False"), obj("lc3", "knotless.dev", "3", "True")},
		[]map[string]any{obj("lc1", "a", "10", ""), obj("lc1", "b", "11", ""), obj("lc2", "c", "12", ""), obj("lc3", "d", "13", "")},
	)
	r := NewReadiness()
	l := &InitialList{
		Config:    &rest.Config{Host: vw.URL, TLSClientConfig: rest.TLSClientConfig{CAData: certPEM(vw.Certificate().Raw)}},
		Client:    sliceClient(t, vw.URL+"/services/apiexport/lc0/knotless.dev"),
		Export:    "knotless.dev",
		Readiness: r,
		Log:       log.Log,
		Backoff:   backoff.Backoff{Initial: 10 * time.Millisecond},
		PageSize:  1,
	}
	if err := l.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r.Ready() {
		t.Fatal("ready before any TenantCluster was read")
	}
	if err := r.Check(nil); err == nil || err.Error() != "the registry has read 0 of 3 TenantClusters" {
		t.Fatalf("after the list: %v (requests %q)", err, vw.requests)
	}
	r.Observed("lc1", "", "a", "10", false)
	r.Observed("lc1", "", "b", "11", false)
	if r.Ready() {
		t.Fatal("ready before lc3's TenantCluster was read")
	}
	r.Observed("lc3", "", "d", "13", false)
	if !r.Ready() {
		t.Fatalf("not ready after every TenantCluster of a Ready binding was read: %v", r.Check(nil))
	}
	if len(vw.requests) != 1+3+4 {
		t.Errorf("requests: %q, want one failed and a page per item", vw.requests)
	}
}

// TestInitialListFollowsNoRedirect: a redirect from the virtual
// workspace is a failed list, retried, never followed.
func TestInitialListFollowsNoRedirect(t *testing.T) {
	var followed atomic.Bool
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/elsewhere") {
			followed.Store(true)
		}
		http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	r := NewReadiness()
	l := &InitialList{
		Config: &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{CAData: certPEM(srv.Certificate().Raw)}},
		Client: sliceClient(t, srv.URL+"/vw"), Export: "knotless.dev", Readiness: r, Log: log.Log,
		Backoff: backoff.Backoff{Initial: 20 * time.Millisecond},
	}
	if err := l.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if followed.Load() || r.Ready() {
		t.Fatalf("followed %v, ready %v", followed.Load(), r.Ready())
	}
}

// TestReconcilerReportsToReadiness: a reconcile of the listed
// TenantCluster makes the shim ready.
func TestReconcilerReportsToReadiness(t *testing.T) {
	f := newFixture(t)
	f.r.Readiness = NewReadiness()
	tc := &computev1alpha1.TenantCluster{}
	if err := f.ws.Client.Get(t.Context(), client.ObjectKey{Name: "tenant"}, tc); err != nil {
		t.Fatal(err)
	}
	f.r.Readiness.beginList()
	f.r.Readiness.expect(map[key]string{{lc, "", "tenant"}: tc.ResourceVersion})
	if f.r.Readiness.Ready() {
		t.Fatal("ready before the reconcile")
	}
	f.reconcile(t)
	f.registered(t)
	if !f.r.Readiness.Ready() {
		t.Fatalf("not ready after the reconcile: %v", f.r.Readiness.Check(nil))
	}
}

func certPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
