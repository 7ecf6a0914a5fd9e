package pds_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/pds/pdstest"
)

func TestEnsureBatchesConcurrentCallsOfOneRepo(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})

	// The first call's batch waits in getLatestCommit while 49 more arrive.
	hold := make(chan struct{})
	f.HoldNextLatestCommit(hold)
	const n = 50
	results := make([]*pds.EnsureResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	ensure := func(i int) {
		defer wg.Done()
		results[i], errs[i] = c.Ensure(ctx, coll, fmt.Sprintf("k%02d", i), json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)))
	}
	wg.Add(n)
	go ensure(0)
	for f.Calls("com.atproto.sync.getLatestCommit") == 0 {
		time.Sleep(time.Millisecond)
	}
	for i := 1; i < n; i++ {
		go ensure(i)
	}
	time.Sleep(200 * time.Millisecond)
	close(hold)
	wg.Wait()

	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Ensure k%02d: %v", i, errs[i])
		}
		r := results[i]
		got, err := c.GetRecord(ctx, coll, fmt.Sprintf("k%02d", i))
		if err != nil || !r.Wrote || r.Before != nil || r.After == nil || r.After.CID != got.CID || r.Rev == "" {
			t.Fatalf("k%02d: result %+v, PDS has %+v (%v)", i, r, got, err)
		}
	}
	batches := f.ApplyBatches()
	if len(batches) != 2 || batches[0] != 1 || batches[1] != n-1 {
		t.Fatalf("applyWrites batches %v, want [1 %d]", batches, n-1)
	}
}

func TestEnsureWritesOnlyWhatDiffersAndDeletes(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})

	first, err := c.Ensure(ctx, coll, "a", json.RawMessage(`{"n":1}`))
	if err != nil || !first.Wrote {
		t.Fatalf("create: %+v, %v", first, err)
	}
	// Same value, with and without $type: nothing to write.
	for _, v := range []string{`{"n":1}`, `{"$type":"` + coll + `","n":1}`} {
		again, err := c.Ensure(ctx, coll, "a", json.RawMessage(v))
		if err != nil || again.Wrote || again.After.CID != first.After.CID {
			t.Fatalf("unchanged %s: %+v, %v", v, again, err)
		}
	}
	upd, err := c.Ensure(ctx, coll, "a", json.RawMessage(`{"n":2}`))
	if err != nil || !upd.Wrote || upd.Before.CID != first.After.CID || upd.After.CID == first.After.CID {
		t.Fatalf("update: %+v, %v", upd, err)
	}
	del, err := c.Ensure(ctx, coll, "a", nil)
	if err != nil || !del.Wrote || del.After != nil || del.Before == nil {
		t.Fatalf("delete: %+v, %v", del, err)
	}
	gone, err := c.Ensure(ctx, coll, "a", nil)
	if err != nil || gone.Wrote {
		t.Fatalf("delete of a missing record: %+v, %v", gone, err)
	}
	if got := f.Calls("com.atproto.repo.applyWrites"); got != 3 {
		t.Fatalf("%d applyWrites calls, want 3 (create, update, delete)", got)
	}
	// Invalid input is refused before anything is sent.
	var spec *pds.SpecError
	if _, err := c.Ensure(ctx, coll, "a", json.RawMessage(`{"f":1.5}`)); !errors.As(err, &spec) {
		t.Fatalf("want SpecError, got %v", err)
	}
}

func TestEnsureRereadsWhenTheRepoMovesUnderIt(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})
	if _, err := c.Ensure(ctx, coll, "a", json.RawMessage(`{"n":1}`)); err != nil {
		t.Fatal(err)
	}
	// Another client rewrites the record between Ensure's read and write.
	other := json.RawMessage(`{"$type":"` + coll + `","n":99}`)
	f.RaceNextApply(coll, "a", other)
	res, err := c.Ensure(ctx, coll, "a", json.RawMessage(`{"n":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if res.Before == nil || res.Before.CID != pdstest.CIDOf(other) {
		t.Fatalf("Before = %+v, want the other client's record %s", res.Before, pdstest.CIDOf(other))
	}
	got, _ := c.GetRecord(ctx, coll, "a")
	if res.After.CID != got.CID || string(got.Value) == string(other) {
		t.Fatalf("After %+v, PDS has %+v", res.After, got)
	}
	if batches := f.ApplyBatches(); len(batches) != 3 { // create, refused swap, retry
		t.Fatalf("applyWrites calls %v, want 3", batches)
	}
}

func TestEnsureInvalidRecordFailsAloneInItsBatch(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})
	hold := make(chan struct{})
	f.HoldNextLatestCommit(hold)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	wg.Add(4)
	go func() { defer wg.Done(); _, errs[0] = c.Ensure(ctx, coll, "first", json.RawMessage(`{"n":0}`)) }()
	for f.Calls("com.atproto.sync.getLatestCommit") == 0 {
		time.Sleep(time.Millisecond)
	}
	go func() { defer wg.Done(); _, errs[1] = c.Ensure(ctx, coll, "good1", json.RawMessage(`{"n":1}`)) }()
	go func() {
		defer wg.Done()
		_, errs[2] = c.Ensure(ctx, coll, "bad", json.RawMessage(`{"lexiconInvalid":true}`))
	}()
	go func() { defer wg.Done(); _, errs[3] = c.Ensure(ctx, coll, "good2", json.RawMessage(`{"n":2}`)) }()
	time.Sleep(100 * time.Millisecond)
	close(hold)
	wg.Wait()
	var inv *pds.InvalidRequestError
	if errs[0] != nil || errs[1] != nil || errs[3] != nil || !errors.As(errs[2], &inv) || inv.Name != "InvalidRecord" {
		t.Fatalf("errors %v; want only the bad record to fail with InvalidRecord", errs)
	}
	for _, k := range []string{"good1", "good2"} {
		if _, err := c.GetRecord(ctx, coll, k); err != nil {
			t.Fatalf("%s not written: %v", k, err)
		}
	}
}

func TestEnsureCallersThatGiveUpDoNotStallOthers(t *testing.T) {
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})
	hold := make(chan struct{})
	defer func() {
		select {
		case <-hold:
		default:
			close(hold)
		}
	}()
	f.HoldNextLatestCommit(hold)

	// A leads and is stuck in the PDS; B and C wait behind it.
	ctxA, cancelA := context.WithCancel(context.Background())
	ctxB, cancelB := context.WithCancel(context.Background())
	errA, errB, errC := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	go func() { _, err := c.Ensure(ctxA, coll, "a", json.RawMessage(`{"n":1}`)); errA <- err }()
	for f.Calls("com.atproto.sync.getLatestCommit") == 0 {
		time.Sleep(time.Millisecond)
	}
	go func() { _, err := c.Ensure(ctxB, coll, "b", json.RawMessage(`{"n":2}`)); errB <- err }()
	time.Sleep(50 * time.Millisecond)
	go func() { _, err := c.Ensure(context.Background(), coll, "c", json.RawMessage(`{"n":3}`)); errC <- err }()
	time.Sleep(50 * time.Millisecond)

	// B gives up while waiting; then the leader A gives up inside its request.
	cancelB()
	if err := <-errB; !errors.Is(err, context.Canceled) {
		t.Fatalf("B: %v, want context.Canceled", err)
	}
	cancelA()
	if err := <-errA; !errors.Is(err, context.Canceled) {
		t.Fatalf("A: %v, want context.Canceled", err)
	}
	// C took over as leader and is written; B's record was not.
	select {
	case err := <-errC:
		if err != nil {
			t.Fatalf("C: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("C never finished: nobody took over the batch")
	}
	ctx := context.Background()
	if _, err := c.GetRecord(ctx, coll, "c"); err != nil {
		t.Fatalf("c not written: %v", err)
	}
	if _, err := c.GetRecord(ctx, coll, "b"); !errors.Is(err, pds.ErrRecordNotFound) {
		t.Fatalf("b was written after its caller gave up: %v", err)
	}
}
