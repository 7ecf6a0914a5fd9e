/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package keyref reads what a typed {kind, name, key} reference to a
// ConfigMap or Secret names (R02): a CA bundle or a credential of an
// AtprotoRepo (internal/repoconn) or of a TenantCluster (internal/tenant).
// Objects are read from the referrer's own workspace only: the client is
// that workspace's.
//
// A reference that cannot be used is a *conditions.Error whose reason the
// caller chooses for a missing object or key (CABundleNotFound,
// CredentialNotFound) and whose message names the object as the user
// wrote it, nothing else (R17).
package keyref

import (
	"context"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/knotless-dev/knotless/internal/conditions"
)

// Ref names a ConfigMap or Secret and, for Value, one key of it.
type Ref struct {
	// Kind is ConfigMap or Secret.
	Kind string
	// Namespace and Name of the object.
	Namespace, Name string
	// Key in the object's data.
	Key string
	// SameNamespace is set for a reference without a namespace of its
	// own, to an object of the referrer's namespace (the atproto kinds'
	// references). Messages then name the object "in this workspace and
	// namespace" instead of naming its namespace.
	SameNamespace bool
}

// name is the object as messages name it.
func (r Ref) name() string {
	if r.SameNamespace {
		return r.Name
	}
	return r.Namespace + "/" + r.Name
}

// Data returns the data of the object ref names: a Secret's data, or a
// ConfigMap's data and binaryData together. ref.Key is not used. When the
// object does not exist the error is a *conditions.Error with reason
// missing; when ref.Kind is neither ConfigMap nor Secret, one with reason
// InvalidSpec. Other read errors are returned as they are.
func Data(ctx context.Context, c client.Reader, ref Ref, missing string) (map[string][]byte, error) {
	switch ref.Kind {
	case "Secret":
		s := &corev1.Secret{}
		if err := get(ctx, c, ref, s, missing); err != nil {
			return nil, err
		}
		return s.Data, nil
	case "ConfigMap":
		cm := &corev1.ConfigMap{}
		if err := get(ctx, c, ref, cm, missing); err != nil {
			return nil, err
		}
		data := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
		maps.Copy(data, cm.BinaryData)
		for k, v := range cm.Data {
			data[k] = []byte(v)
		}
		return data, nil
	}
	return nil, conditions.Errorf(conditions.ReasonInvalidSpec, nil, "kind %q is neither ConfigMap nor Secret", ref.Kind)
}

// get reads the object ref names into obj.
func get(ctx context.Context, c client.Reader, ref Ref, obj client.Object, missing string) error {
	err := c.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, obj)
	switch {
	case !apierrors.IsNotFound(err):
		return err
	case ref.SameNamespace:
		return conditions.Errorf(missing, err, "%s %s not found in this workspace and namespace", ref.Kind, ref.name())
	default:
		return conditions.Errorf(missing, err, "%s %s not found", ref.Kind, ref.name())
	}
}

// Value returns the value of ref.Key in the object ref names. A key that
// is missing or empty is a *conditions.Error with reason missing: an
// empty CA bundle or credential is never taken to mean "none" (or "the
// system's roots"). Other errors are Data's.
func Value(ctx context.Context, c client.Reader, ref Ref, missing string) ([]byte, error) {
	data, err := Data(ctx, c, ref, missing)
	if err != nil {
		return nil, err
	}
	v := data[ref.Key]
	if len(v) == 0 {
		return nil, conditions.Errorf(missing, nil, "%s %s has no key %q", ref.Kind, ref.name(), ref.Key)
	}
	return v, nil
}
