/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// MarketNetworkSpec is written only by the user: knotless never writes
// it, so no restart clears it (seed defect D03).
type MarketNetworkSpec struct {
	// Firehoses are the relays or PDSes whose firehose
	// (com.atproto.sync.subscribeRepos) carries the market's records:
	// http(s)://host[:port] without a path. Each is dialled through the
	// operator's address policy.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=512
	// +kubebuilder:validation:items:Pattern=`^https?://[^/?#@\s]+/?$`
	// +listType=set
	Firehoses []string `json:"firehoses"`
	// PDSHosts, if set, are the PDSes participants are expected on
	// (https://host[:port]); an identity of this network whose repo is on
	// another PDS is not Ready.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=512
	// +kubebuilder:validation:items:Pattern=`^https?://[^/?#@\s]+/?$`
	// +listType=set
	PDSHosts []string `json:"pdsHosts,omitempty"`
	// Namespace is the lexicon namespace of the market's records. knotless
	// serves dev.knotless.market.
	// +optional
	// +kubebuilder:default=dev.knotless.market
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-zA-Z]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)+$`
	Namespace string `json:"namespace,omitempty"`
	// OperatorDID, if set, is the DID whose association records vouch for
	// the network's participants.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^did:[a-z]+:[a-zA-Z0-9._:%-]*[a-zA-Z0-9._-]$`
	OperatorDID string `json:"operatorDID,omitempty"`
}

// MarketNetworkStatus is written only by the marketnetwork controller.
type MarketNetworkStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase is Ready when the spec is usable, Failed when it needs an edit.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// Conditions: Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MarketNetwork is a market a participant takes part in: where its
// records travel and who vouches for its participants.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=knotless;market,shortName=mnet
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Operator",type=string,JSONPath=`.spec.operatorDID`
// +kubebuilder:printcolumn:name="Firehoses",type=string,JSONPath=`.spec.firehoses`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MarketNetwork struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MarketNetworkSpec   `json:"spec"`
	Status MarketNetworkStatus `json:"status,omitempty"`
}

// MarketNetworkList is a list of MarketNetworks.
//
// +kubebuilder:object:root=true
type MarketNetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MarketNetwork `json:"items"`
}
