// Package statesync reads a tenant apiserver's objects into a snapshot
// and applies a snapshot to another tenant: how a tenant moves from one
// bidder's VM to another's. It speaks to the tenant with an admin
// rest.Config a driver gives it, so every driver shares it.
//
// A snapshot is gzip of JSON {"version":1,"objects":[…]}: namespaces
// first, then the listed kinds in their order, each object with its
// apiVersion, kind, name, namespace, labels, annotations and every field
// but status. Objects a controller owns (ownerReferences), service
// account tokens, default service accounts, the kube-root-ca.crt
// ConfigMaps and whatever is in the kube-* namespaces are left out: the
// new tenant makes its own.
package statesync

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// Version is the snapshot format's version.
const Version = 1

// Limits of a snapshot: an import refuses more.
const (
	MaxObjects = 10000
	// MaxBytes is the most a snapshot may hold once decompressed.
	MaxBytes = 64 << 20
)

// FieldManager applies imported objects.
const FieldManager = "knotless-restore"

// ErrInvalid marks a snapshot that cannot be read or applied as it is
// (retrying does not help).
var ErrInvalid = errors.New("invalid snapshot")

type snapshot struct {
	Version int                      `json:"version"`
	Objects []map[string]interface{} `json:"objects"`
}

type clients struct {
	mapper meta.RESTMapper
	dyn    dynamic.Interface
}

func connect(cfg *rest.Config) (*clients, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		return nil, fmt.Errorf("discovering the tenant's kinds: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &clients{mapper: restmapper.NewDiscoveryRESTMapper(groups), dyn: dyn}, nil
}

func system(ns string) bool { return strings.HasPrefix(ns, "kube-") }

// skip says whether an object is left out of a snapshot.
func skip(gr schema.GroupResource, o *unstructured.Unstructured) bool {
	switch {
	case len(o.GetOwnerReferences()) > 0, system(o.GetNamespace()):
		return true
	case gr.Group != "":
		return false
	case gr.Resource == "namespaces":
		return system(o.GetName()) || o.GetName() == "default"
	case gr.Resource == "configmaps":
		return o.GetName() == "kube-root-ca.crt"
	case gr.Resource == "serviceaccounts":
		return o.GetName() == "default"
	case gr.Resource == "secrets":
		t, _, _ := unstructured.NestedString(o.Object, "type")
		return t == string(corev1.SecretTypeServiceAccountToken)
	}
	return false
}

// clean keeps what a new tenant needs to make the object again.
func clean(o *unstructured.Unstructured) map[string]interface{} {
	out := map[string]interface{}{}
	for k, v := range o.Object {
		if k != "metadata" && k != "status" {
			out[k] = v
		}
	}
	md := map[string]interface{}{"name": o.GetName()}
	if ns := o.GetNamespace(); ns != "" {
		md["namespace"] = ns
	}
	if l := o.GetLabels(); len(l) > 0 {
		md["labels"] = l
	}
	if a := o.GetAnnotations(); len(a) > 0 {
		delete(a, "kubectl.kubernetes.io/last-applied-configuration")
		if len(a) > 0 {
			md["annotations"] = a
		}
	}
	out["metadata"] = md
	return out
}

// Export reads the tenant's namespaces and the objects of resources into
// a snapshot, and returns it with the number of objects.
func Export(ctx context.Context, cfg *rest.Config, resources []schema.GroupResource) ([]byte, int, error) {
	cl, err := connect(cfg)
	if err != nil {
		return nil, 0, err
	}
	grs := []schema.GroupResource{{Resource: "namespaces"}}
	for _, gr := range resources {
		if !slices.Contains(grs, gr) {
			grs = append(grs, gr)
		}
	}
	snap := snapshot{Version: Version, Objects: []map[string]interface{}{}}
	for _, gr := range grs {
		gvr, err := cl.mapper.ResourceFor(gr.WithVersion(""))
		if err != nil {
			return nil, 0, fmt.Errorf("%w: the tenant serves no resource %q", ErrInvalid, gr.String())
		}
		opts := metav1.ListOptions{Limit: 500}
		for {
			list, err := cl.dyn.Resource(gvr).List(ctx, opts)
			if err != nil {
				return nil, 0, fmt.Errorf("listing %s: %w", gr.String(), err)
			}
			for i := range list.Items {
				if !skip(gr, &list.Items[i]) {
					snap.Objects = append(snap.Objects, clean(&list.Items[i]))
				}
			}
			if len(snap.Objects) > MaxObjects {
				return nil, 0, fmt.Errorf("%w: more than %d objects", ErrInvalid, MaxObjects)
			}
			if opts.Continue = list.GetContinue(); opts.Continue == "" {
				break
			}
		}
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if err := json.NewEncoder(zw).Encode(&snap); err != nil {
		return nil, 0, err
	}
	if err := zw.Close(); err != nil {
		return nil, 0, err
	}
	return buf.Bytes(), len(snap.Objects), nil
}

// decode reads a snapshot, within the limits.
func decode(data []byte) (*snapshot, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%w: not gzip", ErrInvalid)
	}
	raw, err := io.ReadAll(io.LimitReader(zr, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if len(raw) > MaxBytes {
		return nil, fmt.Errorf("%w: more than %d bytes once decompressed", ErrInvalid, MaxBytes)
	}
	var snap snapshot
	if err := json.Unmarshal(raw, &snap); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if snap.Version != Version {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrInvalid, snap.Version, Version)
	}
	if len(snap.Objects) > MaxObjects {
		return nil, fmt.Errorf("%w: more than %d objects", ErrInvalid, MaxObjects)
	}
	return &snap, nil
}

// Import applies a snapshot's objects to the tenant (server-side apply as
// FieldManager, in the snapshot's order) and returns how many it applied.
// Applying again is harmless.
func Import(ctx context.Context, cfg *rest.Config, data []byte) (int, error) {
	snap, err := decode(data)
	if err != nil {
		return 0, err
	}
	// Every object is checked before any is applied: a snapshot that is
	// not whole changes nothing.
	objs := make([]*unstructured.Unstructured, len(snap.Objects))
	for i, m := range snap.Objects {
		o := &unstructured.Unstructured{Object: m}
		if o.GetAPIVersion() == "" || o.GetKind() == "" || o.GetName() == "" {
			return 0, fmt.Errorf("%w: object %d has no apiVersion, kind or name", ErrInvalid, i)
		}
		delete(o.Object, "status")
		objs[i] = o
	}
	cl, err := connect(cfg)
	if err != nil {
		return 0, err
	}
	for i, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := cl.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return i, fmt.Errorf("%w: the tenant serves no %s", ErrInvalid, gvk.String())
		}
		var ri dynamic.ResourceInterface = cl.dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			if o.GetNamespace() == "" {
				return i, fmt.Errorf("%w: %s %s has no namespace", ErrInvalid, gvk.Kind, o.GetName())
			}
			ri = cl.dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		} else {
			o.SetNamespace("")
		}
		if _, err := ri.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
			return i, fmt.Errorf("applying %s %s: %w", gvk.Kind, name(o), err)
		}
	}
	return len(objs), nil
}

func name(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}

// Chunks cuts a snapshot into pieces of at most size bytes.
func Chunks(data []byte, size int) [][]byte {
	var out [][]byte
	for len(data) > size {
		out = append(out, data[:size])
		data = data[size:]
	}
	return append(out, data)
}

// Sum is the lowercase hex SHA-256 of a snapshot.
func Sum(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}
