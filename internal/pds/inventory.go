package pds

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
)

// InventoryCollection holds the inventory of what knotless keeps in a
// repo: one marker record per record an owner (an AtprotoRepo) keeps,
// written and deleted in the same applyWrites commit as the record itself.
// The marker is how a record whose AtprotoRecord was deleted while no
// provider ran is still found and deleted (Prune), and how a record of
// another writer in the same collection is told apart from knotless's
// (it has no marker, so no prune touches it).
const InventoryCollection = "dev.knotless.inventory"

// Key names a record of the repo.
type Key struct {
	Collection string
	RKey       string
}

func (k Key) String() string { return k.Collection + "/" + k.RKey }

// Marker is the value of an inventory record: owner keeps the record
// Collection/RKey.
type Marker struct {
	Owner      string `json:"owner"`
	Collection string `json:"collection"`
	RKey       string `json:"rkey"`
}

// MarkerKey is the record key of owner's marker of k: "m" and 32 hex
// digits of a SHA-256 over owner, collection and rkey (a collection and
// a record key together can be longer than a record key may be).
func MarkerKey(owner string, k Key) string {
	sum := sha256.Sum256([]byte(owner + "\x00" + k.Collection + "\x00" + k.RKey))
	return "m" + hex.EncodeToString(sum[:16])
}

// markerValue is the stored value of owner's marker of k, with its $type.
func markerValue(owner string, k Key) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"$type": InventoryCollection, "owner": owner, "collection": k.Collection, "rkey": k.RKey})
	return b
}

// EnsureOwned is Ensure for a record that owner keeps: the record and
// owner's marker of it are written (value != nil) or deleted (value nil)
// in the same commit, so there is no moment at which the PDS holds one
// of them without the other. want, if not nil, is asked inside the batch
// after the repo's commit and the records were read and before anything
// is decided; when it answers false nothing is written and the result
// says Skipped (the caller's object went meanwhile). The compare-and-swap
// on the commit makes a write that races with want's answer fail and be
// decided again.
func (c *Client) EnsureOwned(ctx context.Context, owner string, k Key, value json.RawMessage, want func(context.Context) bool) (*EnsureResult, error) {
	if err := checkOwned(owner, k); err != nil {
		return nil, err
	}
	op, err := c.newOp(k.Collection, k.RKey, value)
	if err != nil {
		return nil, err
	}
	op.owner, op.want = owner, want
	return c.ensure(ctx, op)
}

func checkOwned(owner string, k Key) error {
	if owner == "" {
		return &SpecError{Field: "owner", Reason: "must not be empty"}
	}
	if k.Collection == InventoryCollection {
		return &SpecError{Field: "collection", Reason: InventoryCollection + " is knotless's own inventory"}
	}
	return validateKey(k.Collection, k.RKey)
}

// Inventory lists the records owner keeps in the repo according to its
// markers. A marker whose key does not match its content (not written by
// knotless) is left out.
func (c *Client) Inventory(ctx context.Context, owner string) ([]Key, error) {
	recs, err := c.ListRecords(ctx, InventoryCollection, math.MaxInt)
	if err != nil {
		return nil, err
	}
	var out []Key
	for _, r := range recs {
		var m Marker
		if json.Unmarshal(r.Value, &m) != nil || m.Owner != owner {
			continue
		}
		k := Key{Collection: m.Collection, RKey: m.RKey}
		if checkOwned(owner, k) != nil || !strings.HasSuffix(r.URI, "/"+InventoryCollection+"/"+MarkerKey(owner, k)) {
			continue
		}
		out = append(out, k)
	}
	return out, nil
}

// Prune deletes, with their markers, the records of keys (nil: of owner's
// whole Inventory) that owner's inventory lists and keep does not keep.
// keep is asked again inside each batch, after the repo's commit and the
// records were read, so an AtprotoRecord that declares a key meanwhile
// keeps it; a key without owner's marker (a record of another writer, or
// one knotless never wrote) is never deleted. It returns how many records
// were deleted (their markers with them).
func (c *Client) Prune(ctx context.Context, owner string, keys []Key, keep func(context.Context, Key) bool) (int, error) {
	if owner == "" {
		return 0, &SpecError{Field: "owner", Reason: "must not be empty"}
	}
	if keys == nil {
		var err error
		if keys, err = c.Inventory(ctx, owner); err != nil {
			return 0, err
		}
	}
	var pruned atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	// As many callers as one batch holds, so that a large prune goes out
	// in full batches.
	g.SetLimit(c.maxBatch)
	for _, k := range keys {
		if checkOwned(owner, k) != nil || keep(ctx, k) {
			continue
		}
		g.Go(func() error {
			op := &ensureOp{collection: k.Collection, rkey: k.RKey, owner: owner, prune: true,
				want: func(ctx context.Context) bool { return !keep(ctx, k) }}
			op.done, op.lead = make(chan struct{}), make(chan struct{})
			res, err := c.ensure(gctx, op)
			if err != nil {
				return fmt.Errorf("pruning %s: %w", k, err)
			}
			if !res.Skipped {
				pruned.Add(1)
			}
			return nil
		})
	}
	err := g.Wait()
	return int(pruned.Load()), err
}
