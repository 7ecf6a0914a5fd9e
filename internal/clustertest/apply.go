package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/knotless-dev/knotless/internal/names"
)

// applier emulates server-side apply for the knotless kinds.
//
// controller-runtime v0.24's fake client converts an apply configuration
// of a kind the scheme knows into the whole typed object, zero values
// included: a metadata-only or status-only apply (internal/ssa) then
// claims and empties every spec field without omitempty, which is what
// the knotless kinds' required fields are. For these kinds the applier
// therefore does the apply itself, with the semantics knotless relies on:
//
//   - the UID in the apply configuration is a precondition (Conflict);
//   - metadata.finalizers and metadata.ownerReferences: the entries the
//     manager applied before and leaves out now are removed, the others
//     (of other managers) stay;
//   - labels, annotations and every other field (spec) are merged into the
//     live object, map by map (lists replaced); nothing is removed;
//   - the status subresource: status is replaced by the applied status (one
//     writer per status, R05); a kind without one (a Bid) takes the
//     applied status with the rest of the object;
//   - an apply of a missing object creates it, unless it names a UID.
//
// managedFields are not maintained. It intercepts Client.Apply and the
// status subresource's Apply (not the deprecated client.Apply patch);
// applies of other kinds go to the fake client unchanged.
type applier struct {
	// withStatus are the kinds that have a status subresource.
	withStatus map[schema.GroupKind]bool
	mu         sync.Mutex
	// owned is what each manager applied to each object (by kind,
	// namespace, name and UID): finalizers and owner reference UIDs.
	owned map[ownerKey]owned
}

type ownerKey struct {
	gvk             schema.GroupVersionKind
	namespace, name string
	uid             types.UID
	manager         string
}

func keyOf(u *unstructured.Unstructured, uid types.UID, manager string) ownerKey {
	return ownerKey{gvk: u.GroupVersionKind(), namespace: u.GetNamespace(), name: u.GetName(), uid: uid, manager: manager}
}

type owned struct {
	finalizers []string
	owners     []types.UID
}

func (a *applier) funcs() interceptor.Funcs {
	return interceptor.Funcs{
		// A created object gets a UID, as from an apiserver (owner checks
		// compare UIDs).
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			assignUID(obj)
			return c.Create(ctx, obj, opts...)
		},
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			cfg, err := unstructuredOf(obj)
			if err != nil {
				return err
			}
			if !isKnotless(cfg) {
				return c.Apply(ctx, obj, opts...)
			}
			o := (&client.ApplyOptions{}).ApplyOptions(opts)
			return a.apply(ctx, c, obj, cfg, o.FieldManager, false)
		},
		SubResourceApply: func(ctx context.Context, c client.Client, sub string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
			cfg, err := unstructuredOf(obj)
			if err != nil {
				return err
			}
			if sub != "status" || !isKnotless(cfg) {
				return c.SubResource(sub).Apply(ctx, obj, opts...)
			}
			o := (&client.SubResourceApplyOptions{}).ApplyOpts(opts)
			return a.apply(ctx, c, obj, cfg, o.FieldManager, true)
		},
	}
}

// unstructuredOf is the apply configuration obj as it is sent.
func unstructuredOf(obj runtime.ApplyConfiguration) (*unstructured.Unstructured, error) {
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	cfg := &unstructured.Unstructured{}
	if err := json.Unmarshal(data, &cfg.Object); err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("apply configuration: %v", err))
	}
	return cfg, nil
}

func isKnotless(cfg *unstructured.Unstructured) bool {
	return strings.HasSuffix(cfg.GroupVersionKind().Group, names.GroupSuffix)
}

// apply applies cfg (the apply configuration obj) as manager, to status
// or to the rest of the object, and decodes the stored object into obj.
func (a *applier) apply(ctx context.Context, c client.Client, obj runtime.ApplyConfiguration, cfg *unstructured.Unstructured, manager string, status bool) error {
	if manager == "" {
		return apierrors.NewBadRequest("an apply needs a field manager")
	}
	gvk := cfg.GroupVersionKind()
	if gvk.Empty() {
		return apierrors.NewBadRequest("the apply configuration has no apiVersion and kind")
	}
	gr := schema.GroupResource{Group: gvk.Group, Resource: strings.ToLower(gvk.Kind)}
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(gvk)
	err := c.Get(ctx, client.ObjectKey{Namespace: cfg.GetNamespace(), Name: cfg.GetName()}, live)
	switch {
	case apierrors.IsNotFound(err) && (status || cfg.GetUID() != ""):
		if status {
			return err
		}
		return apierrors.NewConflict(gr, cfg.GetName(), fmt.Errorf("uid mismatch: the provided object specified uid %s, and no existing object was found", cfg.GetUID()))
	case apierrors.IsNotFound(err):
		created := cfg.DeepCopy()
		assignUID(created)
		if a.withStatus[gvk.GroupKind()] {
			unstructured.RemoveNestedField(created.Object, "status")
		}
		if err := c.Create(ctx, created); err != nil {
			return err
		}
		a.remember(created, manager)
		return into(created, obj)
	case err != nil:
		return err
	case cfg.GetUID() != "" && cfg.GetUID() != live.GetUID():
		return apierrors.NewConflict(gr, cfg.GetName(), fmt.Errorf("precondition failed: UID in precondition: %s, UID in object meta: %s", cfg.GetUID(), live.GetUID()))
	}

	if status {
		if st, ok := cfg.Object["status"]; ok {
			live.Object["status"] = st
		} else {
			delete(live.Object, "status")
		}
		if err := updateTyped(ctx, c, live, true); err != nil {
			return err
		}
		return into(live, obj)
	}

	a.mergeMetadata(live, cfg, manager)
	for k, v := range cfg.Object {
		switch {
		case k == "metadata" || k == "apiVersion" || k == "kind":
		case k == "status" && a.withStatus[gvk.GroupKind()]:
		case k == "status":
			live.Object[k] = v
		default:
			live.Object[k] = merge(live.Object[k], v)
		}
	}
	if err := updateTyped(ctx, c, live, false); err != nil {
		if apierrors.IsNotFound(err) {
			return nil // its last finalizer went: deleted
		}
		return err
	}
	return into(live, obj)
}

// updateTyped updates the object (its status subresource when status)
// as the typed kind of the scheme, so that the fake client keeps storing
// typed objects (its List with a field index cannot convert unstructured
// ones), and copies the stored object back into live.
func updateTyped(ctx context.Context, c client.Client, live *unstructured.Unstructured, status bool) error {
	gvk := live.GroupVersionKind()
	o, err := c.Scheme().New(gvk)
	if err != nil {
		return err
	}
	typed, ok := o.(client.Object)
	if !ok {
		return fmt.Errorf("%T is not a client.Object", o)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(live.Object, typed); err != nil {
		return err
	}
	if status {
		err = c.Status().Update(ctx, typed)
	} else {
		err = c.Update(ctx, typed)
	}
	if err != nil {
		return err
	}
	back, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
	if err != nil {
		return err
	}
	live.Object = back
	live.SetGroupVersionKind(gvk)
	return nil
}

// mergeMetadata applies cfg's finalizers, owner references, labels and
// annotations to live as manager.
func (a *applier) mergeMetadata(live, cfg *unstructured.Unstructured, manager string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	before := a.owned[keyOf(live, live.GetUID(), manager)]

	fins := slices.DeleteFunc(live.GetFinalizers(), func(f string) bool {
		return slices.Contains(before.finalizers, f) && !slices.Contains(cfg.GetFinalizers(), f)
	})
	for _, f := range cfg.GetFinalizers() {
		if !slices.Contains(fins, f) {
			fins = append(fins, f)
		}
	}
	live.SetFinalizers(fins)

	applied := cfg.GetOwnerReferences()
	appliedUID := func(uid types.UID) bool {
		return slices.ContainsFunc(applied, func(o metav1.OwnerReference) bool { return o.UID == uid })
	}
	refs := slices.DeleteFunc(live.GetOwnerReferences(), func(o metav1.OwnerReference) bool {
		return appliedUID(o.UID) || slices.Contains(before.owners, o.UID)
	})
	live.SetOwnerReferences(append(refs, applied...))

	for _, m := range []struct {
		get func() map[string]string
		set func(map[string]string)
		cfg map[string]string
	}{{live.GetLabels, live.SetLabels, cfg.GetLabels()}, {live.GetAnnotations, live.SetAnnotations, cfg.GetAnnotations()}} {
		if len(m.cfg) > 0 {
			cur := m.get()
			if cur == nil {
				cur = map[string]string{}
			}
			maps.Copy(cur, m.cfg)
			m.set(cur)
		}
	}
	a.rememberLocked(cfg, live.GetUID(), manager)
}

func (a *applier) remember(u *unstructured.Unstructured, manager string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rememberLocked(u, u.GetUID(), manager)
}

func (a *applier) rememberLocked(cfg *unstructured.Unstructured, uid types.UID, manager string) {
	var o owned
	o.finalizers = cfg.GetFinalizers()
	for _, r := range cfg.GetOwnerReferences() {
		o.owners = append(o.owners, r.UID)
	}
	if a.owned == nil {
		a.owned = map[ownerKey]owned{}
	}
	a.owned[keyOf(cfg, uid, manager)] = o
}

// merge returns applied merged into live: maps key by key, anything else
// replaced.
func merge(live, applied any) any {
	lm, ok1 := live.(map[string]any)
	am, ok2 := applied.(map[string]any)
	if !ok1 || !ok2 {
		return applied
	}
	out := maps.Clone(lm)
	for k, v := range am {
		out[k] = merge(lm[k], v)
	}
	return out
}

// into decodes the stored object u into the apply configuration obj, as
// a client does with the server's answer.
func into(u *unstructured.Unstructured, obj runtime.ApplyConfiguration) error {
	data, err := json.Marshal(u.Object)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, obj); err != nil {
		return errors.Join(errors.New("decoding the applied object"), err)
	}
	return nil
}

// assignUID gives obj a UID if it has none.
func assignUID(obj client.Object) {
	if obj.GetUID() == "" {
		obj.SetUID(uuid.NewUUID())
	}
	// A made object has generation 1, as from an apiserver.
	if obj.GetGeneration() == 0 {
		obj.SetGeneration(1)
	}
}
