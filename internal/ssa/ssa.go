// Package ssa writes the fields a controller owns with server-side apply,
// one field manager per writer (R05). Controllers never write the spec of
// an object a user wrote (R03): these helpers send only metadata fields or
// only status, except Child, which applies an object the controller
// generates (a Component from its Application, a child from its
// Component).
//
// Every controller writes status through WriteStatus, which skips
// unchanged statuses, treats an object deleted meanwhile as done and
// announces the change as an Event; Status and ReplaceStatus are its two
// ways of sending it.
//
// The applies use controller-runtime's Client.Apply with apply
// configurations made from unstructured objects (the knotless kinds have
// no generated apply configurations). Only the fields set in them are
// sent, so each manager owns exactly those.
package ssa

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// skeleton is an apply configuration that names obj and nothing else.
func skeleton(c client.Client, obj client.Object) (*unstructured.Unstructured, error) {
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetGroupVersionKind(gvk)
	u.SetName(obj.GetName())
	u.SetNamespace(obj.GetNamespace())
	// The UID makes the apply fail instead of recreating a deleted object.
	u.SetUID(obj.GetUID())
	return u, nil
}

// Status applies status (a pointer to a status struct of obj's kind) to
// obj's status subresource as manager. Controllers call it through
// WriteStatus.
func Status(ctx context.Context, c client.Client, obj client.Object, status any, manager string) error {
	u, err := skeleton(c, obj)
	if err != nil {
		return err
	}
	st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(status)
	if err != nil {
		return err
	}
	u.Object["status"] = st
	if err := c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(manager), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying status of %s/%s as %s: %w", obj.GetNamespace(), obj.GetName(), manager, err)
	}
	return nil
}

// ReplaceStatus writes status as manager with a JSON merge patch of the
// status subresource: lists in status are replaced whole. Use it for a
// status whose list entries must disappear when the controller drops them
// (records of a watch): through kcp's APIExport virtual workspace an apply
// is recorded as an Update and keeps list-map entries the manager left out.
// Fields left out of status (omitempty) keep their stored value. The
// server's answer is decoded into obj. Controllers call it through
// WriteStatus (StatusOptions.Replace).
func ReplaceStatus(ctx context.Context, c client.Client, obj client.Object, status any, manager string) error {
	body, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	if err := c.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, body), client.FieldOwner(manager)); err != nil {
		return fmt.Errorf("writing status of %s/%s as %s: %w", obj.GetNamespace(), obj.GetName(), manager, err)
	}
	return nil
}

// Metadata applies the finalizers and ownerReferences manager owns on obj.
// Entries manager applied before and leaves out now are removed; entries of
// other managers stay.
func Metadata(ctx context.Context, c client.Client, obj client.Object, finalizers []string, owners []metav1.OwnerReference, manager string) error {
	u, err := skeleton(c, obj)
	if err != nil {
		return err
	}
	u.SetFinalizers(finalizers)
	u.SetOwnerReferences(owners)
	if len(finalizers) == 0 {
		unstructured.RemoveNestedField(u.Object, "metadata", "finalizers")
	}
	if len(owners) == 0 {
		unstructured.RemoveNestedField(u.Object, "metadata", "ownerReferences")
	}
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(manager), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying metadata of %s/%s as %s: %w", obj.GetNamespace(), obj.GetName(), manager, err)
	}
	return nil
}

// RemoveFinalizer removes one finalizer from obj with a merge patch of
// metadata.finalizers guarded by obj's resourceVersion. Server-side apply
// cannot do this reliably: a user who updated the whole object co-owns the
// finalizer list, and an apply that leaves the entry out keeps it.
func RemoveFinalizer(ctx context.Context, c client.Client, obj client.Object, finalizer string) error {
	if !controllerutil.ContainsFinalizer(obj, finalizer) {
		return nil
	}
	orig, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return fmt.Errorf("%T is not a client.Object", obj)
	}
	controllerutil.RemoveFinalizer(obj, finalizer)
	if err := c.Patch(ctx, obj, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("removing finalizer %s from %s/%s: %w", finalizer, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// Child applies an object that the caller generates and owns as a child of
// owner (a controller owner reference; not blockOwnerDeletion, which needs
// rights on the owner that an APIExport's virtual workspace may not give):
// metadata name, namespace, labels and owner reference, and spec. Status
// and every field the caller leaves out are not touched; fields another
// manager set (a user's spec.suspend on a Component) stay. child is then
// the object as the server answered.
func Child(ctx context.Context, c client.Client, child, owner client.Object, manager string) error {
	return applyChild(ctx, c, child, owner, manager, "", "spec")
}

// WholeChild is Child for a kind without a status subresource that only
// its controller writes (a Bid): spec and status go in one apply. A child
// with a UID (as read) is only written, never made again once deleted:
// the apply then fails with NotFound or Conflict.
func WholeChild(ctx context.Context, c client.Client, child, owner client.Object, manager string) error {
	return applyChild(ctx, c, child, owner, manager, child.GetUID(), "spec", "status")
}

func applyChild(ctx context.Context, c client.Client, child, owner client.Object, manager string, uid types.UID, fields ...string) error {
	gvk, err := apiutil.GVKForObject(child, c.Scheme())
	if err != nil {
		return err
	}
	ogvk, err := apiutil.GVKForObject(owner, c.Scheme())
	if err != nil {
		return err
	}
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(child)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: map[string]any{}}
	for _, f := range fields {
		if v, ok := raw[f]; ok {
			u.Object[f] = v
		}
	}
	u.SetGroupVersionKind(gvk)
	u.SetName(child.GetName())
	u.SetNamespace(child.GetNamespace())
	u.SetUID(uid)
	u.SetLabels(child.GetLabels())
	u.SetOwnerReferences([]metav1.OwnerReference{{
		APIVersion: ogvk.GroupVersion().String(), Kind: ogvk.Kind, Name: owner.GetName(), UID: owner.GetUID(),
		Controller: ptr.To(true),
	}})
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(manager), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying %s %s/%s as %s: %w", gvk.Kind, child.GetNamespace(), child.GetName(), manager, err)
	}
	// child becomes the object as the server answered (its UID,
	// generation and resourceVersion), for the status written next.
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, child); err != nil {
		return fmt.Errorf("reading %s %s/%s as applied: %w", gvk.Kind, child.GetNamespace(), child.GetName(), err)
	}
	return nil
}
