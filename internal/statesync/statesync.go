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
	"net/http"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/validate/content"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/knotless-dev/knotless/internal/netpolicy"
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

// connect makes the clients of the tenant cfg names, and learns the kinds
// of groups (besides the core group) from the tenant: only those groups'
// discovery documents are read (at most MaxGroups groups, MaxVersions
// versions of each), each with ctx, so a tenant that serves many groups
// costs nothing more (full discovery reads every group, on goroutines
// that no context ends). The clients follow no redirect: a tenant
// answers for itself, and a redirect would carry the credential
// elsewhere.
func connect(ctx context.Context, cfg *rest.Config, groups []string) (*clients, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	hc.CheckRedirect = netpolicy.NoRedirects
	dc, err := discovery.NewDiscoveryClientForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	var found []*restmapper.APIGroupResources
	seen := map[string]bool{}
	for _, g := range append([]string{""}, groups...) {
		if seen[g] {
			continue
		}
		if seen[g] = true; len(seen) > MaxGroups+1 {
			return nil, fmt.Errorf("%w: more than %d API groups", ErrInvalid, MaxGroups)
		}
		gr, err := groupResources(ctx, dc.RESTClient(), g)
		if err != nil {
			return nil, fmt.Errorf("discovering the tenant's kinds: %w", err)
		}
		if gr != nil {
			found = append(found, gr)
		}
	}
	dyn, err := dynamic.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	return &clients{mapper: restmapper.NewDiscoveryRESTMapper(found), dyn: dyn}, nil
}

// Bounds of what connect reads of a tenant's discovery.
const (
	MaxGroups   = 32
	MaxVersions = 4
)

// groupResources reads the discovery of one API group ("": the core
// group, v1) from the tenant: nil when the tenant does not serve it.
func groupResources(ctx context.Context, rc rest.Interface, group string) (*restmapper.APIGroupResources, error) {
	out := &restmapper.APIGroupResources{VersionedResources: map[string][]metav1.APIResource{}}
	if group == "" {
		out.Group = metav1.APIGroup{Versions: []metav1.GroupVersionForDiscovery{{GroupVersion: "v1", Version: "v1"}},
			PreferredVersion: metav1.GroupVersionForDiscovery{GroupVersion: "v1", Version: "v1"}}
	} else {
		err := rc.Get().AbsPath("/apis", group).Do(ctx).Into(&out.Group)
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, err
		case out.Group.Name != group:
			return nil, fmt.Errorf("%w: the tenant answered for group %q with %q", ErrInvalid, group, out.Group.Name)
		}
		if len(out.Group.Versions) > MaxVersions {
			out.Group.Versions = out.Group.Versions[:MaxVersions]
		}
	}
	for _, v := range out.Group.Versions {
		var list metav1.APIResourceList
		path := []string{"/apis", group, v.Version}
		if group == "" {
			path = []string{"/api", v.Version}
		}
		err := rc.Get().AbsPath(path...).Do(ctx).Into(&list)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, err
		}
		out.VersionedResources[v.Version] = list.APIResources
	}
	return out, nil
}

// groupsOf are the API groups of resources.
func groupsOf(resources []schema.GroupResource) []string {
	var out []string
	for _, gr := range resources {
		if !slices.Contains(out, gr.Group) {
			out = append(out, gr.Group)
		}
	}
	return out
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
	cl, err := connect(ctx, cfg, groupsOf(resources))
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
	size := 0
	for _, gr := range grs {
		gvr, err := cl.mapper.ResourceFor(gr.WithVersion(""))
		if err != nil {
			return nil, 0, fmt.Errorf("%w: the tenant serves no resource %q", ErrInvalid, gr.String())
		}
		opts := metav1.ListOptions{Limit: 100}
		for {
			list, err := cl.dyn.Resource(gvr).List(ctx, opts)
			if err != nil {
				return nil, 0, fmt.Errorf("listing %s: %w", gr.String(), err)
			}
			for i := range list.Items {
				if skip(gr, &list.Items[i]) {
					continue
				}
				o := clean(&list.Items[i])
				raw, err := json.Marshal(o)
				if err != nil {
					return nil, 0, err
				}
				if size += len(raw); size > MaxBytes {
					return nil, 0, fmt.Errorf("%w: more than %d bytes", ErrInvalid, MaxBytes)
				}
				snap.Objects = append(snap.Objects, o)
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
// Only namespaces and the kinds in allowed are applied (a snapshot is
// written by whoever ran the tenant it came from): every object is
// checked first, and a snapshot with any other kind, a cluster-scoped
// kind other than Namespace, or an object the export leaves out changes
// nothing. Each object is applied with only what an export keeps of it.
// Applying again is harmless; an object the tenant refuses (4xx) is
// ErrInvalid.
func Import(ctx context.Context, cfg *rest.Config, data []byte, allowed []schema.GroupResource) (int, error) {
	return ImportFrom(ctx, cfg, data, allowed, 0)
}

// ImportFrom is Import that applies the snapshot's objects from the
// index from on (an import cut short goes on where it stopped; the whole
// snapshot is checked again first). It returns the index of the first
// object not applied (the number of objects when all are).
func ImportFrom(ctx context.Context, cfg *rest.Config, data []byte, allowed []schema.GroupResource, from int) (int, error) {
	snap, err := decode(data)
	if err != nil {
		return 0, err
	}
	if err := checkNames(snap.Objects); err != nil {
		return 0, err
	}
	cl, err := connect(ctx, cfg, groupsOf(allowed))
	if err != nil {
		return 0, err
	}
	applies, err := plan(cl, snap.Objects, allowed)
	if err != nil {
		return 0, err
	}
	from = min(max(from, 0), len(applies))
	for i, a := range applies[from:] {
		if _, err := a.ri.Apply(ctx, a.obj.GetName(), a.obj, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
			var st apierrors.APIStatus
			if errors.As(err, &st) && st.Status().Code >= 400 && st.Status().Code < 500 && st.Status().Code != http.StatusTooManyRequests {
				err = fmt.Errorf("%w: %w", ErrInvalid, err)
			}
			return from + i, fmt.Errorf("applying %s %s: %w", a.obj.GetKind(), name(a.obj), err)
		}
	}
	return len(applies), nil
}

// checkNames refuses a snapshot with an object the client could not
// apply: no apiVersion, kind or name, or a name or namespace it cannot put
// in a URL ("..", "a/b"), which would fail the apply after the objects
// before it were applied.
func checkNames(objects []map[string]any) error {
	for i, m := range objects {
		o := &unstructured.Unstructured{Object: m}
		if o.GetAPIVersion() == "" || o.GetKind() == "" || o.GetName() == "" {
			return fmt.Errorf("%w: object %d has no apiVersion, kind or name", ErrInvalid, i)
		}
		if len(content.IsPathSegmentName(o.GetName())) > 0 || len(content.IsPathSegmentName(o.GetNamespace())) > 0 {
			return fmt.Errorf("%w: object %d has a name or namespace that is not a path segment", ErrInvalid, i)
		}
	}
	return nil
}

// apply is one object of a snapshot, cleaned, and where it is applied.
type apply struct {
	ri  dynamic.ResourceInterface
	obj *unstructured.Unstructured
}

// plan returns the applies of a snapshot's objects, or refuses the whole
// snapshot when one is of a kind the tenant does not serve, the requester
// does not export, is cluster-scoped (but namespaces) or is never
// exported.
func plan(cl *clients, objects []map[string]any, allowed []schema.GroupResource) ([]apply, error) {
	var applies []apply
	for _, m := range objects {
		o := &unstructured.Unstructured{Object: m}
		gvk := o.GroupVersionKind()
		mp, err := cl.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return nil, fmt.Errorf("%w: the tenant serves no %s", ErrInvalid, gvk.String())
		}
		gr := mp.Resource.GroupResource()
		namespaced := mp.Scope.Name() == meta.RESTScopeNameNamespace
		switch {
		case gr == schema.GroupResource{Resource: "namespaces"}:
		case !slices.Contains(allowed, gr):
			return nil, fmt.Errorf("%w: %s is not a kind the requester exports", ErrInvalid, gr.String())
		case !namespaced:
			return nil, fmt.Errorf("%w: %s is cluster-scoped", ErrInvalid, gr.String())
		case o.GetNamespace() == "":
			return nil, fmt.Errorf("%w: %s %s has no namespace", ErrInvalid, gvk.Kind, o.GetName())
		}
		if skip(gr, o) {
			return nil, fmt.Errorf("%w: %s %s is never exported", ErrInvalid, gvk.Kind, name(o))
		}
		c := &unstructured.Unstructured{Object: clean(o)}
		var ri dynamic.ResourceInterface = cl.dyn.Resource(mp.Resource)
		if namespaced {
			ri = cl.dyn.Resource(mp.Resource).Namespace(c.GetNamespace())
		} else {
			c.SetNamespace("")
		}
		applies = append(applies, apply{ri, c})
	}
	return applies, nil
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
