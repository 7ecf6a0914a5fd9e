package pds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"golang.org/x/sync/errgroup"
)

// EnsureResult is what Ensure found and left on the PDS.
type EnsureResult struct {
	// Before is the record as read before writing; nil if it did not exist.
	Before *Record
	// After is the record read back after the write (Before if nothing was
	// written); nil if the record is absent.
	After *Record
	// Rev is the repo revision read after the write.
	Rev string
	// Wrote reports whether the record had to be written or deleted.
	Wrote bool
	// Skipped reports that nothing was decided for the record: the
	// caller's want answered false (EnsureOwned), or the prune found no
	// marker of its owner or a record that is kept (Prune).
	Skipped bool
}

// maxParallelReads bounds the concurrent getRecord calls of one batch.
const maxParallelReads = 8

// maxSwapRetries bounds how often a batch is re-read and retried because
// the repo moved between the reads and the write (another writer).
const maxSwapRetries = 5

// ensureOp is one caller waiting in a batch.
type ensureOp struct {
	collection, rkey string
	value            json.RawMessage // nil: the record must be absent
	// owner, if set, keeps the record: its marker (InventoryCollection)
	// is written or deleted in the same commit as the record.
	owner string
	// prune: delete the record only when owner's marker of it exists.
	prune bool
	// want, if set, is asked inside the batch before anything is decided;
	// false: nothing is written (Skipped).
	want func(context.Context) bool
	res  *EnsureResult
	err  error
	done chan struct{} // closed when res/err are set
	lead chan struct{} // closed when this caller becomes the leader
}

// batcher groups the Ensure calls of one repo (group commit): one caller,
// the leader, applies batches in its own goroutine and with its own
// context; calls that arrive meanwhile wait and go together in the next
// batch. When the leader's own call is done it hands the role to the
// oldest waiting caller. No goroutine outlives the calls, and nothing
// waits for a timer.
type batcher struct {
	mu      sync.Mutex
	pending []*ensureOp
	leading bool // some caller is the leader
}

// Ensure makes the record collection/rkey equal value, or absent when value
// is nil, and reports what was there before and what is there now, read
// back from the PDS (the write's own answer is not trusted for status).
//
// Calls for records of the same repo that overlap in time are applied as
// one com.atproto.repo.applyWrites batch (at most Options.MaxBatch writes;
// a record kept by an owner, EnsureOwned, counts two, for its marker). Each
// batch reads the repo's latest commit, then the current records, and
// writes only the ones that differ with swapCommit set to that commit: a
// write by anyone else in between makes the PDS refuse the batch
// (InvalidSwap) and the batch is read and decided again. This is a
// compare-and-swap on everything the batch observed, which includes each
// record's CID. When the PDS refuses a batch of several records as invalid,
// they are retried one by one so that one bad record fails alone.
func (c *Client) Ensure(ctx context.Context, collection, rkey string, value json.RawMessage) (*EnsureResult, error) {
	op, err := c.newOp(collection, rkey, value)
	if err != nil {
		return nil, err
	}
	return c.ensure(ctx, op)
}

// newOp validates a record and makes the op that ensures it.
func (c *Client) newOp(collection, rkey string, value json.RawMessage) (*ensureOp, error) {
	if err := validateKey(collection, rkey); err != nil {
		return nil, err
	}
	if value != nil {
		// Compare and write the value as the PDS stores it: with $type.
		m, err := recordMap(collection, rkey, value)
		if err != nil {
			return nil, err
		}
		if value, err = json.Marshal(m); err != nil {
			return nil, err
		}
	}
	return &ensureOp{collection: collection, rkey: rkey, value: value, done: make(chan struct{}), lead: make(chan struct{})}, nil
}

// ensure queues op for the next batch and waits for its result, applying
// batches itself while it is the leader.
func (c *Client) ensure(ctx context.Context, op *ensureOp) (*EnsureResult, error) {
	b := &c.batch
	b.mu.Lock()
	b.pending = append(b.pending, op)
	if !b.leading {
		b.leading = true
		close(op.lead)
	}
	b.mu.Unlock()

	select {
	case <-op.done:
		return op.res, op.err
	case <-op.lead:
	case <-ctx.Done():
		b.mu.Lock()
		defer b.mu.Unlock()
		select {
		case <-op.lead: // made leader meanwhile: pass the role on
			b.remove(op)
			b.handOff()
		default:
			b.remove(op)
		}
		return nil, ctx.Err()
	}
	// Leader: apply batches until this call's record is done.
	for {
		select {
		case <-op.done:
			b.mu.Lock()
			b.handOff()
			b.mu.Unlock()
			return op.res, op.err
		default:
		}
		c.flush(ctx, c.takeBatch())
	}
}

// handOff makes the oldest waiting caller the leader. Called with mu held.
func (b *batcher) handOff() {
	if len(b.pending) == 0 {
		b.leading = false
		return
	}
	close(b.pending[0].lead)
}

// remove drops op from the waiting calls. Called with mu held.
func (b *batcher) remove(op *ensureOp) {
	for i, p := range b.pending {
		if p == op {
			b.pending = append(b.pending[:i:i], b.pending[i+1:]...)
			return
		}
	}
}

// writes is the most writes op can make: its record, and its marker
// when it has an owner.
func (op *ensureOp) writes() int {
	if op.owner != "" {
		return 2
	}
	return 1
}

// takeBatch removes waiting calls, oldest first, that make at most
// maxBatch writes together (and at least one call), at most one per
// record (a later call for the same record waits for the next batch).
func (c *Client) takeBatch() []*ensureOp {
	b := &c.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	seen := map[[2]string]bool{}
	var ops, rest []*ensureOp
	writes := 0
	for _, op := range b.pending {
		k := [2]string{op.collection, op.rkey}
		if seen[k] || (len(ops) > 0 && writes+op.writes() > c.maxBatch) {
			rest = append(rest, op)
			continue
		}
		seen[k] = true
		ops = append(ops, op)
		writes += op.writes()
	}
	b.pending = rest
	return ops
}

// flush applies one batch and hands each caller its result.
func (c *Client) flush(ctx context.Context, ops []*ensureOp) {
	results, err := c.ensureBatch(ctx, ops)
	var invalid *InvalidRequestError
	if errors.As(err, &invalid) && len(ops) > 1 {
		for _, op := range ops {
			r, err := c.ensureBatch(ctx, []*ensureOp{op})
			op.err = err
			if err == nil {
				op.res = &r[0]
			}
			close(op.done)
		}
		return
	}
	for i, op := range ops {
		op.err = err
		if err == nil {
			op.res = &results[i]
		}
		close(op.done)
	}
}

// ensureBatch reads, decides and writes one batch; see Ensure and
// EnsureOwned.
func (c *Client) ensureBatch(ctx context.Context, ops []*ensureOp) ([]EnsureResult, error) {
	keys, marker := batchKeys(ops)
	for attempt := 1; ; attempt++ {
		head, err := c.latestCommit(ctx)
		if err != nil {
			return nil, err
		}
		read, err := c.getMany(ctx, keys)
		if err != nil {
			return nil, err
		}
		p := planBatch(ctx, ops, keys, marker, read, head.Rev)
		if len(p.writes) == 0 {
			return p.results, nil
		}
		_, err = c.applyWrites(ctx, p.writes, &head.CID)
		var se *StatusError
		switch {
		case err == nil:
		case errors.Is(err, ErrInvalidSwap) && attempt < maxSwapRetries:
			continue // the repo moved: read again
		case errors.As(err, &se) && se.StatusCode == http.StatusInternalServerError && attempt < 2:
			continue // the write may have happened: read again
		default:
			return nil, err
		}
		after, err := c.getMany(ctx, p.written)
		if err != nil {
			return nil, err
		}
		rev, err := c.LatestRev(ctx)
		if err != nil {
			return nil, err
		}
		for i := range p.results {
			p.results[i].Rev = rev
		}
		for j, i := range p.at {
			p.results[i].After, p.results[i].Wrote = after[j], true
		}
		return p.results, nil
	}
}

// batchKeys returns what a batch reads: each op's record, then the
// markers of the owned ones; marker[i] is the index in keys of op i's
// marker, or -1.
func batchKeys(ops []*ensureOp) (keys []Key, marker []int) {
	keys = make([]Key, 0, 2*len(ops))
	marker = make([]int, len(ops))
	for _, op := range ops {
		keys = append(keys, Key{op.collection, op.rkey})
	}
	for i, op := range ops {
		marker[i] = -1
		if op.owner != "" {
			marker[i] = len(keys)
			keys = append(keys, Key{InventoryCollection, MarkerKey(op.owner, Key{op.collection, op.rkey})})
		}
	}
	return keys, marker
}

// batchPlan is what one pass of a batch writes.
type batchPlan struct {
	// results are the ops' results if nothing is written.
	results []EnsureResult
	// writes go in one applyWrites commit.
	writes []Write
	// written are the records written, at[j] the op of written[j].
	written []Key
	at      []int
}

// planBatch decides the writes of ops from what was read at revision rev
// (read[i] for keys[i]): a record that differs from its op's value, and
// its marker; an op whose prune finds no marker, or whose want says no
// more, is skipped.
func planBatch(ctx context.Context, ops []*ensureOp, keys []Key, marker []int, read []*Record, rev string) batchPlan {
	p := batchPlan{results: make([]EnsureResult, len(ops))}
	for i, op := range ops {
		before := read[i]
		p.results[i] = EnsureResult{Before: before, After: before, Rev: rev}
		var mark *Record
		if marker[i] >= 0 {
			mark = read[marker[i]]
		}
		if (op.prune && mark == nil) || (op.want != nil && !op.want(ctx)) {
			p.results[i].Skipped = true
			continue
		}
		if w, ok := decide(op.collection, op.rkey, op.value, before); ok {
			p.writes, p.written, p.at = append(p.writes, w), append(p.written, keys[i]), append(p.at, i)
		}
		if marker[i] >= 0 {
			mk := keys[marker[i]]
			var want json.RawMessage
			if op.value != nil {
				want = markerValue(op.owner, Key{op.collection, op.rkey})
			}
			if w, ok := decide(mk.Collection, mk.RKey, want, mark); ok {
				p.writes = append(p.writes, w)
			}
		}
	}
	return p
}

// decide returns the write that makes collection/rkey hold value (absent
// when nil), given what was read (nil: absent), and false when nothing
// has to be written.
func decide(collection, rkey string, value json.RawMessage, before *Record) (Write, bool) {
	w := Write{Collection: collection, Rkey: rkey, Value: value}
	switch {
	case value == nil && before == nil, value != nil && before != nil && JSONEqual(before.Value, value):
		return w, false
	case value == nil:
		w.Op = OpDelete
	case before == nil:
		w.Op = OpCreate
	default:
		w.Op = OpUpdate
	}
	return w, true
}

// getMany reads records concurrently; a missing record is nil.
func (c *Client) getMany(ctx context.Context, keys []Key) ([]*Record, error) {
	out := make([]*Record, len(keys))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(maxParallelReads)
	for i, k := range keys {
		g.Go(func() error {
			r, err := c.GetRecord(gctx, k.Collection, k.RKey)
			if errors.Is(err, ErrRecordNotFound) {
				return nil
			}
			out[i] = r
			return err
		})
	}
	return out, g.Wait()
}

// commit is a repo's latest commit.
type commit struct {
	CID string `json:"cid"`
	Rev string `json:"rev"`
}

// latestCommit reads the repo's latest commit (com.atproto.sync.getLatestCommit).
func (c *Client) latestCommit(ctx context.Context) (*commit, error) {
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	did, _ := c.Info()
	var out commit
	if err := c.lex().LexDo(ctx, http.MethodGet, "", "com.atproto.sync.getLatestCommit", map[string]any{"did": did}, nil, &out); err != nil {
		return nil, fmt.Errorf("pds: getLatestCommit: %w", err)
	}
	return &out, nil
}
