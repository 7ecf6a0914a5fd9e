/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of this package's kinds.
var GroupVersion = schema.GroupVersion{Group: "gateway.knotless.dev", Version: "v1alpha1"}

// AddToScheme registers this package's kinds with a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Gateway{}, &GatewayList{}, &SshGateway{}, &SshGatewayList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
