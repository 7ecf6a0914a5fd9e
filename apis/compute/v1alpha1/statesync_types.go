/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import (
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// StateSyncDirection says whether a StateSync reads a tenant's objects
// out or writes them in.
// +kubebuilder:validation:Enum=Export;Import
type StateSyncDirection string

// StateSync directions.
const (
	// Export reads the tenant's objects into a snapshot.
	Export StateSyncDirection = "Export"
	// Import applies a snapshot's objects to the tenant.
	Import StateSyncDirection = "Import"
)

// StateSyncPhase is where a StateSync stands.
// +kubebuilder:validation:Enum=Pending;Running;Completed;Failed
type StateSyncPhase string

// StateSync phases.
const (
	// SyncPending: the agent has not started (the VM does not run yet, or
	// an import's chunks are not all there).
	SyncPending StateSyncPhase = "Pending"
	// SyncRunning: the agent is exporting or importing.
	SyncRunning StateSyncPhase = "Running"
	// SyncCompleted: done; never run again.
	SyncCompleted StateSyncPhase = "Completed"
	// SyncFailed: it could not be done (status.reason says why); never
	// run again.
	SyncFailed StateSyncPhase = "Failed"
)

// Condition type and reasons of StateSync.
const (
	ConditionSynced = "Synced"

	ReasonVMNotRunning    = "VMNotRunning"
	ReasonChunksMissing   = "ChunksMissing"
	ReasonSnapshotInvalid = "SnapshotInvalid"
	ReasonSnapshotTooBig  = "SnapshotTooLarge"
	ReasonExportFailed    = "ExportFailed"
	ReasonImportFailed    = "ImportFailed"
	// ReasonNotWanted: the VM's contract does not ask for this StateSync
	// (the VM has no live bidder's contract, or it is not in a phase
	// that exports or imports).
	ReasonNotWanted = "NotWanted"
)

// Snapshot chunk Secrets: a snapshot is cut into chunks of at most
// SnapshotChunkBytes, each the data key SnapshotKey of a Secret named
// <owner>-<index>.
const (
	// LabelStateSync is on every chunk Secret of a StateSync: its name.
	LabelStateSync = "compute.knotless.dev/statesync"
	// LabelAgent is on every Secret knotless-agent reads or writes (the
	// VMs' credentials, the snapshots' chunks), value "true": the agent
	// caches only those, not every Secret of its workspace.
	LabelAgent         = "compute.knotless.dev/agent"
	SnapshotKey        = "snapshot"
	SnapshotChunkBytes = 512 << 10
	// SnapshotMaxChunks caps a snapshot at 32 MiB.
	SnapshotMaxChunks = 64
)

// GroupResource names a kind of the tenant by API group ("" for the core
// group) and plural resource name, as `kubectl api-resources` shows them.
type GroupResource struct {
	// Group is the API group ("" for core).
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$`
	// +optional
	Group string `json:"group"`
	// Resource is the plural resource name, e.g. configmaps.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Resource string `json:"resource"`
}

// SchemaGroupResources is grs as apimachinery names them.
func SchemaGroupResources(grs []GroupResource) []schema.GroupResource {
	out := make([]schema.GroupResource, len(grs))
	for i, gr := range grs {
		out[i] = schema.GroupResource{Group: gr.Group, Resource: gr.Resource}
	}
	return out
}

// StateSyncSpec is set by the provider when it makes the StateSync, and
// never changed.
type StateSyncSpec struct {
	// VMName is the ComputeVM (same namespace) whose tenant is synced; it
	// is also the StateSync's controller owner.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	VMName string `json:"vmName"`
	// Direction: Export or Import.
	Direction StateSyncDirection `json:"direction"`
	// Resources are the kinds exported (Export), or the only kinds an
	// Import may apply, besides namespaces. Secrets only when listed.
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Resources []GroupResource `json:"resources,omitempty"`
	// Chunks (Import) is how many chunk Secrets (<name>-0 …, owned by the
	// StateSync) hold the snapshot.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	// +optional
	Chunks int32 `json:"chunks,omitempty"`
	// SHA256 (Import) is the lowercase hex SHA-256 of the whole snapshot.
	// +kubebuilder:validation:Pattern=`^([0-9a-f]{64})?$`
	// +optional
	SHA256 string `json:"sha256,omitempty"`
}

// StateSyncStatus is written only by the knotless-agent (field manager
// knotless-agent).
type StateSyncStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase of the sync.
	// +optional
	Phase StateSyncPhase `json:"phase,omitempty"`
	// Reason says why the sync Failed.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Reason string `json:"reason,omitempty"`
	// Objects is how many objects were exported or imported.
	// +optional
	Objects int32 `json:"objects,omitempty"`
	// Bytes is the size of the snapshot (gzip).
	// +optional
	Bytes int64 `json:"bytes,omitempty"`
	// Chunks (Export) is how many chunk Secrets (<name>-0 …, owned by the
	// StateSync) hold the snapshot.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	// +optional
	Chunks int32 `json:"chunks,omitempty"`
	// SHA256 (Export) is the lowercase hex SHA-256 of the whole snapshot.
	// +kubebuilder:validation:Pattern=`^([0-9a-f]{64})?$`
	// +optional
	SHA256 string `json:"sha256,omitempty"`
	// Conditions: Synced.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// StateSync exports a ComputeVM's tenant objects into a snapshot before
// the VM is released, or imports a snapshot into a new VM's tenant before
// its contract is Active: how a tenant moves from one bidder to another.
// The provider makes it in the bidder's workspace, owned by the VM;
// knotless-agent runs it through the VM's driver.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=knotless;market,shortName=ssync
// +kubebuilder:printcolumn:name="VM",type=string,JSONPath=`.spec.vmName`
// +kubebuilder:printcolumn:name="Direction",type=string,JSONPath=`.spec.direction`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Objects",type=integer,JSONPath=`.status.objects`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type StateSync struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a StateSync's spec never changes"
	// +kubebuilder:validation:XValidation:rule="self.direction == 'Import' || (!has(self.chunks) && !has(self.sha256))",message="chunks and sha256 are for an Import"
	Spec   StateSyncSpec   `json:"spec"`
	Status StateSyncStatus `json:"status,omitempty"`
}

// StateSyncList is a list of StateSyncs.
//
// +kubebuilder:object:root=true
type StateSyncList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []StateSync `json:"items"`
}

// The StateSyncs of a VM are named after it. The provider deletes an
// export once it has copied its snapshot to the requester (or it
// failed): then the VM may go.

// ExportName is the name of the export of the VM vm.
func ExportName(vm string) string { return vm + "-export" }

// ImportName is the name of the import into the VM vm.
func ImportName(vm string) string { return vm + "-import" }

// SnapshotChunkName is the name of chunk i of the snapshot that owner
// (a StateSync, or a snapshot in the requester's workspace) holds.
func SnapshotChunkName(owner string, i int) string { return owner + "-" + strconv.Itoa(i) }
