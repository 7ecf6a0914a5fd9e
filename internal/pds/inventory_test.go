package pds_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/pds/pdstest"
)

const owner = "repo-uid-1"

func markerOf(owner string, k pds.Key) string {
	return pds.InventoryCollection + "/" + pds.MarkerKey(owner, k)
}

func keep(keys ...pds.Key) func(context.Context, pds.Key) bool {
	return func(_ context.Context, k pds.Key) bool { return slices.Contains(keys, k) }
}

// A record an owner keeps and its marker are written in one commit, and
// deleted in one commit: no moment holds one without the other, so a kill
// of the provider between the PDS write and anything after it cannot leave
// a record knotless wrote without its marker.
func TestEnsureOwnedWritesRecordAndMarkerInOneCommit(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})
	k := pds.Key{Collection: coll, RKey: "a"}

	res, err := c.EnsureOwned(ctx, owner, k, json.RawMessage(`{"n":1}`), nil)
	if err != nil || !res.Wrote || res.After == nil || res.Skipped {
		t.Fatalf("create: %+v, %v", res, err)
	}
	if batches := f.ApplyBatches(); !slices.Equal(batches, []int{2}) {
		t.Fatalf("applyWrites batches %v, want one commit of the record and its marker", batches)
	}
	value, _, ok := f.Record(pds.InventoryCollection, pds.MarkerKey(owner, k))
	var m map[string]string
	if !ok || json.Unmarshal(value, &m) != nil || m["owner"] != owner || m["collection"] != coll || m["rkey"] != "a" || m["$type"] != pds.InventoryCollection {
		t.Fatalf("marker %s (%v)", value, ok)
	}
	// Unchanged: nothing is written. Changed: only the record.
	if res, err := c.EnsureOwned(ctx, owner, k, json.RawMessage(`{"n":1}`), nil); err != nil || res.Wrote {
		t.Fatalf("unchanged: %+v, %v", res, err)
	}
	if res, err := c.EnsureOwned(ctx, owner, k, json.RawMessage(`{"n":2}`), nil); err != nil || !res.Wrote {
		t.Fatalf("update: %+v, %v", res, err)
	}
	if batches := f.ApplyBatches(); !slices.Equal(batches, []int{2, 1}) {
		t.Fatalf("applyWrites batches %v, want [2 1]", batches)
	}
	// A marker deleted behind knotless's back is written again.
	f.SetRecord(pds.InventoryCollection, pds.MarkerKey(owner, k), nil)
	if _, err := c.EnsureOwned(ctx, owner, k, json.RawMessage(`{"n":2}`), nil); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := f.Record(pds.InventoryCollection, pds.MarkerKey(owner, k)); !ok {
		t.Fatal("the marker was not restored")
	}
	// Deleted: record and marker in one commit.
	if res, err := c.EnsureOwned(ctx, owner, k, nil, nil); err != nil || !res.Wrote || res.After != nil {
		t.Fatalf("delete: %+v, %v", res, err)
	}
	if batches := f.ApplyBatches(); batches[len(batches)-1] != 2 {
		t.Fatalf("applyWrites batches %v, want the deletion in one commit of two writes", batches)
	}
	if keys := f.Keys(); len(keys) != 0 {
		t.Fatalf("the PDS still has %v", keys)
	}
	// The inventory is knotless's own: no record may be kept in it.
	var spec *pds.SpecError
	if _, err := c.EnsureOwned(ctx, owner, pds.Key{Collection: pds.InventoryCollection, RKey: "x"}, json.RawMessage(`{}`), nil); !errors.As(err, &spec) {
		t.Fatalf("a record in the inventory collection: %v, want a SpecError", err)
	}
}

// want is asked inside the batch: an object that went meanwhile writes
// nothing.
func TestEnsureOwnedAsksWantInsideTheBatch(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})
	res, err := c.EnsureOwned(ctx, owner, pds.Key{Collection: coll, RKey: "a"}, json.RawMessage(`{"n":1}`), func(context.Context) bool { return false })
	if err != nil || !res.Skipped || res.Wrote {
		t.Fatalf("%+v, %v: want Skipped", res, err)
	}
	if n := f.Calls("com.atproto.repo.applyWrites"); n != 0 || len(f.Keys()) != 0 {
		t.Fatalf("%d applyWrites, PDS has %v", n, f.Keys())
	}
}

// Prune deletes what the owner's markers list and nothing is kept for:
// never a record of another writer in the same collection (no marker),
// never a record another owner keeps (its own markers), never one still
// kept, and never a record behind a forged marker.
func TestPruneDeletesOnlyWhatTheOwnersInventoryLists(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})
	gone, kept := pds.Key{Collection: coll, RKey: "gone"}, pds.Key{Collection: coll, RKey: "kept"}
	theirs := pds.Key{Collection: coll, RKey: "theirs"}
	for _, k := range []pds.Key{gone, kept} {
		if _, err := c.EnsureOwned(ctx, owner, k, json.RawMessage(`{"n":1}`), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.EnsureOwned(ctx, "other-owner", theirs, json.RawMessage(`{"n":1}`), nil); err != nil {
		t.Fatal(err)
	}
	// A record of another writer, in the same collection.
	f.SetRecord(coll, "foreign", json.RawMessage(`{"$type":"`+coll+`","by":"someone else"}`))
	// A forged marker: right content, wrong key.
	f.SetRecord(coll, "forged", json.RawMessage(`{"$type":"`+coll+`"}`))
	f.SetRecord(pds.InventoryCollection, "mfake", json.RawMessage(`{"$type":"`+pds.InventoryCollection+`","owner":"`+owner+`","collection":"`+coll+`","rkey":"forged"}`))

	inv, err := c.Inventory(ctx, owner)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(inv, func(a, b pds.Key) int { return strings.Compare(a.RKey, b.RKey) })
	if !slices.Equal(inv, []pds.Key{gone, kept}) {
		t.Fatalf("inventory %v, want [gone kept]", inv)
	}
	n, err := c.Prune(ctx, owner, nil, keep(kept))
	if err != nil || n != 1 {
		t.Fatalf("pruned %d, %v; want 1", n, err)
	}
	want := []string{coll + "/foreign", coll + "/forged", coll + "/kept", coll + "/theirs",
		markerOf(owner, kept), markerOf("other-owner", theirs), pds.InventoryCollection + "/mfake"}
	slices.Sort(want)
	if got := f.Keys(); !slices.Equal(got, want) {
		t.Fatalf("PDS has\n%v\nwant\n%v", got, want)
	}
	// Named keys: only those with the owner's marker go.
	n, err = c.Prune(ctx, owner, []pds.Key{kept, {Collection: coll, RKey: "foreign"}}, keep())
	if err != nil || n != 1 {
		t.Fatalf("pruned %d, %v; want 1 (kept, not foreign)", n, err)
	}
	if _, _, ok := f.Record(coll, "foreign"); !ok {
		t.Fatal("a prune deleted another writer's record")
	}
	if _, _, ok := f.Record(coll, "kept"); ok {
		t.Fatal("kept is still there")
	}
}

// An AtprotoRecord that declares a key while its prune waits keeps it:
// keep is asked again inside the batch.
func TestPruneAsksKeepInsideTheBatch(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})
	k := pds.Key{Collection: coll, RKey: "a"}
	if _, err := c.EnsureOwned(ctx, owner, k, json.RawMessage(`{"n":1}`), nil); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	calls := 0
	// Not kept when the prune looks first, kept when its batch decides.
	flip := func(context.Context, pds.Key) bool {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return calls > 1
	}
	n, err := c.Prune(ctx, owner, nil, flip)
	if err != nil || n != 0 {
		t.Fatalf("pruned %d, %v; want 0", n, err)
	}
	if _, _, ok := f.Record(coll, "a"); !ok {
		t.Fatal("the record was pruned although it was kept when the batch decided")
	}
}

// A large prune goes out in full batches of at most MaxBatch writes, a
// record and its marker counting two.
func TestPruneBatchesWithinTheWriteLimit(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	c, err := pds.Connect(ctx, f.URL(), pdstest.Handle, pdstest.Password, pds.Options{Policy: local, Store: &countingStore{}, MaxBatch: 10})
	if err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	f.HoldNextLatestCommit(hold)
	var wg sync.WaitGroup
	errs := make([]error, 25)
	for i := range 25 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = c.EnsureOwned(ctx, owner, pds.Key{Collection: coll, RKey: fmt.Sprintf("k%02d", i)}, json.RawMessage(`{"n":1}`), nil)
		}()
	}
	time.Sleep(200 * time.Millisecond)
	close(hold)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range f.ApplyBatches() {
		if b > 10 || b%2 != 0 {
			t.Fatalf("applyWrites batches %v: want at most 10 writes, records with their markers", f.ApplyBatches())
		}
	}
	before := len(f.ApplyBatches())
	n, err := c.Prune(ctx, owner, nil, keep())
	if err != nil || n != 25 {
		t.Fatalf("pruned %d, %v; want 25", n, err)
	}
	batches := f.ApplyBatches()[before:]
	for _, b := range batches {
		if b > 10 {
			t.Fatalf("prune batches %v, want at most 10 writes each", batches)
		}
	}
	if len(f.Keys()) != 0 {
		t.Fatalf("PDS has %v", f.Keys())
	}
}
