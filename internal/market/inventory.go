package market

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/knotless-dev/knotless/internal/pds"
)

// maxOwnRecords bounds the records of one collection an inventory lists
// (a participant keeps a few per VM: finished deals are deleted).
const maxOwnRecords = 10000

// Inventories remember, per requester or bidder, the market records of its
// own repo that it wrote: the state it acts on. The repo is the truth: an
// inventory is listed from the PDS (listRecords) when it is first used,
// after the repo's DID changed and every TTL, and is updated by every
// write made through it, so a decision never rests on a cache of kcp
// objects that may lag behind a write (two accepts could otherwise take
// the last capacity twice). Only the leader writes to a repo, so between
// listings the inventory is exact.
type Inventories struct {
	// TTL is how long a listing is trusted (default 2 min).
	TTL time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time

	mu   sync.Mutex
	byID map[string]*inventory
}

type inventory struct {
	mu     sync.Mutex
	did    string
	loaded time.Time
	// recs are by collection, then rkey.
	recs map[string]map[string]pds.Record
}

// Inventory is one participant's own records, read and written through
// its repo's Publisher.
type Inventory struct {
	inv   *inventory
	pub   Publisher
	owner string
}

func (s *Inventories) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Open returns the inventory of the participant key (cluster, namespace
// and name of its object) that writes as owner into did's repo, listing
// collections from the repo when it is not known or stale. Only records
// whose key says owner wrote them are kept.
func (s *Inventories) Open(ctx context.Context, key, did, owner string, pub Publisher, collections ...string) (*Inventory, error) {
	s.mu.Lock()
	if s.byID == nil {
		s.byID = map[string]*inventory{}
	}
	inv := s.byID[key]
	if inv == nil {
		inv = &inventory{}
		s.byID[key] = inv
	}
	s.mu.Unlock()

	inv.mu.Lock()
	defer inv.mu.Unlock()
	ttl := s.TTL
	if ttl <= 0 {
		ttl = 2 * time.Minute
	}
	if inv.recs == nil || inv.did != did || s.now().Sub(inv.loaded) >= ttl {
		recs := map[string]map[string]pds.Record{}
		for _, col := range collections {
			list, err := pub.ListRecords(ctx, col, maxOwnRecords)
			if err != nil {
				return nil, err
			}
			recs[col] = map[string]pds.Record{}
			for _, r := range list {
				rdid, rcol, rkey := SplitURI(r.URI)
				if rdid == did && rcol == col && ownedBy(owner, rkey) {
					recs[col][rkey] = r
				}
			}
		}
		inv.recs, inv.did, inv.loaded = recs, did, s.now()
	}
	return &Inventory{inv: inv, pub: pub, owner: owner}, nil
}

// Forget drops the inventory of key (its object is gone).
func (s *Inventories) Forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, key)
}

// ownedBy reports whether rkey is a record key owner writes (a request
// key or a derived key of owner).
func ownedBy(owner, rkey string) bool {
	return Owns(owner, rkey) || strings.HasPrefix(rkey, prefixRequest+owner+"-")
}

// List returns the records of collection, by record key order.
func (i *Inventory) List(collection string) []pds.Record {
	i.inv.mu.Lock()
	defer i.inv.mu.Unlock()
	m := i.inv.recs[collection]
	out := make([]pds.Record, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[k])
	}
	return out
}

// Get returns the record collection/rkey, or nil.
func (i *Inventory) Get(collection, rkey string) *pds.Record {
	i.inv.mu.Lock()
	defer i.inv.mu.Unlock()
	r, ok := i.inv.recs[collection][rkey]
	if !ok {
		return nil
	}
	return &r
}

// Put makes the record collection/rkey equal value (nil: absent) through
// the Publisher, which validates it against its lexicon and reads it
// back, and keeps what was read back. It returns the record now there
// (nil when absent).
func (i *Inventory) Put(ctx context.Context, collection, rkey string, value any) (*pds.Record, error) {
	res, err := i.pub.Publish(ctx, collection, rkey, value)
	if err != nil {
		return nil, err
	}
	i.inv.mu.Lock()
	defer i.inv.mu.Unlock()
	if i.inv.recs[collection] == nil {
		i.inv.recs[collection] = map[string]pds.Record{}
	}
	if res.After == nil {
		delete(i.inv.recs[collection], rkey)
		return nil, nil
	}
	i.inv.recs[collection][rkey] = *res.After
	return res.After, nil
}

// Delete removes the record collection/rkey if it is there.
func (i *Inventory) Delete(ctx context.Context, collection, rkey string) error {
	if i.Get(collection, rkey) == nil {
		return nil
	}
	_, err := i.Put(ctx, collection, rkey, nil)
	return err
}

// Owner is the owner part of the inventory's record keys.
func (i *Inventory) Owner() string { return i.owner }
