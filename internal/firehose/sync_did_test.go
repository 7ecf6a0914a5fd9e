package firehose

import (
	"context"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/events"
)

// TestSyncOfAnotherReposCommitIsRejected (R20, from review): a #sync whose CAR is mallory's own validly signed commit but whose Did
// names alice: VerifySyncMessage checks the signature of commit.DID only,
// handle discards the commit, and alice's repo is relisted (any DID, any
// number of times, with a rev mallory picks).
func TestSyncOfAnotherReposCommitIsRejected(t *testing.T) {
	alice := newTestRepo(t, "did:plc:alice")
	mallory := newTestRepo(t, "did:plc:mallory")
	dir := identity.NewMockDirectory()
	dir.Insert(alice.identity(nil))
	dir.Insert(mallory.identity(nil))
	s := testStream(t, dir)
	sub := testSub(s, Filter{Collections: []string{testCollection}})
	s.handleCommit(context.Background(), 1, alice.commit(testOp{"create", testCollection + "/a1", note("one")}), []*Subscription{sub})
	m := mallory.commit(testOp{"create", testCollection + "/m1", note("m")})
	s.handle(context.Background(), job{seq: 2, subs: []*Subscription{sub}, ev: &events.XRPCStreamEvent{RepoSync: &comatproto.SyncSubscribeRepos_Sync{
		Did: alice.did, Rev: "zzzzzzzzzzzzz", Blocks: m.Blocks, Seq: 2, Time: m.Time,
	}}})
	if req, _, ok := s.resync.next(time.Now()); ok {
		t.Fatalf("mallory's signed #sync for alice queued %+v", req)
	}
}
