/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package names holds the names that more than one package of knotless
// must agree on: field managers, field indexes, the API groups' domain.
// A name only one package uses stays there (a controller's Name,
// FieldManager and Finalizer are constants of its own package).
//
// Other shared names have their own home: the one APIExport is
// apis.Export; condition reasons are constants of their API group
// (apis/<group>/v1alpha1), the Suspended condition's of internal/suspend,
// and internal/conditions has the reasons several groups share.
package names

const (
	// GroupSuffix ends the name of every knotless API group
	// (apps.knotless.dev, ...).
	GroupSuffix = ".knotless.dev"

	// AtprotoRepoManager is the field manager of the atprotorepo
	// controller: it owns AtprotoRepo status and finalizer, and the
	// session Secrets internal/repoconn writes for the repos.
	AtprotoRepoManager = "knotless-atprotorepo"
	// AgentManager is knotless-agent's field manager: its computevm
	// controller owns ComputeVM status and finalizer and the VMs'
	// credential Secrets with it, its statesync controller StateSync status
	// and the export chunk Secrets.
	AgentManager = "knotless-agent"

	// RecordsByRepo is the field index of AtprotoRecords by the name of
	// their repo (spec.repoRef.name). The atprotorepo controller registers
	// it; the repo and record controllers list records by it.
	RecordsByRepo = "atproto.knotless.dev/repo"

	// RecordsByKey is the field index of AtprotoRecords by repo name,
	// collection and record key (internal/inventory.IndexByKey). The
	// atprotorepo controller registers it; prunes ask it whether an
	// AtprotoRecord still declares a record of the inventory.
	RecordsByKey = "atproto.knotless.dev/key"
)
