package firehose

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/events"
	"github.com/go-logr/logr"
)

const testCollection = "dev.knotless.test.note"

// testStream is a stream with no connection, for driving handlers.
func testStream(t *testing.T, dir identity.Directory) *stream {
	t.Helper()
	h, err := NewHub(Options{Directory: dir, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	h.opts.Metrics = m
	return newStream(h, "http://pds.invalid")
}

func testSub(s *stream, f Filter) *Subscription {
	sub := newSubscription(f, 100, State{Cursor: 0})
	sub.full = false
	sub.stream = s
	s.subs[sub] = struct{}{}
	return sub
}

func note(text string) map[string]any {
	return map[string]any{"$type": testCollection, "text": text}
}

func TestCommitsAreVerifiedAndFiltered(t *testing.T) {
	alice := newTestRepo(t, "did:plc:alice")
	bob := newTestRepo(t, "did:plc:bob")
	dir := identity.NewMockDirectory()
	dir.Insert(alice.identity(nil))
	dir.Insert(bob.identity(nil))
	s := testStream(t, dir)
	onlyAlice := testSub(s, Filter{Collections: []string{testCollection}, DIDs: []string{alice.did}})
	everyone := testSub(s, Filter{Collections: []string{testCollection}})
	subs := []*Subscription{onlyAlice, everyone}
	ctx := context.Background()

	seq := int64(0)
	var applied []*comatproto.SyncSubscribeRepos_Commit
	feed := func(r *testRepo, ops ...testOp) {
		seq++
		msg := r.commit(ops...)
		s.handleCommit(ctx, seq, msg, subs)
		applied = append(applied, msg)
	}
	feed(alice, testOp{"create", testCollection + "/a1", note("one")})
	feed(alice, testOp{"create", "dev.knotless.other/x", map[string]any{"$type": "dev.knotless.other"}})
	feed(bob, testOp{"create", testCollection + "/b1", note("bob")})
	feed(alice, testOp{"update", testCollection + "/a1", note("two")})
	feed(alice, testOp{"create", testCollection + "/a2", note("three")})
	feed(alice, testOp{"delete", testCollection + "/a2", nil})

	st, _, _ := onlyAlice.Snapshot()
	if len(st.Records) != 1 {
		t.Fatalf("alice's watch has %d records, want 1: %v", len(st.Records), st.Records)
	}
	r, ok := st.Records["at://did:plc:alice/"+testCollection+"/a1"]
	if !ok {
		t.Fatalf("a1 missing: %v", st.Records)
	}
	var v map[string]any
	if err := json.Unmarshal(r.Value, &v); err != nil || v["text"] != "two" {
		t.Fatalf("a1 value %s (%v), want text two", r.Value, err)
	}
	if st.Matched != 4 || st.Seen != 5 || st.Errors != 0 {
		t.Fatalf("alice's watch counts matched=%d seen=%d errors=%d, want 4, 5, 0", st.Matched, st.Seen, st.Errors)
	}
	st, _, _ = everyone.Snapshot()
	if len(st.Records) != 2 || st.Matched != 5 {
		t.Fatalf("everyone's watch: %d records, matched %d; want 2, 5", len(st.Records), st.Matched)
	}

	// Replaying applied commits (a reconnect from an older cursor) changes
	// nothing: their revs are at or below the repo's applied rev.
	before, _, v1 := everyone.Snapshot()
	for i, msg := range applied {
		s.handleCommit(ctx, 100+int64(i), msg, subs)
	}
	after, _, v2 := everyone.Snapshot()
	if v1 != v2 || after.Matched != before.Matched || after.Errors != 0 {
		t.Fatalf("replayed commits were applied again: matched %d -> %d, errors %d", before.Matched, after.Matched, after.Errors)
	}
}

func TestForgedAndCorruptCommitsAreRejectedAndCounted(t *testing.T) {
	alice := newTestRepo(t, "did:plc:alice")
	other, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	dir := identity.NewMockDirectory()
	dir.Insert(alice.identity(other)) // the directory knows another key
	s := testStream(t, dir)
	sub := testSub(s, Filter{Collections: []string{testCollection}})
	ctx := context.Background()

	s.handleCommit(ctx, 1, alice.commit(testOp{"create", testCollection + "/a1", note("forged")}), []*Subscription{sub})
	corrupt := alice.commit(testOp{"create", testCollection + "/a2", note("corrupt")})
	corrupt.Blocks = corrupt.Blocks[:len(corrupt.Blocks)/2]
	s.handleCommit(ctx, 2, corrupt, []*Subscription{sub})
	// A commit whose op points at another record than the tree holds.
	lying := alice.commit(testOp{"create", testCollection + "/a3", note("x")})
	lying.Ops[0].Cid = corruptLink(t, alice)
	s.handleCommit(ctx, 3, lying, []*Subscription{sub})

	st, _, _ := sub.Snapshot()
	if len(st.Records) != 0 || st.Errors != 3 {
		t.Fatalf("records %v errors %d; want none and 3", st.Records, st.Errors)
	}
	if got := counterValue(t, s.hub.opts.Metrics.Rejected.WithLabelValues(otherSource)); got != 3 {
		t.Fatalf("rejected metric %v, want 3", got)
	}
}

func TestPrevDataMismatchResyncsTheRepo(t *testing.T) {
	alice := newTestRepo(t, "did:plc:alice")
	dir := identity.NewMockDirectory()
	dir.Insert(alice.identity(nil))
	s := testStream(t, dir)
	sub := testSub(s, Filter{Collections: []string{testCollection}})
	ctx := context.Background()

	s.handleCommit(ctx, 1, alice.commit(testOp{"create", testCollection + "/a1", note("one")}), []*Subscription{sub})
	// Commit 2 is lost in transit; commit 3's prevData is commit 2's tree.
	_ = alice.commit(testOp{"create", testCollection + "/a2", note("two")})
	s.handleCommit(ctx, 3, alice.commit(testOp{"create", testCollection + "/a3", note("three")}), []*Subscription{sub})

	req, _, ok := s.resync.next(time.Now())
	if !ok || req.sub != sub || req.did != alice.did || req.reason != ResyncPrevDataMismatch {
		t.Fatalf("queued resync %+v (%v), want alice's repo for PrevDataMismatch", req, ok)
	}
	st, h, _ := sub.Snapshot()
	if !h.Resyncing {
		t.Fatal("health does not say resyncing")
	}
	// Until the listing is done the cursor stays before the event that
	// asked for it, so a restart replays it.
	sub.settle(3, sub.gen)
	st, _, _ = sub.Snapshot()
	if st.Cursor != 2 {
		t.Fatalf("cursor %d while the resync is owed, want 2", st.Cursor)
	}
	if !sub.replaceRepo(alice.did, &listing{rev: st.Repos[alice.did].Rev, records: []Record{{URI: "at://" + alice.did + "/" + testCollection + "/a2", CID: "x"}}}) {
		t.Fatal("listing refused")
	}
	sub.resynced(alice.did, ResyncPrevDataMismatch)
	sub.settle(3, sub.gen)
	st, h, _ = sub.Snapshot()
	if h.Resyncing || st.Cursor != 3 || st.LastResync == nil || st.LastResync.Reason != ResyncPrevDataMismatch {
		t.Fatalf("after the resync: resyncing=%v cursor=%d last=%+v", h.Resyncing, st.Cursor, st.LastResync)
	}
	// A listing older than what was applied meanwhile is refused.
	s.handleCommit(ctx, 4, alice.commit(testOp{"create", testCollection + "/a4", note("four")}), []*Subscription{sub})
	if sub.replaceRepo(alice.did, &listing{rev: "2222222222222"}) {
		t.Fatal("a stale listing replaced newer records")
	}
}

// BenchmarkVerifyCommit measures what every commit costs before a watch
// sees it: CAR parse, MST and prevData checks, signature, value decoding.
func BenchmarkVerifyCommit(b *testing.B) {
	t := &testing.T{}
	r := newTestRepo(t, "did:plc:bench")
	dir := identity.NewMockDirectory()
	dir.Insert(r.identity(nil))
	// A first commit: a CAR as small as a PDS sends (commit, one MST node,
	// the record); testRepo puts every block of the repo into each CAR.
	msg := r.commit(testOp{"create", testCollection + "/new", note("new")})
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if _, err := verifyCommit(ctx, dir, msg, func(string) bool { return true }); err != nil {
			b.Fatal(err)
		}
	}
}

func TestSyncEventListsOnlyARepoThatMovedOn(t *testing.T) {
	alice := newTestRepo(t, "did:plc:alice")
	dir := identity.NewMockDirectory()
	dir.Insert(alice.identity(nil))
	s := testStream(t, dir)
	sub := testSub(s, Filter{Collections: []string{testCollection}})
	first := alice.commit(testOp{"create", testCollection + "/a1", note("one")})
	s.handleCommit(context.Background(), 1, first, []*Subscription{sub})
	syncOf := func(c *comatproto.SyncSubscribeRepos_Commit, seq int64) job {
		return job{seq: seq, subs: []*Subscription{sub}, ev: &events.XRPCStreamEvent{RepoSync: &comatproto.SyncSubscribeRepos_Sync{
			Did: alice.did, Rev: c.Rev, Blocks: c.Blocks, Seq: seq, Time: c.Time,
		}}}
	}
	// A #sync at the applied commit (a PDS sends one for a new account).
	s.handle(context.Background(), syncOf(first, 2))
	if req, _, ok := s.resync.next(time.Now()); ok {
		t.Fatalf("a #sync at the applied rev queued %+v", req)
	}
	// A #sync at a commit the watch has not seen: list the repo.
	s.handle(context.Background(), syncOf(alice.commit(testOp{"create", testCollection + "/a2", note("two")}), 3))
	if req, _, ok := s.resync.next(time.Now()); !ok || req.reason != ResyncSync || req.did != alice.did {
		t.Fatalf("queued %+v (%v), want a Sync listing of alice", req, ok)
	}
}
