package market

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
)

// Vouched reports whether subject may take part in a deal with role: the
// network's operator vouches for it (an association record in the
// operator's repo), or the participant's own identity approves it
// (spec.approvedAssociations).
func Vouched(r interface {
	Vouches(voucher, subject, role string) bool
}, operator string, id *marketv1alpha1.MarketIdentity, subject string, role marketv1alpha1.Role) bool {
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

// Approved are the DIDs an identity approves with role.
func Approved(id *marketv1alpha1.MarketIdentity, role marketv1alpha1.Role) []string {
	var out []string
	for _, a := range id.Spec.ApprovedAssociations {
		if slices.Contains(a.Roles, role) {
			out = append(out, a.DID)
		}
	}
	return out
}

// CAFingerprint is "sha256:" and the lowercase hex SHA-256 of the
// concatenated DER of every certificate of the PEM bundle pemBytes, in
// order: how a lease pins a tenant's CA bundle. It covers every
// certificate a mount trusts (x509.CertPool.AppendCertsFromPEM takes
// them all), so a bundle that adds a certificate to a pinned one has
// another pin; a bundle of one certificate keeps the SHA-256 of its DER,
// what leases carried when only the first certificate was hashed. A
// bundle is refused unless it is one or more CERTIFICATE blocks that
// parse, without PEM headers, with nothing but white space around and
// between them: nothing the pin does not cover can ride along.
func CAFingerprint(pemBytes []byte) (string, error) {
	h := sha256.New()
	n := 0
	rest := bytes.TrimLeft(pemBytes, pemSpace)
	for len(rest) > 0 {
		if !bytes.HasPrefix(rest, []byte(pemBegin)) {
			return "", errors.New("the CA bundle has bytes outside its PEM blocks")
		}
		block, next := pem.Decode(rest)
		// pem.Decode skips a block it cannot decode and goes on to the
		// next one: a decoded block must be the first that begins here.
		if block == nil || bytes.Count(rest[:len(rest)-len(next)], []byte(pemBegin)) != 1 {
			return "", errors.New("the CA bundle has a PEM block that does not decode")
		}
		n++
		if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
			return "", fmt.Errorf("block %d of the CA bundle is not a certificate", n)
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return "", fmt.Errorf("certificate %d of the CA bundle does not parse: %w", n, err)
		}
		h.Write(block.Bytes)
		rest = bytes.TrimLeft(next, pemSpace)
	}
	if n == 0 {
		return "", errors.New("the CA bundle holds no PEM certificate")
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// pemSpace is the white space CAFingerprint allows around PEM blocks, and
// pemBegin how a block begins.
const (
	pemSpace = " \t\r\n"
	pemBegin = "-----BEGIN "
)

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

// Absences tell when a record missing from a follower's view is missing
// from its repo: only once a listing of that repo has ended after the
// record was first found missing. A record that is merely late on the
// firehose, or was pushed out of a feed, therefore never ends a deal.
type Absences struct {
	mu    sync.Mutex
	since map[string]time.Time
}

// Gone reports whether the record key, missing from r now, is gone from
// did's repo. The first time it is found missing did is listed again at
// once; it is gone once a listing ended after that.
// Present clears what Gone noted.
func (a *Absences) Gone(r Reader, did, key string, now time.Time) bool {
	if r.Complete() != nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.since == nil {
		a.since = map[string]time.Time{}
	}
	since, noted := a.since[key]
	if !noted {
		a.since[key] = now
		r.List(did)
		return false
	}
	if r.Listed(did).After(since) {
		delete(a.since, key)
		return true
	}
	r.Refresh(did)
	return false
}

// Present forgets that key was found missing.
func (a *Absences) Present(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.since, key)
}

// Since is when key was found missing, if it was (deal.Missing).
func (a *Absences) Since(key string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.since[key]
	return t, ok
}

// Note remembers that key was found missing at at (unless it was
// before).
func (a *Absences) Note(key string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.since == nil {
		a.since = map[string]time.Time{}
	}
	if _, ok := a.since[key]; !ok {
		a.since[key] = at
	}
}
