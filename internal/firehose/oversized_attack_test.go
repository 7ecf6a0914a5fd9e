package firehose

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/gorilla/websocket"
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

// giantFrameSource is a fake source for alice whose firehose sends one
// binary frame announcing 64 MiB and then streams it. conns counts the
// connections, sent the bytes the client took of the frames.
func giantFrameSource(t *testing.T, alice *testRepo, conns, sent *atomic.Int64) *fakeSource {
	return newWrappedFakeSource(t, alice, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path != "/xrpc/com.atproto.sync.subscribeRepos" {
				next.ServeHTTP(w, req)
				return
			}
			con, err := (&websocket.Upgrader{}).Upgrade(w, req, nil)
			if err != nil {
				return
			}
			defer con.Close()
			conns.Add(1)
			const size = 64 << 20
			// One unmasked, final, binary frame with a 64-bit length.
			header := []byte{0x82, 127, 0, 0, 0, 0, 0, 0, 0, 0}
			binary.BigEndian.PutUint64(header[2:], size)
			// The frame starts as an event of a type the client skips
			// ({"op": 1, "t": "#giant"}), so a client without a read limit
			// reads past it to the next frame: all 64 MiB.
			header = append(header, 0xa2, 0x62, 'o', 'p', 0x01, 0x61, 't', 0x66, '#', 'g', 'i', 'a', 'n', 't')
			raw := con.NetConn()
			if _, err := raw.Write(header); err != nil {
				return
			}
			chunk := make([]byte, 64<<10)
			for n := 14; n < size; {
				part := chunk[:min(len(chunk), size-n)]
				_ = raw.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if _, err := raw.Write(part); err != nil {
					return
				}
				n += len(part)
				sent.Add(int64(len(part)))
			}
			// Held open until the client goes, as a source would.
			_, _, _ = con.ReadMessage()
		})
	})
}

// TestAttackGiantFirehoseFrame: a source's firehose sends a 64 MiB frame.
// The connection is closed with ErrFrameTooLarge naming the bound, after
// the client took a bounded part of it, and is opened again only after
// the stream's backoff (the test's is 20 ms doubling to 100 ms).
func TestAttackGiantFirehoseFrame(t *testing.T) {
	alice := newTestRepo(t, "did:plc:alice")
	dir := identity.NewMockDirectory()
	var conns, sent atomic.Int64
	src := giantFrameSource(t, alice, &conns, &sent)
	dir.Insert(alice.identityAt(src.srv.URL))
	hub, _ := startHub(t, Options{Directory: dir})

	sub := subscribe(t, hub, src, alice.did)
	var err error
	waitState(t, sub, "the connection closed for the frame's size", func(_ State, h Health) bool {
		err = h.Err
		return errors.Is(err, ErrFrameTooLarge)
	})
	if !strings.Contains(err.Error(), "more than 5242880 bytes") {
		t.Errorf("error %q does not name the bound", err)
	}
	before := conns.Load()
	time.Sleep(time.Second)
	if n := conns.Load() - before; n > 15 {
		t.Errorf("%d connections within a second after the refused frame", n)
	}
	n := sent.Load() / max(conns.Load(), 1)
	t.Logf("%d connections; about %d KiB of the 64 MiB frame sent per connection", conns.Load(), n>>10)
	if n > 32<<20 {
		t.Errorf("about %d MiB of the frame sent per connection, want the client to stop reading it", n>>20)
	}
}

// TestAttackDeadRepoPDSDoesNotStallTheSource: a source's listRepos names
// alice's honest repo and two strangers' repos that cannot be listed: one
// whose DID document names a PDS that fails every request, one whose DID
// does not resolve. The full listing of the source leaves them out (owed,
// the failure shown while Resyncing, not asked again soon) and completes
// for alice, so a consumer (a market feed) can decide. Before, the whole
// listing failed and was retried forever: anyone with an account on a
// shared PDS could stall every watch of it by moving their DID document
// to a dead address (R21).
func TestAttackDeadRepoPDSDoesNotStallTheSource(t *testing.T) {
	const movedDID, ghostDID = "did:plc:moved", "did:plc:ghost"
	alice := newTestRepo(t, "did:plc:alice")
	h := &hostile{}
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h.hits.Add(1)
		w.WriteHeader(http.StatusBadGateway)
	}))
	defer dead.Close()
	repos, _ := json.Marshal(map[string]any{"repos": []map[string]any{
		{"did": movedDID, "head": "bafy", "rev": "x"},
		{"did": ghostDID, "head": "bafy", "rev": "x"},
		{"did": alice.did, "head": "bafy", "rev": "x"},
	}})
	src := newWrappedFakeSource(t, alice, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path == "/xrpc/com.atproto.sync.listRepos" {
				_, _ = w.Write(repos)
				return
			}
			next.ServeHTTP(w, req)
		})
	})
	dir := identity.NewMockDirectory()
	dir.Insert(alice.identityAt(src.srv.URL))
	dir.Insert(identity.Identity{DID: syntax.DID(movedDID), Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: dead.URL}}})
	src.write(testOp{"create", testCollection + "/alice", note("alice")})
	hub, _ := startHub(t, Options{Directory: dir})

	sub := subscribe(t, hub, src)
	var health Health
	st := waitState(t, sub, "alice's record, the listing complete", func(st State, h Health) bool {
		health = h
		return h.Connected && !h.Full && len(st.Records) == 1
	})
	if _, ok := st.Records["at://"+alice.did+"/"+testCollection+"/alice"]; !ok {
		t.Errorf("records %v, want alice's", st.Records)
	}
	if health.Resyncing || health.ResyncErr != nil || st.Errors < 2 {
		t.Errorf("health %+v, errors %d: want the strangers' repos counted as errors, not holding the subscription Resyncing", health, st.Errors)
	}
	if h.hits.Load() == 0 {
		t.Fatal("the moved repo's PDS was never asked")
	}
	noRetryStorm(t, h)
	// The firehose goes on for alice.
	src.write(testOp{"create", testCollection + "/alice2", note("alice again")})
	waitState(t, sub, "alice's commit", func(st State, _ Health) bool { return len(st.Records) == 2 })
}
