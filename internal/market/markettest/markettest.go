// Package markettest is an in-memory market.Publisher for controller
// tests: it keeps records by collection and rkey, checks values against
// their lexicon as the real one does, and counts writes.
package markettest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/pds"
)

// Repo is one repo's records.
type Repo struct {
	DID string

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

// ListRecords implements market.Publisher.
func (r *Repo) ListRecords(_ context.Context, collection string, limit int) ([]pds.Record, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []pds.Record
	for _, rec := range r.records {
		if len(out) < limit && strings.HasPrefix(rec.URI, r.uri(collection, "")) {
			out = append(out, rec)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].URI < out[j].URI })
	return out, nil
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
	r.records[collection+"/"+rkey] = pds.Record{URI: r.uri(collection, rkey), CID: "bafyother", Value: raw}
}
