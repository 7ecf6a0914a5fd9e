// Package bootstrap creates the provider workspace and applies everything
// knotless serves from it: APIResourceSchemas, APIExports (with the
// permission claims the controllers need), RBAC and WorkspaceTypes. Every
// write is a server-side apply with one field owner, so a second run
// changes nothing.
package bootstrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/kcp-dev/logicalcluster/v3"
	apisv1alpha1 "github.com/kcp-dev/sdk/apis/apis/v1alpha1"
	apisv1alpha2 "github.com/kcp-dev/sdk/apis/apis/v1alpha2"
	tenancyv1alpha1 "github.com/kcp-dev/sdk/apis/tenancy/v1alpha1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// FieldOwner is the field manager of everything bootstrap writes.
const FieldOwner = "knotless-bootstrap"

// Options configure a bootstrap run.
type Options struct {
	// Config talks to kcp (any workspace of it).
	Config *rest.Config
	// Workspace is the provider workspace, for example root:knotless.
	Workspace logicalcluster.Path
	// Exports and WorkspaceTypes hold the YAML to apply.
	Exports, WorkspaceTypes fs.FS
	// ExportTimeout bounds the wait for the APIExports a WorkspaceType
	// binds by default. Zero means one minute.
	ExportTimeout time.Duration
	Log           logr.Logger
}

// Result says what a run applied.
type Result struct {
	// Exports are the names of the APIExports served from the workspace.
	Exports []string
	// InitializerPermissions is whether the server's WorkspaceType has
	// spec.initializerPermissions.
	InitializerPermissions bool
}

// Run creates the provider workspace if needed and applies everything.
func Run(ctx context.Context, o Options) (*Result, error) {
	if !o.Workspace.IsValid() || o.Workspace.Empty() {
		return nil, fmt.Errorf("invalid provider workspace path %q", o.Workspace)
	}
	if o.ExportTimeout == 0 {
		o.ExportTimeout = time.Minute
	}
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		tenancyv1alpha1.AddToScheme, apisv1alpha1.AddToScheme, apisv1alpha2.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, err
		}
	}

	if err := ensureWorkspace(ctx, o, s); err != nil {
		return nil, err
	}
	cfg, err := ForWorkspace(o.Config, o.Workspace)
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, err
	}

	res := &Result{}
	if res.Exports, err = applyExports(ctx, o, c); err != nil {
		return nil, err
	}
	reportStaleBindings(ctx, o, cfg, c, res.Exports)

	res.InitializerPermissions, err = hasInitializerPermissions(cfg)
	if err != nil {
		return nil, fmt.Errorf("detecting WorkspaceType fields: %w", err)
	}

	n, err := applyWorkspaceTypes(ctx, o, c, res.InitializerPermissions)
	if err != nil {
		return nil, err
	}
	if err := bindProvider(ctx, o, c); err != nil {
		return nil, fmt.Errorf("binding %s to the provider: %w", ProviderRole, err)
	}
	o.Log.Info("applied workspace types", "workspace", o.Workspace.String(), "objects", n, "initializerPermissions", res.InitializerPermissions)
	return res, nil
}

// applyExports creates the APIResourceSchemas of o.Exports (immutable:
// created once) and applies its APIExports with the standard permission
// claims, and returns the exports' names.
func applyExports(ctx context.Context, o Options, c client.Client) ([]string, error) {
	schemas, exports, err := readExports(o.Exports)
	if err != nil {
		return nil, err
	}
	for _, obj := range schemas {
		if err := createSchema(ctx, c, obj); err != nil {
			return nil, err
		}
	}
	var names []string
	for _, obj := range exports {
		if err := addStandardClaims(obj); err != nil {
			return nil, err
		}
		if err := apply(ctx, c, obj); err != nil {
			return nil, err
		}
		names = append(names, obj.GetName())
	}
	o.Log.Info("applied APIs", "workspace", o.Workspace.String(), "schemas", len(schemas), "exports", names)
	return names, nil
}

// applyWorkspaceTypes applies the WorkspaceTypes of o.WorkspaceTypes and
// their RBAC (RBAC first, so a type is usable as soon as it exists; a
// type without initializerPermissions on a kcp that lacks the field), and
// returns how many objects it applied.
func applyWorkspaceTypes(ctx context.Context, o Options, c client.Client, initializerPermissions bool) (int, error) {
	wts, err := readDir(o.WorkspaceTypes)
	if err != nil {
		return 0, err
	}
	sort.SliceStable(wts, func(i, j int) bool { return wts[i].GetKind() != "WorkspaceType" && wts[j].GetKind() == "WorkspaceType" })
	for _, obj := range wts {
		if obj.GetKind() == "WorkspaceType" {
			if err := waitForDefaultExports(ctx, o, c, obj); err != nil {
				return 0, err
			}
			if !initializerPermissions {
				if _, found, _ := unstructured.NestedFieldNoCopy(obj.Object, "spec", "initializerPermissions"); found {
					o.Log.Info("this kcp has no WorkspaceType initializerPermissions; applying the type without them", "workspaceType", obj.GetName())
					unstructured.RemoveNestedField(obj.Object, "spec", "initializerPermissions")
				}
			}
		}
		if obj.GetKind() == "ClusterRoleBinding" {
			// Who may use the types is the operator's once the binding
			// exists: it is created, never reverted (the ClusterRole's
			// rules are knotless's and applied like the rest).
			if err := createIfMissing(ctx, c, obj); err != nil {
				return 0, err
			}
			continue
		}
		if err := apply(ctx, c, obj); err != nil {
			return 0, err
		}
	}
	return len(wts), nil
}

// ensureWorkspace creates every missing workspace along the provider path
// and waits until the last one is Ready. Each carries the owner annotation:
// kcp v0.28.1 stamps it only for users outside system:masters and leaves a
// workspace without one stuck in Initializing.
func ensureWorkspace(ctx context.Context, o Options, s *runtime.Scheme) error {
	segments := strings.Split(o.Workspace.String(), ":")
	if segments[0] != "root" {
		return fmt.Errorf("provider workspace %q must start with root", o.Workspace)
	}
	owner, err := OwnerAnnotation(ctx, o.Config)
	if err != nil {
		return err
	}
	parent := logicalcluster.NewPath("root")
	for _, name := range segments[1:] {
		cfg, err := ForWorkspace(o.Config, parent)
		if err != nil {
			return err
		}
		c, err := client.New(cfg, client.Options{Scheme: s})
		if err != nil {
			return err
		}
		ws := &tenancyv1alpha1.Workspace{}
		ws.Name = name
		ws.Annotations = map[string]string{tenancyv1alpha1.ExperimentalWorkspaceOwnerAnnotationKey: owner}
		if err := c.Create(ctx, ws); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating workspace %s in %s: %w", name, parent, err)
		} else if err == nil {
			o.Log.Info("created workspace", "workspace", parent.Join(name).String())
		}
		if err := waitReady(ctx, c, name); err != nil {
			return fmt.Errorf("workspace %s: %w", parent.Join(name), err)
		}
		parent = parent.Join(name)
	}
	return nil
}

func waitReady(ctx context.Context, c client.Client, name string) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		ws := &tenancyv1alpha1.Workspace{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, ws); err != nil {
			last = err.Error()
			return false, nil
		}
		last = string(ws.Status.Phase)
		return ws.Status.Phase == "Ready", nil
	})
	if err != nil {
		return fmt.Errorf("not Ready (last seen: %s): %w", last, err)
	}
	return nil
}

// OwnerAnnotation is the caller's identity as kcp's workspace admission
// would record it.
func OwnerAnnotation(ctx context.Context, cfg *rest.Config) (string, error) {
	rootCfg, err := ForWorkspace(cfg, logicalcluster.NewPath("root"))
	if err != nil {
		return "", err
	}
	cs, err := kubernetes.NewForConfig(rootCfg)
	if err != nil {
		return "", err
	}
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("asking kcp who the provider is: %w", err)
	}
	u := review.Status.UserInfo
	if u.Extra == nil {
		u.Extra = map[string]authenticationv1.ExtraValue{}
	}
	raw, err := json.Marshal(u)
	return string(raw), err
}

// apply server-side applies obj, as it was read from YAML, with the
// bootstrap field owner; the stored object is decoded into obj.
func apply(ctx context.Context, c client.Client, obj *unstructured.Unstructured) error {
	obj.SetManagedFields(nil)
	obj.SetResourceVersion("")
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	return nil
}

// createIfMissing creates obj unless an object of its kind and name
// exists; an existing one is left as it is.
func createIfMissing(ctx context.Context, c client.Client, obj *unstructured.Unstructured) error {
	obj.SetManagedFields(nil)
	obj.SetResourceVersion("")
	if err := c.Create(ctx, obj, client.FieldOwner(FieldOwner)); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	return nil
}

// createSchema creates an APIResourceSchema that does not exist yet.
// Schemas are immutable in kcp and apigen names a changed schema anew, so
// an existing one is left alone: applying it again would write it once
// more (kcp stores its OpenAPI schema in another form than the YAML), and
// a second bootstrap would not be a no-op.
func createSchema(ctx context.Context, c client.Client, obj *unstructured.Unstructured) error {
	existing := &unstructured.Unstructured{}
	existing.SetGroupVersionKind(obj.GroupVersionKind())
	err := c.Get(ctx, client.ObjectKeyFromObject(obj), existing)
	switch {
	case err == nil:
		return nil
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("reading %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	return apply(ctx, c, obj)
}

// waitForDefaultExports checks, with backoff, that every export a
// WorkspaceType binds by default exists. A type whose exports are missing
// would leave every new workspace in Initializing (R15).
func waitForDefaultExports(ctx context.Context, o Options, c client.Client, wt *unstructured.Unstructured) error {
	refs, _, err := unstructured.NestedSlice(wt.Object, "spec", "defaultAPIBindings")
	if err != nil {
		return fmt.Errorf("WorkspaceType %s: %w", wt.GetName(), err)
	}
	for _, r := range refs {
		ref, _ := r.(map[string]any)
		name, _ := ref["export"].(string)
		path, _ := ref["path"].(string)
		ec := c
		where := o.Workspace
		if path != "" {
			where = logicalcluster.NewPath(path)
			cfg, err := ForWorkspace(o.Config, where)
			if err != nil {
				return err
			}
			if ec, err = client.New(cfg, client.Options{Scheme: c.Scheme()}); err != nil {
				return err
			}
		}
		var lastErr error
		err := wait.PollUntilContextTimeout(ctx, time.Second, o.ExportTimeout, true, func(ctx context.Context) (bool, error) {
			lastErr = ec.Get(ctx, client.ObjectKey{Name: name}, &apisv1alpha2.APIExport{})
			if lastErr != nil {
				o.Log.Info("WorkspaceType binds an APIExport that does not exist yet; waiting", "workspaceType", wt.GetName(), "export", name, "path", where.String(), "reason", lastErr.Error())
			}
			return lastErr == nil, nil
		})
		if err != nil {
			return fmt.Errorf("WorkspaceType %s binds APIExport %s|%s, which does not exist (%w); not applying the type", wt.GetName(), where, name, lastErr)
		}
	}
	return nil
}

// hasInitializerPermissions reads the server's OpenAPI schema of
// WorkspaceType: newer kcp has spec.initializerPermissions, v0.28.1 not.
func hasInitializerPermissions(cfg *rest.Config) (bool, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return false, err
	}
	paths, err := dc.OpenAPIV3().Paths()
	if err != nil {
		return false, err
	}
	gv, ok := paths["apis/"+tenancyv1alpha1.SchemeGroupVersion.String()]
	if !ok {
		return false, errors.New("kcp serves no OpenAPI schema for tenancy.kcp.io/v1alpha1")
	}
	raw, err := gv.Schema("application/json")
	if err != nil {
		return false, err
	}
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Properties map[string]json.RawMessage `json:"properties"`
				} `json:"properties"`
				XKubernetesGVK []map[string]string `json:"x-kubernetes-group-version-kind"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return false, err
	}
	for _, sch := range doc.Components.Schemas {
		for _, gvk := range sch.XKubernetesGVK {
			if gvk["kind"] == "WorkspaceType" {
				_, has := sch.Properties["spec"].Properties["initializerPermissions"]
				return has, nil
			}
		}
	}
	return false, errors.New("kcp's OpenAPI schema has no WorkspaceType")
}

// StandardClaims returns the permission claims every knotless export
// makes: the controllers read ConfigMaps the user references, read Secrets
// the user references and keep their own Secrets (for example ATProto
// sessions, owned by the object they belong to), and write Events for
// users. The apibinder initializer accepts them for
// workspaces of knotless's types.
func StandardClaims() []apisv1alpha2.PermissionClaim {
	read := []string{"get", "list", "watch"}
	return []apisv1alpha2.PermissionClaim{
		{GroupResource: apisv1alpha2.GroupResource{Resource: "configmaps"}, Verbs: read},
		{GroupResource: apisv1alpha2.GroupResource{Resource: "events"}, Verbs: append(read, "create", "update", "patch")},
		{GroupResource: apisv1alpha2.GroupResource{Group: "events.k8s.io", Resource: "events"}, Verbs: append(read, "create", "update", "patch")},
		{GroupResource: apisv1alpha2.GroupResource{Resource: "secrets"}, Verbs: append(read, "create", "update", "patch", "delete")},
	}
}

// addStandardClaims merges StandardClaims into an APIExport (claims
// written in its YAML win).
func addStandardClaims(obj *unstructured.Unstructured) error {
	export := &apisv1alpha2.APIExport{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, export); err != nil {
		return fmt.Errorf("APIExport %s: %w", obj.GetName(), err)
	}
	have := map[apisv1alpha2.GroupResource]bool{}
	for _, c := range export.Spec.PermissionClaims {
		have[c.GroupResource] = true
	}
	for _, c := range StandardClaims() {
		if !have[c.GroupResource] {
			export.Spec.PermissionClaims = append(export.Spec.PermissionClaims, c)
		}
	}
	claims, err := runtime.DefaultUnstructuredConverter.ToUnstructured(export)
	if err != nil {
		return err
	}
	if err := unstructured.SetNestedField(obj.Object, claims["spec"].(map[string]any)["permissionClaims"], "spec", "permissionClaims"); err != nil {
		return err
	}
	// The most a consumer may do with the export's kinds is what the
	// provider workspace's RBAC grants apis.kcp.io:binding:<user>
	// (workspacetypes/maximal-permissions.yaml): no one but the provider
	// creates a StateSync, whatever a workspace's own RBAC says.
	return unstructured.SetNestedField(obj.Object, map[string]any{"local": map[string]any{}}, "spec", "maximalPermissionPolicy")
}

// ProviderRole is the ClusterRole (workspacetypes/maximal-permissions.yaml)
// of what only the provider may do in the workspaces that bind its
// export; Run binds it to the provider's own identity.
const ProviderRole = "knotless:provider"

// bindProvider binds ProviderRole, in the provider workspace, to the
// caller (the provider) as the export's maximal permission policy sees
// it: its user name with the prefix apis.kcp.io:binding: (a kcp
// ServiceAccount as system:kcp:serviceaccount:<cluster>:<ns>:<name>).
func bindProvider(ctx context.Context, o Options, c client.Client) error {
	raw, err := OwnerAnnotation(ctx, o.Config)
	if err != nil {
		return err
	}
	var u authenticationv1.UserInfo
	if err := json.Unmarshal([]byte(raw), &u); err != nil {
		return err
	}
	binding := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]any{"name": ProviderRole},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ProviderRole},
		"subjects": []any{map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": PolicyUser(u)}},
	}}
	return apply(ctx, c, binding)
}

// PolicyUser is the user name under which a maximal permission policy
// checks u (kcp's rbacregistryvalidation.PrefixUser).
func PolicyUser(u authenticationv1.UserInfo) string {
	name := u.Username
	if rest, ok := strings.CutPrefix(name, "system:serviceaccount:"); ok {
		if clusters := u.Extra["authentication.kubernetes.io/cluster-name"]; len(clusters) == 1 {
			name = "system:kcp:serviceaccount:" + clusters[0] + ":" + rest
		}
	}
	return apisv1alpha1.MaximalPermissionPolicyRBACUserGroupPrefix + name
}

// readExports returns the APIResourceSchemas and APIExports in fsys.
func readExports(fsys fs.FS) (schemas, exports []*unstructured.Unstructured, err error) {
	objs, err := readDir(fsys)
	if err != nil {
		return nil, nil, err
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "APIResourceSchema":
			schemas = append(schemas, o)
		case "APIExport":
			exports = append(exports, o)
		default:
			return nil, nil, fmt.Errorf("unexpected %s %s among the exports", o.GetKind(), o.GetName())
		}
	}
	return schemas, exports, nil
}

// readDir decodes every YAML document of every .yaml file in fsys, in
// file-name order.
func readDir(fsys fs.FS) ([]*unstructured.Unstructured, error) {
	names, err := fs.Glob(fsys, "*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []*unstructured.Unstructured
	for _, n := range names {
		f, err := fsys.Open(n)
		if err != nil {
			return nil, err
		}
		objs, err := Decode(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		for _, obj := range objs {
			delete(obj.Object, "status")
		}
		out = append(out, objs...)
	}
	return out, nil
}

// Decode reads every object of a multi-document YAML (or JSON) stream,
// skipping empty documents.
func Decode(r io.Reader) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		if len(obj.Object) > 0 {
			out = append(out, obj)
		}
	}
}
