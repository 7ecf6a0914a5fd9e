package market

import (
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
)

// Vouched reports whether subject may take part in a deal with role: the
// network's operator vouches for it (an association record in the
// operator's repo), or the participant's own identity approves it
// (spec.approvedAssociations).
func Vouched(r Reader, operator string, id *marketv1alpha1.MarketIdentity, subject string, role marketv1alpha1.Role) bool {
	if subject == "" {
		return false
	}
	if operator != "" && (subject == operator || r.Vouches(operator, subject, string(role))) {
		return true
	}
	if id != nil {
		for _, a := range id.Spec.ApprovedAssociations {
			if a.DID == subject && slices.Contains(a.Roles, role) {
				return true
			}
		}
	}
	return false
}

// Fits reports whether a VM of shape have is at least want.
func Fits(have, want Shape) bool {
	return have.CPUMillis >= want.CPUMillis && have.MemoryMiB >= want.MemoryMiB
}

// ShapeOf is the record shape of an API shape.
func ShapeOf(s marketv1alpha1.Shape) Shape {
	return Shape{Name: s.Name, CPUMillis: s.CPUMillis, MemoryMiB: s.MemoryMiB}
}

// APIShape is the API shape of a record shape.
func APIShape(s Shape) marketv1alpha1.Shape {
	return marketv1alpha1.Shape{Name: s.Name, CPUMillis: s.CPUMillis, MemoryMiB: s.MemoryMiB}
}

// APIRef is the API form of a strong reference.
func APIRef(r StrongRef) marketv1alpha1.RecordRef {
	return marketv1alpha1.RecordRef{URI: r.URI, CID: r.CID}
}

// ChildName is the name of an object a market controller makes for
// parent (a MarketRequester or MarketBidder) about the record or deal
// key: the parent's name (cut to 40 characters) and a hash of key, so
// that a retry finds the object it made before.
func ChildName(parent, key string) string {
	if len(parent) > 40 {
		parent = parent[:40]
	}
	for len(parent) > 0 && (parent[len(parent)-1] == '-' || parent[len(parent)-1] == '.') {
		parent = parent[:len(parent)-1]
	}
	return parent + "-" + Hash(key, 10)
}

// MetaTime is t as an API time, nil for the zero time.
func MetaTime(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	mt := metav1.NewTime(t.UTC().Truncate(time.Second))
	return &mt
}
