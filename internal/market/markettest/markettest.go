// Package markettest is an in-memory market.Publisher for controller
// tests: it keeps records by collection and rkey, checks values against
// their lexicon as the real one does, and counts writes.
package markettest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/pds"
)

// Repo is one repo's records.
type Repo struct {
	DID string
	// NoServiceAuth: the repo's PDS issues no service-auth token.
	NoServiceAuth bool
	// ServiceAuths counts the service-auth tokens asked for.
	ServiceAuths int

	mu      sync.Mutex
	records map[string]pds.Record // collection/rkey
	rev     int
	// Writes counts the writes and deletes that changed something.
	Writes int
}

// New returns an empty repo of did.
func New(did string) *Repo { return &Repo{DID: did, records: map[string]pds.Record{}} }

var _ market.Publisher = (*Repo)(nil)

func (r *Repo) uri(collection, rkey string) string {
	return "at://" + r.DID + "/" + collection + "/" + rkey
}

// Get implements market.Publisher.
func (r *Repo) Get(_ context.Context, collection, rkey string) (*pds.Record, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.records[collection+"/"+rkey]
	if !ok {
		return nil, nil
	}
	return &rec, nil
}

// ServiceAuth implements market.Publisher: a fake repo's token is
// "markettest:<did>:<aud>:<lxm>:<exp unix>", which nothing verifies;
// NoServiceAuth makes it fail instead.
func (r *Repo) ServiceAuth(_ context.Context, aud, lxm string, exp time.Time) (string, error) {
	r.mu.Lock()
	r.ServiceAuths++
	r.mu.Unlock()
	if r.NoServiceAuth {
		return "", errors.New("markettest: this repo issues no service-auth token")
	}
	return fmt.Sprintf("markettest:%s:%s:%s:%d", r.DID, aud, lxm, exp.Unix()), nil
}

// ListRecords implements market.Publisher.
func (r *Repo) ListRecords(_ context.Context, collection string, limit int) ([]pds.Record, error) {
	return r.list(collection, limit), nil
}

// list is the repo's records of collection, at most limit, by URI.
func (r *Repo) list(collection string, limit int) []pds.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []pds.Record
	for _, rec := range r.records {
		if len(out) < limit && strings.HasPrefix(rec.URI, r.uri(collection, "")) {
			out = append(out, rec)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].URI < out[j].URI })
	return out
}

// Publish implements market.Publisher.
func (r *Repo) Publish(_ context.Context, collection, rkey string, value any) (*pds.EnsureResult, error) {
	raw, err := market.Encode(collection, value)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	k := collection + "/" + rkey
	before, had := r.records[k]
	res := &pds.EnsureResult{}
	if had {
		res.Before = &before
	}
	switch {
	case raw == nil && !had:
		return res, nil
	case raw == nil:
		delete(r.records, k)
	case had && pds.JSONEqual(before.Value, raw):
		res.After = &before
		return res, nil
	default:
		sum := sha256.Sum256(raw)
		rec := pds.Record{URI: r.uri(collection, rkey), CID: "bafy" + hex.EncodeToString(sum[:8]), Value: raw}
		r.records[k] = rec
		res.After = &rec
	}
	r.rev++
	r.Writes++
	res.Wrote, res.Rev = true, fmt.Sprintf("rev%04d", r.rev)
	return res, nil
}

// Put stores a record as another writer would (not counted as a write).
func (r *Repo) Put(collection, rkey string, raw []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sum := sha256.Sum256(raw)
	r.records[collection+"/"+rkey] = pds.Record{URI: r.uri(collection, rkey), CID: "bafyother" + hex.EncodeToString(sum[:4]), Value: raw}
}

// Delete removes a record as another writer would (not counted).
func (r *Repo) Delete(collection, rkey string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.records, collection+"/"+rkey)
}

// Network is an in-memory market.Market: every follower reads the current
// records of its repos, as a firehose would deliver them at once, with the
// time each record version was first read (by Now) as FirstSeen.
type Network struct {
	// Now is the clock of FirstSeen (default time.Now).
	Now func() time.Time
	// Incomplete, if set, is what Complete returns.
	Incomplete error

	mu        sync.Mutex
	repos     []*Repo
	firstSeen map[string]time.Time
	followers map[mcreconcile.Request]market.Follower
	refreshed map[string]int
}

var (
	_ market.Market = (*Network)(nil)
	_ market.Reader = (*Network)(nil)
)

// NewNetwork returns a network of repos.
func NewNetwork(repos ...*Repo) *Network {
	return &Network{repos: repos, firstSeen: map[string]time.Time{}, followers: map[mcreconcile.Request]market.Follower{}, refreshed: map[string]int{}}
}

// Add adds a repo to the network.
func (n *Network) Add(r *Repo) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.repos = append(n.repos, r)
}

// Follow implements market.Market.
func (n *Network) Follow(fl market.Follower, _ []string) (market.Reader, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.followers[fl.Request] = fl
	return n, nil
}

// Unfollow implements market.Market.
func (n *Network) Unfollow(req mcreconcile.Request) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.followers, req)
}

// Followers returns the followers of role trading as did.
func (n *Network) Followers(role market.Role, did string) []mcreconcile.Request {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []mcreconcile.Request
	for req, fl := range n.followers {
		if fl.Role == role && fl.DID == did {
			out = append(out, req)
		}
	}
	return out
}

// Refreshed returns how often did was asked to be listed again.
func (n *Network) Refreshed(did string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.refreshed[did]
}

// records returns every valid market record of the network's repos.
func (n *Network) records() []*market.Rec {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now
	if n.Now != nil {
		now = n.Now
	}
	var out []*market.Rec
	for _, r := range n.repos {
		r.mu.Lock()
		for _, rec := range r.records {
			_, col, _ := market.SplitURI(rec.URI)
			if !slices.Contains(market.Collections(), col) || lexicon.ValidateRecord(col, rec.Value) != nil {
				continue
			}
			k := rec.URI + "|" + rec.CID
			if _, ok := n.firstSeen[k]; !ok {
				n.firstSeen[k] = now()
			}
			if mr, err := market.NewRec(rec.URI, rec.CID, "", rec.Value, n.firstSeen[k]); err == nil {
				out = append(out, mr)
			}
		}
		r.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].URI < out[j].URI })
	return out
}

// Complete implements market.Reader.
func (n *Network) Complete() error { return n.Incomplete }

// Get implements market.Reader.
func (n *Network) Get(uri string) *market.Rec {
	for _, r := range n.records() {
		if r.URI == uri {
			return r
		}
	}
	return nil
}

// Children implements market.Reader.
func (n *Network) Children(uri, collection string) []*market.Rec {
	var out []*market.Rec
	for _, r := range n.records() {
		if r.Collection == collection && (r.Parent.URI == uri || (r.Accept != nil && r.Accept.Request.URI == uri)) {
			out = append(out, r)
		}
	}
	return out
}

// Requests implements market.Reader.
func (n *Network) Requests() []*market.Rec {
	var out []*market.Rec
	for _, r := range n.records() {
		if r.Request != nil {
			out = append(out, r)
		}
	}
	return out
}

// Vouches implements market.Reader.
func (n *Network) Vouches(voucher, subject, role string) bool {
	r := n.Get(market.URI(voucher, lexicon.Association, subject))
	return r != nil && r.Association != nil && r.Association.Subject == subject && slices.Contains(r.Association.Roles, role)
}

// Listed implements market.Reader: every repo was listed just now.
func (n *Network) Listed(string) time.Time {
	if n.Now != nil {
		return n.Now().Add(time.Nanosecond)
	}
	return time.Now()
}

// List implements market.Reader (it counts the calls as refreshes).
func (n *Network) List(did string) { n.Refresh(did) }

// Refresh implements market.Reader (it counts the calls).
func (n *Network) Refresh(did string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.refreshed[did]++
}

// Records returns the repo's records of collection.
func (r *Repo) Records(collection string) []pds.Record {
	return r.list(collection, 1<<30)
}
