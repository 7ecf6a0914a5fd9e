package v1alpha1

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AtprotoRecordSpec is written only by the user.
type AtprotoRecordSpec struct {
	// RepoRef names the AtprotoRepo (same namespace) the record lives in.
	RepoRef LocalObjectRef `json:"repoRef"`
	// Collection is the record's NSID, for example app.bsky.actor.profile.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	Collection string `json:"collection"`
	// RKey is the record key.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	RKey string `json:"rkey"`
	// Value is the record as JSON. No floats; integers up to 2^53; a $type,
	// if present, equals the collection.
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	Value apiextensionsv1.JSON `json:"value"`
}

// AtprotoRecordStatus is written only by the atprotorecord controller and
// is taken from reading the record back from the PDS.
type AtprotoRecordStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// URI is the record's at:// URI.
	// +optional
	URI string `json:"uri,omitempty"`
	// CID of the record as read back.
	// +optional
	CID string `json:"cid,omitempty"`
	// Rev of the repo when the record was last read back.
	// +optional
	Rev string `json:"rev,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AtprotoRecord is one record in an ATProto repo, kept equal to its spec.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=knotless
// +kubebuilder:printcolumn:name="Collection",type=string,JSONPath=`.spec.collection`
// +kubebuilder:printcolumn:name="RKey",type=string,JSONPath=`.spec.rkey`
// +kubebuilder:printcolumn:name="Synced",type=string,JSONPath=`.status.conditions[?(@.type=="Synced")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Synced")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AtprotoRecord struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AtprotoRecordSpec   `json:"spec"`
	Status AtprotoRecordStatus `json:"status,omitempty"`
}

// AtprotoRecordList is a list of AtprotoRecords.
//
// +kubebuilder:object:root=true
type AtprotoRecordList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AtprotoRecord `json:"items"`
}
