package statesync

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"strings"
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
		if _, err := Import(context.Background(), cfg, data); !errors.Is(err, ErrInvalid) {
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
