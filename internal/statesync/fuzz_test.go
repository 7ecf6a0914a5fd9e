package statesync

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// FuzzImport: a snapshot is written by whoever ran the tenant it came
// from. Whatever its JSON (gzipped here, or taken as it is when it is
// gzip already), Import does not panic; a refusal is ErrInvalid and
// applies nothing (the fake tenant accepts every apply, so no other error
// can happen); an import applies every object once, and only namespaces
// and allowed kinds outside kube-* namespaces, with only what an export
// keeps of them.
func FuzzImport(f *testing.F) {
	ns := `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"shop"}}`
	cm := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"settings","namespace":"shop","uid":"u","resourceVersion":"7","managedFields":[]},"data":{"k":"v"},"status":{}}`
	for _, objs := range [][]string{
		{ns, cm},
		{ns, cm, `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{"name":"rb","namespace":"shop"}}`},
		{ns, cm, `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"all"}}`},
		{ns, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kube-root-ca.crt","namespace":"shop"}}`},
		{cm, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"kube-system"}}`},
		{`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"t","namespace":"shop","labels":{"a":"b"}},"type":"kubernetes.io/service-account-token"}`},
		{`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","ownerReferences":[{"name":"o"}]}}`},
	} {
		f.Add([]byte(`{"version":1,"objects":[` + strings.Join(objs, ",") + `]}`))
	}
	f.Add([]byte(`{"version":2,"objects":[]}`))
	f.Add([]byte(`plain`))
	allowed := []schema.GroupResource{{Resource: "configmaps"}, {Resource: "secrets"}, {Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings"}}
	f.Fuzz(func(t *testing.T, raw []byte) {
		data := raw
		if !bytes.HasPrefix(raw, []byte{0x1f, 0x8b}) {
			data = gz(t, raw)
		}
		cfg, applied, _ := fakeTenant(t)
		n, err := Import(context.Background(), cfg, data, allowed)
		if err != nil {
			if !errors.Is(err, ErrInvalid) || len(*applied) != 0 || n != 0 {
				t.Fatalf("refused with %v (ErrInvalid: %v) after %d applies (%d said)", err, errors.Is(err, ErrInvalid), len(*applied), n)
			}
			return
		}
		snap, _ := decode(data)
		if n != len(*applied) || n != len(snap.Objects) {
			t.Fatalf("%d applied, %d said, %d in the snapshot", len(*applied), n, len(snap.Objects))
		}
		for _, a := range *applied {
			checkApplied(t, a, allowed)
		}
	})
}

// checkApplied asserts that one apply the fake tenant saw ("path body")
// is of a namespace or an allowed kind, namespaced, outside kube-*, and
// carries only what an export keeps.
func checkApplied(t *testing.T, a string, allowed []schema.GroupResource) {
	t.Helper()
	path, body, _ := strings.Cut(a, " ")
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	var gr schema.GroupResource
	switch {
	case len(segs) == 4 && segs[0] == "api" && segs[2] == "namespaces":
		if strings.HasPrefix(segs[3], "kube-") || segs[3] == "default" {
			t.Fatalf("applied %s", path)
		}
		gr = schema.GroupResource{Resource: "namespaces"}
	case len(segs) == 6 && segs[0] == "api" && segs[2] == "namespaces":
		gr = schema.GroupResource{Resource: segs[4]}
	case len(segs) == 7 && segs[0] == "apis" && segs[3] == "namespaces":
		gr = schema.GroupResource{Group: segs[1], Resource: segs[5]}
	default:
		t.Fatalf("applied %s: not a namespace or a namespaced object", path)
	}
	if gr.Resource != "namespaces" && (!slices.Contains(allowed, gr) || strings.HasPrefix(segs[len(segs)-3], "kube-")) {
		t.Fatalf("applied %s (%s)", path, gr)
	}
	var o map[string]any
	if err := json.Unmarshal([]byte(body), &o); err != nil {
		t.Fatalf("applied %s: %v", path, err)
	}
	md, _ := o["metadata"].(map[string]any)
	for k := range md {
		if !slices.Contains([]string{"name", "namespace", "labels", "annotations"}, k) {
			t.Fatalf("applied %s with metadata.%s", path, k)
		}
	}
	if _, ok := o["status"]; ok {
		t.Fatalf("applied %s with a status", path)
	}
}
