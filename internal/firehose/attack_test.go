package firehose

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/identity"
)

// noteCheck accepts only objects with a string text.
func noteCheck(_ string, v json.RawMessage) error {
	var m map[string]any
	if json.Unmarshal(v, &m) != nil {
		return errors.New("not an object")
	}
	if _, ok := m["text"].(string); !ok {
		return errors.New("no text")
	}
	return nil
}

// TestAttackListingDropsForeignRecords: a hostile PDS answers
// listRecords with records naming another repo, another collection, a
// DID or collection that merely starts like the listed one, and a record
// Check refuses. Only the listed repo's valid record is kept; the refused
// one is counted in Invalid.
func TestAttackListingDropsForeignRecords(t *testing.T) {
	r := newTestRepo(t, "did:plc:alice")
	dir := identity.NewMockDirectory()
	dir.Insert(r.identity(nil))
	good := "at://did:plc:alice/" + testCollection + "/good"
	hostile := []map[string]any{
		{"uri": good, "cid": "c1", "value": map[string]any{"text": "good"}},
		{"uri": "at://did:plc:bob/" + testCollection + "/x", "cid": "c2", "value": map[string]any{"text": "bob"}},
		{"uri": "at://did:plc:alice2/" + testCollection + "/x", "cid": "c3", "value": map[string]any{"text": "alice2"}},
		{"uri": "at://did:plc:alice/" + testCollection + "x/y", "cid": "c4", "value": map[string]any{"text": "other collection"}},
		{"uri": "at://did:plc:alice/app.bsky.feed.post/z", "cid": "c5", "value": map[string]any{"text": "post"}},
		{"uri": "did:plc:alice/" + testCollection + "/noscheme", "cid": "c6", "value": map[string]any{"text": "noscheme"}},
		{"uri": "AT://did:plc:alice/" + testCollection + "/upper", "cid": "c7", "value": map[string]any{"text": "upper"}},
		{"uri": "at://did:plc:bob/" + testCollection + "/at://did:plc:alice/" + testCollection + "/smuggled", "cid": "c8", "value": map[string]any{"text": "smuggled"}},
		{"uri": "at://did:plc:alice/" + testCollection + "/invalid", "cid": "c9", "value": map[string]any{"nope": 1}},
	}
	src := newWrappedFakeSource(t, r, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path != "/xrpc/com.atproto.repo.listRecords" {
				next.ServeHTTP(w, req)
				return
			}
			if req.URL.Query().Get("cursor") != "" {
				_ = json.NewEncoder(w).Encode(map[string]any{"records": []any{}})
				return
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"records": hostile, "cursor": "next"})
		})
	})
	dir.Insert(r.identityAt(src.srv.URL))
	src.write(testOp{"create", testCollection + "/seed", note("seed")})
	h, _ := startHub(t, Options{Directory: dir})
	sub, err := h.Subscribe(src.srv.URL, Filter{Collections: []string{testCollection}, Check: noteCheck}, 100, State{})
	if err != nil {
		t.Fatal(err)
	}
	st := waitState(t, sub, "the hostile listing", func(st State, h Health) bool {
		return h.Connected && !h.Resyncing && st.LastResync != nil
	})
	if len(st.Records) != 1 {
		t.Errorf("records %v, want only %s", keys(st.Records), good)
	}
	if rec, ok := st.Records[good]; !ok || rec.CID != "c1" {
		t.Errorf("the listed repo's valid record is missing: %v", keys(st.Records))
	}
	for uri, rec := range st.Records {
		if rec.DID() != "did:plc:alice" || rec.collection() != testCollection {
			t.Errorf("kept %s, which names another repo or collection", uri)
		}
	}
	if st.Invalid < 1 {
		t.Errorf("Invalid %d, want the refused record counted", st.Invalid)
	}
}

func keys(m map[string]Record) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestAttackCheckRefusalKeepsNothing: a Check that refuses everything
// keeps no record from commits or listings, drops what was kept before
// (of that repo only), and counts every refusal.
func TestAttackCheckRefusalKeepsNothing(t *testing.T) {
	refuse := false
	check := func(c string, v json.RawMessage) error {
		if refuse {
			return errors.New("refused")
		}
		return noteCheck(c, v)
	}
	sub := testSub(testStream(t, identity.NewMockDirectory()), Filter{Collections: []string{testCollection}, Check: check})
	alice, bob := "did:plc:alice", "did:plc:bob"
	sub.apply(&commitUpdate{seq: 1, did: alice, rev: "2222222222222", ops: []opUpdate{
		{action: "create", collection: testCollection, rkey: "a", cid: "c1", value: json.RawMessage(`{"text":"a"}`)},
		{action: "create", collection: testCollection, rkey: "b", cid: "c2", value: json.RawMessage(`{"text":"b"}`)},
	}})
	sub.apply(&commitUpdate{seq: 2, did: bob, rev: "2222222222222", ops: []opUpdate{
		{action: "create", collection: testCollection, rkey: "a", cid: "c3", value: json.RawMessage(`{"text":"bob"}`)},
	}})
	if st, _, _ := sub.Snapshot(); len(st.Records) != 3 || st.Invalid != 0 {
		t.Fatalf("setup: %v, %d invalid", keys(st.Records), st.Invalid)
	}
	refuse = true
	// Hostile values of every shape, from a commit.
	values := []string{`{"text":"fine"}`, `null`, `[]`, `"s"`, `{`, ``, `{"text":` + strings.Repeat("[", 10000)}
	var ops []opUpdate
	for _, v := range values {
		ops = append(ops, opUpdate{action: "update", collection: testCollection, rkey: "a", cid: "x", value: json.RawMessage(v)})
	}
	sub.apply(&commitUpdate{seq: 3, did: alice, rev: "3333333333333", ops: ops})
	st, _, _ := sub.Snapshot()
	if _, ok := st.Records["at://"+alice+"/"+testCollection+"/a"]; ok {
		t.Errorf("a refused update left the record kept")
	}
	if st.Invalid != int64(len(values)) {
		t.Errorf("Invalid %d, want %d", st.Invalid, len(values))
	}
	// A listing of alice whose every record is refused.
	if !sub.replaceRepo(alice, &listing{rev: "4444444444444", records: []Record{
		{URI: "at://" + alice + "/" + testCollection + "/a", CID: "l1", Value: json.RawMessage(`{"text":"a"}`)},
		{URI: "at://" + alice + "/" + testCollection + "/c", CID: "l2", Value: json.RawMessage(`{"text":"c"}`)},
	}}) {
		t.Fatal("listing refused")
	}
	st, _, _ = sub.Snapshot()
	for uri := range st.Records {
		if strings.HasPrefix(uri, "at://"+alice+"/") {
			t.Errorf("kept %s although Check refuses everything", uri)
		}
	}
	if _, ok := st.Records["at://"+bob+"/"+testCollection+"/a"]; !ok || len(st.Records) != 1 {
		t.Errorf("records %v, want bob's only (another repo's listing must not touch it)", keys(st.Records))
	}
	if st.Invalid != int64(len(values))+2 {
		t.Errorf("Invalid %d, want %d", st.Invalid, len(values)+2)
	}
}

// TestAttackListRecordsRedirectNotFollowed: the PDS answers
// getLatestCommit but redirects listRecords (301, 307, 308), and the
// caller's HTTP client would follow any redirect: the hub must not, and
// the subscription keeps nothing from the redirect's target.
func TestAttackListRecordsRedirectNotFollowed(t *testing.T) {
	for _, code := range []int{http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			rec, hits := recorder(t)
			r := newTestRepo(t, "did:plc:alice")
			dir := identity.NewMockDirectory()
			dir.Insert(r.identity(nil))
			src := newWrappedFakeSource(t, r, func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
					if req.URL.Path == "/xrpc/com.atproto.repo.listRecords" {
						http.Redirect(w, req, rec.URL+req.URL.RequestURI(), code)
						return
					}
					next.ServeHTTP(w, req)
				})
			})
			dir.Insert(r.identityAt(src.srv.URL))
			src.write(testOp{"create", testCollection + "/a", note("a")})
			follow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}
			h, _ := startHub(t, Options{Directory: dir, HTTPClient: follow})
			sub, err := h.Subscribe(src.srv.URL, Filter{Collections: []string{testCollection}}, 10, State{})
			if err != nil {
				t.Fatal(err)
			}
			st := waitState(t, sub, "a failed listing", func(st State, h Health) bool {
				return h.Connected && st.Errors >= 1 && h.ResyncErr != nil
			})
			if n := hits.Load(); n != 0 {
				t.Fatalf("the redirect was followed: %d requests reached its target", n)
			}
			if len(st.Records) != 0 {
				t.Fatalf("records %v after a redirected listing", keys(st.Records))
			}
		})
	}
}

// TestAttackUnresolvableDIDIsNotListedFromTheSource: a source lists a
// repo whose DID the directory cannot resolve; its records are not taken
// from the source (they would be unsigned: a hostile source could make up
// another participant's records): a subscription that names the DID
// says the listing failed, one of every repo counts the repo's failure
// and goes on.
func TestAttackUnresolvableDIDIsNotListedFromTheSource(t *testing.T) {
	r := newTestRepo(t, "did:plc:alice")
	src := newFakeSource(t, r)
	src.write(testOp{"create", testCollection + "/made-up", note("made up")})
	h, _ := startHub(t, Options{Directory: identity.NewMockDirectory()})
	for _, dids := range [][]string{{r.did}, nil} {
		sub, err := h.Subscribe(src.srv.URL, Filter{Collections: []string{testCollection}, DIDs: dids}, 100, State{})
		if err != nil {
			t.Fatal(err)
		}
		st := waitState(t, sub, fmt.Sprintf("the failed listing (dids %v)", dids), func(st State, h Health) bool {
			if dids == nil {
				return !h.Full && st.Errors > 0
			}
			return h.Resyncing && h.ResyncErr != nil
		})
		if len(st.Records) != 0 {
			t.Errorf("records of an unresolvable DID were kept: %v", keys(st.Records))
		}
	}
}
