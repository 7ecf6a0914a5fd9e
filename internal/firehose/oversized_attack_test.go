package firehose

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// hugeDID is a stranger's repo whose listRecords never ends.
const hugeDID = "did:plc:huge"

// hugeRepoSource is a fake source for alice that also carries hugeDID:
// listRepos names both, and hugeDID's listRecords pages never end. hits
// counts the requests about hugeDID.
func hugeRepoSource(t *testing.T, alice *testRepo, hits *atomic.Int64) *fakeSource {
	repos, _ := json.Marshal(map[string]any{"repos": []map[string]any{
		{"did": hugeDID, "head": "bafy", "rev": "x"},
		{"did": alice.did, "head": "bafy", "rev": "x"},
	}})
	page := recordsPage(hugeDID, 100, 10, "more")
	return newWrappedFakeSource(t, alice, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			q := req.URL.Query()
			switch {
			case req.URL.Path == "/xrpc/com.atproto.sync.listRepos":
				_, _ = w.Write(repos)
			case q.Get("did") == hugeDID || q.Get("repo") == hugeDID:
				hits.Add(1)
				if req.URL.Path == "/xrpc/com.atproto.sync.getLatestCommit" {
					_ = json.NewEncoder(w).Encode(map[string]string{"cid": "bafy", "rev": "3333333333333"})
					return
				}
				_, _ = w.Write(page)
			default:
				next.ServeHTTP(w, req)
			}
		})
	})
}

// TestAttackOversizedRepoDoesNotStallTheSource: a source carries a
// stranger's repo past one repo's bounds and alice's honest repo. The
// full listing of the source leaves the stranger's repo out (none of its
// records kept, ListingTooLarge shown while it stays owed, not asked again
// soon) and completes for alice: her record arrives and the subscription
// is no longer Full, so a consumer can decide. Before, the whole source's
// listing failed and was retried an hour later, never complete.
func TestAttackOversizedRepoDoesNotStallTheSource(t *testing.T) {
	alice := newTestRepo(t, "did:plc:alice")
	dir := identity.NewMockDirectory()
	var hits atomic.Int64
	src := hugeRepoSource(t, alice, &hits)
	dir.Insert(alice.identityAt(src.srv.URL))
	dir.Insert(identity.Identity{DID: syntax.DID(hugeDID), Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: src.srv.URL}}})
	src.write(testOp{"create", testCollection + "/alice", note("alice")})
	hub, _ := startHub(t, Options{Directory: dir, Listing: ListingLimits{Records: 1000}})

	sub := subscribe(t, hub, src)
	st := waitState(t, sub, "alice's record, the listing complete", func(st State, h Health) bool {
		return h.Connected && !h.Full && len(st.Records) == 1
	})
	if _, ok := st.Records["at://"+alice.did+"/"+testCollection+"/alice"]; !ok {
		t.Errorf("records %v, want alice's", st.Records)
	}
	if _, ok := st.Repos[hugeDID]; ok {
		t.Errorf("the oversized repo is kept as listed")
	}
	err := refused(t, sub)
	if !strings.Contains(err.Error(), "more than 1000 records in one repo's listing") || !strings.Contains(err.Error(), hugeDID) {
		t.Errorf("error %q does not name the repo and its bound", err)
	}
	before := hits.Load()
	src.write(testOp{"create", testCollection + "/alice2", note("alice again")})
	waitState(t, sub, "alice's commit", func(st State, _ Health) bool { return len(st.Records) == 2 })
	if after := hits.Load(); after != before {
		t.Errorf("the oversized repo was asked %d more times", after-before)
	}
}

// TestAttackOversizedLatestCommitIsRefused: a PDS answers getLatestCommit
// with a body past the response bound. The listing is refused as too
// large (naming the bound), not retried as an ordinary failure every few
// milliseconds.
func TestAttackOversizedLatestCommitIsRefused(t *testing.T) {
	alice := newTestRepo(t, "did:plc:alice")
	dir := identity.NewMockDirectory()
	h := &hostile{}
	huge, _ := json.Marshal(map[string]string{"cid": "bafy", "rev": "3333333333333", "pad": strings.Repeat("x", 2<<20)})
	src := newWrappedFakeSource(t, alice, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path != "/xrpc/com.atproto.sync.getLatestCommit" {
				next.ServeHTTP(w, req)
				return
			}
			h.hits.Add(1)
			_, _ = w.Write(huge)
		})
	})
	dir.Insert(alice.identityAt(src.srv.URL))
	hub, _ := startHub(t, Options{Directory: dir, Listing: ListingLimits{PageBytes: 1 << 20}})

	sub := subscribe(t, hub, src, alice.did)
	err := refused(t, sub)
	if !strings.Contains(err.Error(), "more than 1048576 bytes in one response") {
		t.Errorf("error %q does not name the bound", err)
	}
	noRetryStorm(t, h)
}
