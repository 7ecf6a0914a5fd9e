/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package keyref

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/knotless-dev/knotless/internal/conditions"
)

func TestValue(t *testing.T) {
	c := fake.NewClientBuilder().WithObjects(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ca"},
			Data: map[string]string{"ca.crt": "PEM", "empty": ""}, BinaryData: map[string][]byte{"bin": []byte("BIN")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cred"}, Data: map[string][]byte{"password": []byte("pw")}},
	).Build()
	for _, tc := range []struct {
		name   string
		ref    Ref
		want   string
		reason string // "" = resolves
		msg    string
	}{
		{name: "ConfigMap data", ref: Ref{Kind: "ConfigMap", Namespace: "ns", Name: "ca", Key: "ca.crt"}, want: "PEM"},
		{name: "ConfigMap binaryData", ref: Ref{Kind: "ConfigMap", Namespace: "ns", Name: "ca", Key: "bin"}, want: "BIN"},
		{name: "Secret", ref: Ref{Kind: "Secret", Namespace: "ns", Name: "cred", Key: "password", SameNamespace: true}, want: "pw"},
		{name: "missing object", ref: Ref{Kind: "Secret", Namespace: "ns", Name: "nope", Key: "k"},
			reason: "Missing", msg: "Secret ns/nope not found"},
		{name: "missing object of the same namespace", ref: Ref{Kind: "ConfigMap", Namespace: "ns", Name: "nope", Key: "k", SameNamespace: true},
			reason: "Missing", msg: "ConfigMap nope not found in this workspace and namespace"},
		{name: "missing key", ref: Ref{Kind: "ConfigMap", Namespace: "ns", Name: "ca", Key: "k"},
			reason: "Missing", msg: `ConfigMap ns/ca has no key "k"`},
		{name: "empty value", ref: Ref{Kind: "ConfigMap", Namespace: "ns", Name: "ca", Key: "empty", SameNamespace: true},
			reason: "Missing", msg: `ConfigMap ca has no key "empty"`},
		{name: "another namespace", ref: Ref{Kind: "Secret", Namespace: "other", Name: "cred", Key: "password"},
			reason: "Missing", msg: "Secret other/cred not found"},
		{name: "unknown kind", ref: Ref{Kind: "Pod", Namespace: "ns", Name: "ca", Key: "ca.crt"},
			reason: conditions.ReasonInvalidSpec, msg: `kind "Pod" is neither ConfigMap nor Secret`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Value(context.Background(), c, tc.ref, "Missing")
			if tc.reason == "" {
				if err != nil || string(got) != tc.want {
					t.Fatalf("Value = %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			var ce *conditions.Error
			if !errors.As(err, &ce) || ce.Reason != tc.reason || ce.Message != tc.msg {
				t.Fatalf("error %#v, want reason %s and message %q", err, tc.reason, tc.msg)
			}
		})
	}
}

func TestData(t *testing.T) {
	c := fake.NewClientBuilder().WithObjects(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cred"}, Data: map[string][]byte{"tls.crt": []byte("c"), "tls.key": []byte("k")}},
	).Build()
	data, err := Data(context.Background(), c, Ref{Kind: "Secret", Namespace: "ns", Name: "cred"}, "Missing")
	if err != nil || len(data) != 2 || string(data["tls.key"]) != "k" {
		t.Fatalf("Data = %v, %v", data, err)
	}
	_, err = Data(context.Background(), c, Ref{Kind: "Secret", Namespace: "ns", Name: "gone"}, "Missing")
	if conditions.ReasonOf(err, "") != "Missing" || !apierrors.IsNotFound(err) {
		t.Fatalf("missing Secret: %v, want reason Missing wrapping NotFound", err)
	}
}

// A failed read other than NotFound is not a reference problem: it is
// returned as it is, for the controller to retry.
func TestReadErrorsAreReturned(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "cred", errors.New("no"))
	c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return forbidden
		},
	}).Build()
	_, err := Value(context.Background(), c, Ref{Kind: "Secret", Namespace: "ns", Name: "cred", Key: "k"}, "Missing")
	var ce *conditions.Error
	if errors.As(err, &ce) || !apierrors.IsForbidden(err) {
		t.Fatalf("error %v, want the Forbidden error as it is", err)
	}
}
