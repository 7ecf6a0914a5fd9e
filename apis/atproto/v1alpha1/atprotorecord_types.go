package v1alpha1

import (
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AtprotoRecordSpec is written only by the user.
type AtprotoRecordSpec struct {
	// RepoRef names the AtprotoRepo (same namespace) the record lives in.
	// Immutable on an AtprotoRecord: delete and recreate it to move the
	// record.
	RepoRef LocalObjectRef `json:"repoRef"`
	// Collection is the record's NSID, for example app.bsky.actor.profile.
	// Immutable on an AtprotoRecord. Collections another kind owns are
	// refused: dev.knotless.market.* (the market kinds write them),
	// dev.knotless.gateway.association and dev.knotless.gateway.ssh (the
	// Gateway kinds write them) and dev.knotless.inventory (knotless's
	// inventory of the records it keeps); the authority part of an NSID
	// is compared without case.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^[a-zA-Z]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)+(\.[a-zA-Z]([a-zA-Z0-9]{0,62})?)$`
	// +kubebuilder:validation:XValidation:rule="!self.lowerAscii().startsWith('dev.knotless.market.')",message="collections dev.knotless.market.* are written by the market kinds (MarketRequester, MarketBidder, MarketIdentity, MarketPresence), not by an AtprotoRecord"
	// +kubebuilder:validation:XValidation:rule="!(self.lowerAscii() in ['dev.knotless.gateway.association', 'dev.knotless.gateway.ssh'])",message="collections dev.knotless.gateway.association and dev.knotless.gateway.ssh are written by the Gateway kinds, not by an AtprotoRecord"
	// +kubebuilder:validation:XValidation:rule="self.lowerAscii() != 'dev.knotless.inventory'",message="collection dev.knotless.inventory is written by knotless's AtprotoRecord controller (its inventory of the records it keeps), not by an AtprotoRecord"
	Collection string `json:"collection"`
	// RKey is the record key: 1 to 512 of A-Z a-z 0-9 . _ : ~ -, not "."
	// or "..". Immutable on an AtprotoRecord.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_~.:-]+$`
	// +kubebuilder:validation:XValidation:rule="self != '.' && self != '..'",message="a record key cannot be . or .."
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
	// ObservedGeneration is the generation the status describes.
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
	// Conditions: Ready and Synced (the record on the PDS equals spec;
	// Ready mirrors it, for kubectl wait and GitOps health checks), and
	// Suspended while an owner suspends it.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AtprotoRecord is one record in an ATProto repo, kept equal to its spec.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=knotless,shortName=arec
// +kubebuilder:printcolumn:name="Collection",type=string,JSONPath=`.spec.collection`
// +kubebuilder:printcolumn:name="RKey",type=string,JSONPath=`.spec.rkey`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Synced",type=string,JSONPath=`.status.conditions[?(@.type=="Synced")].status`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Synced")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AtprotoRecord struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the record. Its repoRef, collection and rkey name the record
	// on the PDS and cannot change: delete the AtprotoRecord and create it
	// again to move a record (a Component does that itself when its
	// template moves the record).
	// +kubebuilder:validation:XValidation:rule="self.repoRef == oldSelf.repoRef && self.collection == oldSelf.collection && self.rkey == oldSelf.rkey",message="repoRef, collection and rkey are immutable: delete the AtprotoRecord and create it again to move the record"
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

// OwnedCollection says which kind writes collection when it is one an
// AtprotoRecord may not write (the schema refuses these at admission;
// the controller refuses objects made before it did), or "" when an
// AtprotoRecord may write it. The authority part of an NSID is compared
// without case, as ATProto does.
func OwnedCollection(collection string) string {
	switch c := strings.ToLower(collection); {
	case strings.HasPrefix(c, "dev.knotless.market."):
		return "collections dev.knotless.market.* are written by the market kinds (MarketRequester, MarketBidder, MarketIdentity, MarketPresence), not by an AtprotoRecord"
	case c == "dev.knotless.gateway.association" || c == "dev.knotless.gateway.ssh":
		return "collections dev.knotless.gateway.association and dev.knotless.gateway.ssh are written by the Gateway kinds, not by an AtprotoRecord"
	case c == "dev.knotless.inventory":
		return "collection dev.knotless.inventory is written by knotless's AtprotoRecord controller (its inventory of the records it keeps), not by an AtprotoRecord"
	}
	return ""
}
