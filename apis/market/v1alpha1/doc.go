/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package v1alpha1 contains the market.knotless.dev API: who takes part in
// the compute market (networks, identities, bidders) and how they are seen
// (presence). Each participant's objects are its private view of public
// ATProto records (lexicons under dev.knotless.market, see
// docs/lexicons.md).
//
// +kubebuilder:object:generate=true
// +groupName=market.knotless.dev
package v1alpha1
