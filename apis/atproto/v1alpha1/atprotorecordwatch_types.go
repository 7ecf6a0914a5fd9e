package v1alpha1

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reasons of an AtprotoRecordWatch's Ready condition.
const (
	// ReasonFollowing: connected, records complete up to status.cursor.
	ReasonFollowing = "Following"
	// ReasonConnecting: not connected yet, no error so far.
	ReasonConnecting = "Connecting"
	// ReasonSourceUnreachable: the last connection attempt failed; the
	// watch reconnects with backoff.
	ReasonSourceUnreachable = "SourceUnreachable"
	// ReasonResyncing: records are being listed from the source (a new
	// watch, OutdatedCursor, FutureCursor, a prevData mismatch, #sync).
	ReasonResyncing = "Resyncing"
	// ReasonListingTooLarge: a listing of the source or of a repo's PDS
	// passed one of the provider's limits (pages, repos, records, bytes)
	// and was refused; it is tried again after a backoff of minutes.
	ReasonListingTooLarge = "ListingTooLarge"
)

// WatchSource names the firehose a watch follows.
type WatchSource struct {
	// URL of a PDS or relay, http(s)://host[:port] without a path. knotless
	// follows its com.atproto.sync.subscribeRepos (ws(s)://) and lists
	// records from the PDS that hosts each DID when it resyncs.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[^/?#@\s]+/?$`
	URL string `json:"url"`
}

// AtprotoRecordWatchSpec is written only by the user. Changing it starts
// the watch over: its records are listed again from the source.
type AtprotoRecordWatchSpec struct {
	// Source is the firehose to follow.
	Source WatchSource `json:"source"`
	// Collections are the NSIDs whose records are kept.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=317
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)+(\.[a-zA-Z]([a-zA-Z0-9]{0,62})?)$`
	// +listType=set
	Collections []string `json:"collections"`
	// DIDs, if set, are the only repos followed; empty follows every repo
	// the source carries.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=2048
	// +kubebuilder:validation:items:Pattern=`^did:[a-z]+:[a-zA-Z0-9._:%-]*[a-zA-Z0-9._-]$`
	// +listType=set
	DIDs []string `json:"dids,omitempty"`
	// MaxRecords bounds status.records (default 100, at most 500). When more
	// records match, the ones changed longest ago leave status.records and
	// status.evicted counts them; list them from their repo.
	// +optional
	// +kubebuilder:default=100
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=500
	MaxRecords int32 `json:"maxRecords,omitempty"`
}

// WatchedRecord is one record that matches the watch, as the source last
// reported it.
type WatchedRecord struct {
	// URI is at://<did>/<collection>/<rkey>.
	URI string `json:"uri"`
	// CID of the record's current version.
	CID string `json:"cid"`
	// Rev of the repo commit that wrote this version (empty when the
	// record was listed by a resync).
	// +optional
	Rev string `json:"rev,omitempty"`
	// Value is the record as JSON when it is at most 1 KiB; larger values
	// are left out (fetch them with com.atproto.repo.getRecord).
	// +optional
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	Value *apiextensionsv1.JSON `json:"value,omitempty"`
	// ValueBytes is the size of the record's JSON.
	// +optional
	ValueBytes int32 `json:"valueBytes,omitempty"`
}

// WatchedRepo is how far the watch has applied one repo.
type WatchedRepo struct {
	// DID of the repo.
	DID string `json:"did"`
	// Rev of the last commit applied; older or equal commits are skipped.
	// +optional
	Rev string `json:"rev,omitempty"`
	// Data is the MST root CID after that commit; a commit whose prevData
	// differs makes the watch resync this repo.
	// +optional
	Data string `json:"data,omitempty"`
}

// WatchResync records the last time the watch listed records instead of
// following the stream.
type WatchResync struct {
	// Reason is Initial, OutdatedCursor, FutureCursor, PrevDataMismatch or
	// Sync.
	Reason string `json:"reason"`
	// Time of the listing.
	Time metav1.Time `json:"time"`
	// DID of the one repo listed, when only one was.
	// +optional
	DID string `json:"did,omitempty"`
}

// AtprotoRecordWatchStatus is written only by the atprotorecordwatch
// controller (field manager knotless-atprotorecordwatch), in one apply
// that carries the records and the cursor they are complete up to.
type AtprotoRecordWatchStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Cursor is the firehose sequence number every event up to which is
	// reflected in records; a restarted provider resumes after it.
	// +optional
	Cursor int64 `json:"cursor,omitempty"`
	// LastEventTime is the time of the last event applied.
	// +optional
	LastEventTime *metav1.Time `json:"lastEventTime,omitempty"`
	// Seen counts the commits of followed repos the watch applied.
	// +optional
	Seen int64 `json:"seen,omitempty"`
	// Matched counts the record operations (create, update, delete) that
	// matched the watch.
	// +optional
	Matched int64 `json:"matched,omitempty"`
	// Errors counts events rejected (bad signature, corrupt commit) and
	// failed resyncs.
	// +optional
	Errors int64 `json:"errors,omitempty"`
	// RecordCount is the number of records in records.
	// +optional
	RecordCount int64 `json:"recordCount,omitempty"`
	// Evicted counts matching records left out of records by maxRecords.
	// +optional
	Evicted int64 `json:"evicted,omitempty"`
	// Records are the matching records, newest change first, at most
	// spec.maxRecords.
	// +optional
	// +listType=map
	// +listMapKey=uri
	Records []WatchedRecord `json:"records,omitempty"`
	// Repos are the followed repos and how far each is applied.
	// +optional
	// +listType=map
	// +listMapKey=did
	Repos []WatchedRepo `json:"repos,omitempty"`
	// LastResync is the last time records were listed from the source.
	// +optional
	LastResync *WatchResync `json:"lastResync,omitempty"`
	// Conditions: Ready (following the source).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AtprotoRecordWatch follows a PDS or relay firehose and keeps the records
// of chosen collections (and DIDs) in its status.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=knotless,shortName=awatch
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.source.url`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Records",type=integer,JSONPath=`.status.recordCount`
// +kubebuilder:printcolumn:name="Cursor",type=integer,JSONPath=`.status.cursor`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AtprotoRecordWatch struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AtprotoRecordWatchSpec   `json:"spec"`
	Status AtprotoRecordWatchStatus `json:"status,omitempty"`
}

// AtprotoRecordWatchList is a list of AtprotoRecordWatches.
//
// +kubebuilder:object:root=true
type AtprotoRecordWatchList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AtprotoRecordWatch `json:"items"`
}
