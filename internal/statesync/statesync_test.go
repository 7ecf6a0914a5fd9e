package statesync

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

func obj(m map[string]interface{}) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: m}
}

// TestSkipAndClean: what a new tenant makes itself is left out, and an
// object keeps only what makes it again.
func TestSkipAndClean(t *testing.T) {
	core := func(r string) schema.GroupResource { return schema.GroupResource{Resource: r} }
	cases := []struct {
		gr   schema.GroupResource
		o    map[string]interface{}
		skip bool
	}{
		{core("namespaces"), map[string]interface{}{"metadata": map[string]interface{}{"name": "shop"}}, false},
		{core("namespaces"), map[string]interface{}{"metadata": map[string]interface{}{"name": "default"}}, true},
		{core("namespaces"), map[string]interface{}{"metadata": map[string]interface{}{"name": "kube-system"}}, true},
		{core("configmaps"), map[string]interface{}{"metadata": map[string]interface{}{"name": "kube-root-ca.crt", "namespace": "shop"}}, true},
		{core("configmaps"), map[string]interface{}{"metadata": map[string]interface{}{"name": "cfg", "namespace": "kube-public"}}, true},
		{core("configmaps"), map[string]interface{}{"metadata": map[string]interface{}{"name": "cfg", "namespace": "default"}}, false},
		{core("secrets"), map[string]interface{}{"metadata": map[string]interface{}{"name": "t", "namespace": "shop"}, "type": "kubernetes.io/service-account-token"}, true},
		{core("serviceaccounts"), map[string]interface{}{"metadata": map[string]interface{}{"name": "default", "namespace": "shop"}}, true},
		{schema.GroupResource{Group: "apps", Resource: "replicasets"}, map[string]interface{}{"metadata": map[string]interface{}{"name": "r", "namespace": "shop",
			"ownerReferences": []interface{}{map[string]interface{}{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u"}}}}, true},
	}
	for _, c := range cases {
		if got := skip(c.gr, obj(c.o)); got != c.skip {
			t.Errorf("skip(%s %v) = %v", c.gr, c.o["metadata"], got)
		}
	}
	cleaned := clean(obj(map[string]interface{}{"apiVersion": "v1", "kind": "ConfigMap", "data": map[string]interface{}{"k": "v"}, "status": map[string]interface{}{"x": 1},
		"metadata": map[string]interface{}{"name": "cfg", "namespace": "shop", "uid": "u", "resourceVersion": "9", "labels": map[string]interface{}{"a": "b"},
			"annotations": map[string]interface{}{"kubectl.kubernetes.io/last-applied-configuration": "{}"}, "managedFields": []interface{}{}}}))
	md := cleaned["metadata"].(map[string]interface{})
	if _, ok := cleaned["status"]; ok || len(md) != 3 || md["name"] != "cfg" || md["namespace"] != "shop" || cleaned["data"] == nil {
		t.Errorf("clean: %v", cleaned)
	}
}

func gz(t *testing.T, raw []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(raw)
	_ = zw.Close()
	return buf.Bytes()
}

// TestImportRefusesBadSnapshots before it talks to any tenant: not gzip,
// not JSON, another version, an object without a kind, a bomb bigger
// than MaxBytes once decompressed.
func TestImportRefusesBadSnapshots(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1"} // never reached
	for name, data := range map[string][]byte{
		"not gzip":   []byte("plain"),
		"not json":   gz(t, []byte("{")),
		"version":    gz(t, []byte(`{"version":2,"objects":[]}`)),
		"no kind":    gz(t, []byte(`{"version":1,"objects":[{"apiVersion":"v1","metadata":{"name":"x"}}]}`)),
		"large bomb": gz(t, []byte(`{"version":1,"objects":[],"pad":"`+strings.Repeat("a", MaxBytes)+`"}`)),
	} {
		if _, err := Import(context.Background(), cfg, data, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func TestChunks(t *testing.T) {
	data := bytes.Repeat([]byte("ab"), 10)
	ch := Chunks(data, 7)
	if len(ch) != 3 || len(ch[2]) != 6 || !bytes.Equal(bytes.Join(ch, nil), data) {
		t.Errorf("chunks %q", ch)
	}
	if ch := Chunks(nil, 7); len(ch) != 1 || len(ch[0]) != 0 {
		t.Errorf("empty: %q", ch)
	}
}

// fakeTenant serves discovery of namespaces, configmaps, secrets,
// rolebindings and clusterrolebindings, and records every apply and
// every GET.
func fakeTenant(t *testing.T) (*rest.Config, *[]string, *[]string) {
	t.Helper()
	var applied, gets []string
	var mu sync.Mutex
	res := func(name, kind string, namespaced bool) map[string]any {
		return map[string]any{"name": name, "singularName": "", "kind": kind, "namespaced": namespaced, "verbs": []string{"get", "list", "patch", "create"}}
	}
	docs := map[string]any{
		"/api":  map[string]any{"kind": "APIVersions", "versions": []string{"v1"}},
		"/apis": map[string]any{"kind": "APIGroupList", "groups": []any{map[string]any{"name": "rbac.authorization.k8s.io", "versions": []any{map[string]any{"groupVersion": "rbac.authorization.k8s.io/v1", "version": "v1"}}, "preferredVersion": map[string]any{"groupVersion": "rbac.authorization.k8s.io/v1", "version": "v1"}}}},
		"/api/v1": map[string]any{"kind": "APIResourceList", "groupVersion": "v1", "resources": []any{
			res("namespaces", "Namespace", false), res("configmaps", "ConfigMap", true), res("secrets", "Secret", true)}},
		"/apis/rbac.authorization.k8s.io": map[string]any{"kind": "APIGroup", "apiVersion": "v1", "name": "rbac.authorization.k8s.io", "versions": []any{map[string]any{"groupVersion": "rbac.authorization.k8s.io/v1", "version": "v1"}}, "preferredVersion": map[string]any{"groupVersion": "rbac.authorization.k8s.io/v1", "version": "v1"}},
		"/apis/rbac.authorization.k8s.io/v1": map[string]any{"kind": "APIResourceList", "groupVersion": "rbac.authorization.k8s.io/v1", "resources": []any{
			res("rolebindings", "RoleBinding", true), res("clusterrolebindings", "ClusterRoleBinding", false)}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPatch {
			body, _ := io.ReadAll(r.Body)
			mu.Lock()
			applied = append(applied, r.URL.Path+" "+string(body))
			mu.Unlock()
			_, _ = w.Write(body)
			return
		}
		mu.Lock()
		gets = append(gets, r.URL.Path)
		mu.Unlock()
		doc, ok := docs[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(doc)
	}))
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL}, &applied, &gets
}

func snap(t *testing.T, objs ...string) []byte {
	t.Helper()
	return gz(t, []byte(`{"version":1,"objects":[`+strings.Join(objs, ",")+`]}`))
}

// TestImportAppliesOnlyWhatTheRequesterExports: a snapshot is written by
// whoever ran the tenant it came from. An import applies namespaces and
// the allowed kinds only, with what an export keeps of each object; a
// snapshot with any other kind, a cluster-scoped kind, or an object an
// export leaves out applies nothing at all.
func TestImportAppliesOnlyWhatTheRequesterExports(t *testing.T) {
	ns := `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"shop"}}`
	cm := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"settings","namespace":"shop","uid":"u","resourceVersion":"7","managedFields":[]},"data":{"k":"v"},"status":{}}`
	crb := `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"all"},"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"cluster-admin"},"subjects":[{"kind":"Group","name":"system:unauthenticated"}]}`
	rb := `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{"name":"rb","namespace":"shop"}}`
	rootCA := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kube-root-ca.crt","namespace":"shop"}}`
	inSystem := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"kube-system"}}`
	configmaps := []schema.GroupResource{{Resource: "configmaps"}}
	crbs := append([]schema.GroupResource{{Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings"}}, configmaps...)

	cfg, applied, gets := fakeTenant(t)
	n, err := Import(context.Background(), cfg, snap(t, ns, cm), configmaps)
	if err != nil || n != 2 || len(*applied) != 2 {
		t.Fatalf("namespace and ConfigMap: %d, %v, %v", n, err, *applied)
	}
	if !slices.Equal(*gets, []string{"/api/v1"}) {
		t.Errorf("discovery read %v; want only the core group's (the groups of the kinds asked for)", *gets)
	}
	if a := (*applied)[1]; !strings.HasPrefix(a, "/api/v1/namespaces/shop/configmaps/settings ") || strings.Contains(a, "resourceVersion") || strings.Contains(a, `"uid"`) || strings.Contains(a, "status") {
		t.Errorf("applied %s", a)
	}
	for name, c := range map[string]struct {
		objs    []string
		allowed []schema.GroupResource
	}{
		"a kind not exported":             {[]string{ns, cm, rb}, configmaps},
		"a cluster-scoped kind":           {[]string{ns, cm, crb}, crbs},
		"the kube-root-ca.crt ConfigMap":  {[]string{ns, rootCA}, configmaps},
		"an object in a kube- namespace":  {[]string{cm, inSystem}, configmaps},
		"a namespaced object without one": {[]string{`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}`}, configmaps},
	} {
		cfg, applied, _ := fakeTenant(t)
		if _, err := Import(context.Background(), cfg, snap(t, c.objs...), c.allowed); !errors.Is(err, ErrInvalid) || len(*applied) != 0 {
			t.Errorf("%s: %v, applied %v; want ErrInvalid and nothing applied", name, err, *applied)
		}
	}
}
