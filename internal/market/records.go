package market

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/knotless-dev/knotless/internal/lexicon"
)

// The types of the market records' state and reason fields. Their values
// are declared once, in package deal, next to the lexicons' knownValues
// (deal.LeaseRunning, deal.VMLost, deal.ReplicasLowered, ...): a record
// read from a repo may carry any other string, which none of them equals.
type (
	// LeaseState is lease.state.
	LeaseState string
	// LeaseReason is lease.reason: the bidder's.
	LeaseReason string
	// ReleaseReason is release.reason: the requester's.
	ReleaseReason string
)

// StrongRef is com.atproto.repo.strongRef: a record's at-URI and the CID
// of the version meant.
type StrongRef struct {
	URI string `json:"uri"`
	CID string `json:"cid"`
}

// Request is the content of a dev.knotless.market.request record.
type Request struct {
	Type            string `json:"$type"`
	Shape           Shape  `json:"shape"`
	MaxPricePerHour Price  `json:"maxPricePerHour"`
	BidDeadline     string `json:"bidDeadline"`
	NoticeSeconds   int64  `json:"noticeSeconds"`
	Network         string `json:"network,omitempty"`
	ReplicaIndex    int64  `json:"replicaIndex"`
	CreatedAt       string `json:"createdAt"`
}

// Bid is the content of a dev.knotless.market.bid record.
type Bid struct {
	Type         string    `json:"$type"`
	Request      StrongRef `json:"request"`
	PricePerHour Price     `json:"pricePerHour"`
	Shape        *Shape    `json:"shape,omitempty"`
	ValidUntil   string    `json:"validUntil"`
	Driver       string    `json:"driver,omitempty"`
	CreatedAt    string    `json:"createdAt"`
}

// Accept is the content of a dev.knotless.market.accept record.
type Accept struct {
	Type      string    `json:"$type"`
	Bid       StrongRef `json:"bid"`
	Request   StrongRef `json:"request"`
	ConfirmBy string    `json:"confirmBy"`
	CreatedAt string    `json:"createdAt"`
}

// Lease is the content of a dev.knotless.market.lease record.
type Lease struct {
	Type          string      `json:"$type"`
	Accept        StrongRef   `json:"accept"`
	Bid           *StrongRef  `json:"bid,omitempty"`
	State         LeaseState  `json:"state"`
	Reason        LeaseReason `json:"reason,omitempty"`
	CAFingerprint string      `json:"caFingerprint,omitempty"`
	CABundle      string      `json:"caBundle,omitempty"`
	Endpoint      string      `json:"endpoint,omitempty"`
	ServiceID     string      `json:"serviceId,omitempty"`
	Gateway       string      `json:"gateway,omitempty"`
	SSHAddress    string      `json:"sshAddress,omitempty"`
	SSHHostKey    string      `json:"sshHostKey,omitempty"`
	UpdatedAt     string      `json:"updatedAt,omitempty"`
	CreatedAt     string      `json:"createdAt"`
}

// Release is the content of a dev.knotless.market.release record.
type Release struct {
	Type      string        `json:"$type"`
	Lease     StrongRef     `json:"lease"`
	Reason    ReleaseReason `json:"reason"`
	CreatedAt string        `json:"createdAt"`
}

// Decode validates a record value against the lexicon of collection and
// decodes it into out. An invalid record is a *lexicon.Error.
func Decode(collection string, value json.RawMessage, out any) error {
	if err := lexicon.ValidateRecord(collection, value); err != nil {
		return err
	}
	if err := json.Unmarshal(value, out); err != nil {
		return &lexicon.Error{Collection: collection, Reason: err.Error()}
	}
	return nil
}

// Time formats t as a record datetime (UTC, milliseconds).
func Time(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// ParseTime parses a record datetime, in UTC; the zero time when it is
// not one, or when it falls outside the years 1–9999 in UTC (a datetime
// such as 9999-12-31T23:59:59-23:59 is valid in a record, but no
// Kubernetes time field can hold it).
func ParseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	if t = t.UTC(); t.Year() < 1 || t.Year() > 9999 {
		return time.Time{}
	}
	return t
}

// keyAlphabet is lowercase base32: record keys and object names.
const keyAlphabet = "abcdefghijklmnopqrstuvwxyz234567"

// Hash is a short, stable digest of s for names and record keys: the
// first n characters of the lowercase base32 SHA-256 of s (n ≤ 52).
func Hash(s string, n int) string {
	sum := sha256.Sum256([]byte(s))
	return base32.NewEncoding(keyAlphabet).WithPadding(base32.NoPadding).EncodeToString(sum[:])[:n]
}

// Owner is the part of a participant's record keys that says which
// MarketRequester or MarketBidder (by UID) wrote them: several may publish
// as one identity, and each lists only its own records.
func Owner(uid string) string { return Hash(uid, 8) }

// Every market record but a request has a key derived from its writer
// and the record it answers, so a retry rewrites the same record instead
// of making a second one: a prefix letter, the Owner, and 24 characters
// of the hash of the answered record's at-URI.
const (
	prefixRequest = "r"
	prefixBid     = "b"
	prefixAccept  = "a"
	prefixLease   = "l"
	prefixRelease = "x"
	prefixReclaim = "c"
)

// ExportWait is how long the requester's side tries to export the
// tenant of a contract it releases (from its first try) before it
// releases it without a snapshot.
const ExportWait = 2 * time.Minute

func derivedKey(prefix, owner, parentURI string) string { return prefix + owner + Hash(parentURI, 24) }

// BidKey is the record key of owner's bid on the request at requestURI.
func BidKey(owner, requestURI string) string { return derivedKey(prefixBid, owner, requestURI) }

// AcceptKey is the record key of owner's accept of the bid at bidURI.
func AcceptKey(owner, bidURI string) string { return derivedKey(prefixAccept, owner, bidURI) }

// LeaseKey is the record key of owner's lease answering the accept at
// acceptURI.
func LeaseKey(owner, acceptURI string) string { return derivedKey(prefixLease, owner, acceptURI) }

// ReleaseKey is the record key of owner's release of the lease at
// leaseURI.
func ReleaseKey(owner, leaseURI string) string { return derivedKey(prefixRelease, owner, leaseURI) }

// ReclaimKey is the record key of owner's reclaim of its lease at
// leaseURI.
func ReclaimKey(owner, leaseURI string) string { return derivedKey(prefixReclaim, owner, leaseURI) }

// Owns reports whether rkey is a derived key (bid, accept, lease, release,
// reclaim) written by owner.
func Owns(owner, rkey string) bool {
	return len(rkey) == 1+len(owner)+24 && rkey[1:1+len(owner)] == owner
}

// Written reports whether rkey has the form of a key knotless gives the
// records of a deal (of any owner).
func Written(rkey string) bool {
	if len(rkey) < 10 {
		return false
	}
	switch rkey[:1] {
	case prefixBid, prefixAccept, prefixLease, prefixRelease, prefixReclaim:
		return len(rkey) == 33
	case prefixRequest:
		_, _, ok := ParseRequestKey(rkey[1:9], rkey)
		return ok
	}
	return false
}

// RequestKey is the record key of owner's request for a replica, made at
// at: the time part (milliseconds, base 36) keeps every request of a
// replica distinct, also after the replica was released and is wanted
// again, so that nothing answering an earlier request (a bid, an accept, a
// lease, a contract's name) is ever taken for an answer to a later one.
func RequestKey(owner string, replica int32, at time.Time) string {
	return fmt.Sprintf("%s%s-%d-%s", prefixRequest, owner, replica, strconv.FormatInt(at.UnixMilli(), 36))
}

// ParseRequestKey returns the replica and the time part of a request key
// of owner, and whether the key is one.
func ParseRequestKey(owner, rkey string) (replica int32, stamp int64, ok bool) {
	rest, found := strings.CutPrefix(rkey, prefixRequest+owner+"-")
	if !found {
		return 0, 0, false
	}
	idx, ts, found := strings.Cut(rest, "-")
	if !found {
		return 0, 0, false
	}
	i, err := strconv.ParseInt(idx, 10, 32)
	if err != nil || i < 0 || strconv.FormatInt(i, 10) != idx {
		return 0, 0, false
	}
	stamp, err = strconv.ParseInt(ts, 36, 64)
	if err != nil || stamp <= 0 || strconv.FormatInt(stamp, 36) != ts {
		return 0, 0, false
	}
	return int32(i), stamp, true
}

// URI is the at-URI of a record.
func URI(did, collection, rkey string) string { return "at://" + did + "/" + collection + "/" + rkey }

// SplitURI returns the repo (DID), collection and record key of an
// at-URI; empty strings when it is not one (also when a part is empty).
func SplitURI(uri string) (did, collection, rkey string) {
	parts := strings.Split(strings.TrimPrefix(uri, "at://"), "/")
	if !strings.HasPrefix(uri, "at://") || len(parts) != 3 || slices.Contains(parts, "") {
		return "", "", ""
	}
	return parts[0], parts[1], parts[2]
}
