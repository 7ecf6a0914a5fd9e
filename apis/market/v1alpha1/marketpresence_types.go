/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// PresenceOffer is an offer with how many more VMs of it the bidder takes
// now.
type PresenceOffer struct {
	Offer `json:",inline"`
	// Free is how many more VMs of this shape the bidder takes now.
	// +kubebuilder:validation:Minimum=0
	Free int32 `json:"free"`
}

// MarketPresenceSpec is applied by the marketbidder controller from its
// MarketBidder (the presence is a generated child).
type MarketPresenceSpec struct {
	// IdentityRef is the MarketIdentity whose repo holds the record.
	IdentityRef LocalRef `json:"identityRef"`
	// Network is the lexicon namespace of the MarketNetwork.
	// +optional
	Network string `json:"network,omitempty"`
	// Offers with their free capacity.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	Offers []PresenceOffer `json:"offers"`
	// Driver the bidder runs VMs with.
	Driver Driver `json:"driver"`
	// AcceptingRequests is false while the bidder is suspended.
	AcceptingRequests bool `json:"acceptingRequests"`
}

// MarketPresenceStatus is written only by the marketpresence controller,
// from reading the record back from the PDS.
type MarketPresenceStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase summarises the presence.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// Record is the presence record as the PDS returned it.
	// +optional
	Record *PublishedRecord `json:"record,omitempty"`
	// UpdatedAt is the record's updatedAt: when its content last changed.
	// +optional
	UpdatedAt *metav1.Time `json:"updatedAt,omitempty"`
	// Conditions: Ready, Published.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MarketPresence is a bidder's published presence record
// (dev.knotless.market.presence): its offers, free capacity, driver and
// whether it takes new requests.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=knotless;market,shortName=mpres
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Accepting",type=boolean,JSONPath=`.spec.acceptingRequests`
// +kubebuilder:printcolumn:name="URI",type=string,JSONPath=`.status.record.uri`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MarketPresence struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MarketPresenceSpec   `json:"spec"`
	Status MarketPresenceStatus `json:"status,omitempty"`
}

// MarketPresenceList is a list of MarketPresences.
//
// +kubebuilder:object:root=true
type MarketPresenceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MarketPresence `json:"items"`
}
