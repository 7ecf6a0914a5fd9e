package firehose

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/go-logr/logr"

	"github.com/knotless-dev/knotless/internal/netpolicy"
)

func bareStream(t *testing.T, dir identity.Directory, source string, lim ListingLimits) *stream {
	t.Helper()
	h, err := NewHub(Options{Directory: dir, Log: logr.Discard(), Listing: lim,
		Policy: netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil)})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := NewMetrics(nil)
	h.opts.Metrics = m
	return newStream(h, source)
}

func queued(s *stream) []resyncReq {
	s.resync.mu.Lock()
	defer s.resync.mu.Unlock()
	return append([]resyncReq(nil), s.resync.items...)
}

// TestAttackSourceBudgetIsNotARepoFailure: a relay-like source's
// listRepos names 5 repos whose DID documents name another PDS, each with
// 2 records, past the source's budget of 3 records. The full listing is
// refused as too large, as a whole: the bound of the source is not one
// repo's failure (which would leave every repo unlisted, each retried on
// its own without the source's budget).
func TestAttackSourceBudgetIsNotARepoFailure(t *testing.T) {
	dids := []string{}
	for i := range 5 {
		dids = append(dids, fmt.Sprintf("did:plc:r%d", i))
	}
	pds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		switch req.URL.Path {
		case "/xrpc/com.atproto.sync.getLatestCommit":
			_ = json.NewEncoder(w).Encode(map[string]string{"cid": "bafy", "rev": "3333333333333"})
		case "/xrpc/com.atproto.repo.listRecords":
			did := q.Get("repo")
			_, _ = w.Write(recordsPage(did, 2, 10, ""))
		}
	}))
	defer pds.Close()
	var list []map[string]any
	dir := identity.NewMockDirectory()
	for _, d := range dids {
		list = append(list, map[string]any{"did": d, "head": "bafy", "rev": "x"})
		dir.Insert(identity.Identity{DID: syntax.DID(d), Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: pds.URL}}})
	}
	body, _ := json.Marshal(map[string]any{"repos": list})
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	defer relay.Close()

	s := bareStream(t, dir, relay.URL, ListingLimits{SourceRecords: 3})
	sub := testSub(s, Filter{Collections: []string{testCollection}})
	err := s.resyncAll(context.Background(), sub, ResyncInitial)
	st, h, _ := sub.Snapshot()
	t.Logf("resyncAll err=%v records=%d errors=%d resyncing=%v unlisted=%d queued=%d", err, len(st.Records), st.Errors, h.Resyncing, len(sub.unlisted), len(queued(s)))
	for did, e := range sub.unlisted {
		t.Logf("  unlisted %s: %v (ListingTooLarge=%v)", did, e, errors.Is(e, ErrListingTooLarge))
	}
	if !errors.Is(err, ErrListingTooLarge) {
		t.Errorf("a listing past the SOURCE's budget returned %v, want it refused as ListingTooLarge", err)
	}
}

// TestAttackUnverifiedStrangerDoesNotHoldEveryRepo: a shared PDS sends a
// commit of a stranger whose DID does not resolve. The commit is
// unverified, so the repo is owed a listing (held at its seq), which fails
// on the repo's own account. A subscription of every repo is not held
// Resyncing by it, and its cursor goes on.
func TestAttackUnverifiedStrangerDoesNotHoldEveryRepo(t *testing.T) {
	evil := newTestRepo(t, "did:plc:evil")
	s := bareStream(t, identity.NewMockDirectory(), "http://pds.invalid", ListingLimits{})
	sub := testSub(s, Filter{Collections: []string{testCollection}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.handleCommit(ctx, 5, evil.commit(testOp{"create", testCollection + "/x", note("x")}), []*Subscription{sub})
	go s.resyncLoop(ctx)
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, _, _ := sub.Snapshot()
		if st.Errors > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	sub.settle(100, sub.gen)
	st, h, _ := sub.Snapshot()
	q := queued(s)
	t.Logf("resyncing=%v err=%v cursor=%d (events up to 100 applied) unlisted=%v queued=%d notBefore in %v",
		h.Resyncing, h.ResyncErr, st.Cursor, sub.unlisted, len(q), time.Until(q[0].notBefore).Round(time.Second))
	if h.Resyncing || st.Cursor != 100 {
		t.Errorf("an every-repo subscription is held by a stranger's repo: Resyncing=%v cursor=%d (want false, 100)", h.Resyncing, st.Cursor)
	}
}

// TestAttackUnlistedRepoDoesNotHoldTheCursor: after a full listing left
// a stranger's repo unlisted, a later commit of it does not hold the
// cursor of a subscription of every repo until the repo lists.
func TestAttackUnlistedRepoDoesNotHoldTheCursor(t *testing.T) {
	evil := newTestRepo(t, "did:plc:evil")
	s := bareStream(t, identity.NewMockDirectory(), "http://pds.invalid", ListingLimits{})
	sub := testSub(s, Filter{Collections: []string{testCollection}})
	sub.unlistRepo(evil.did, ResyncInitial, repoFailure{errors.New("resolving: the DID does not resolve")})
	s.handleCommit(context.Background(), 5, evil.commit(testOp{"create", testCollection + "/x", note("x")}), []*Subscription{sub})
	sub.settle(100, sub.gen)
	st, h, _ := sub.Snapshot()
	t.Logf("resyncing=%v cursor=%d holding=%v hold=%d", h.Resyncing, st.Cursor, sub.holding, sub.hold)
	if !h.Resyncing && st.Cursor != 100 {
		t.Errorf("not Resyncing, yet the cursor is held at %d until the stranger's repo lists (want 100)", st.Cursor)
	}
}

// downDir is a DID directory that is down (a PLC outage).
type downDir struct{ identity.Directory }

func (downDir) LookupDID(context.Context, syntax.DID) (*identity.Identity, error) {
	return nil, errors.New("plc.directory: 503")
}

// TestDirectoryOutageFailsTheListing: the PLC directory fails during a
// full listing of a PDS source. The listing fails (and is retried); it
// does not end as if every repo were empty, with the subscription
// Following.
func TestDirectoryOutageFailsTheListing(t *testing.T) {
	alice := newTestRepo(t, "did:plc:alice")
	src := newFakeSource(t, alice)
	src.write(testOp{"create", testCollection + "/a", note("a")})
	s := bareStream(t, downDir{identity.NewMockDirectory()}, src.srv.URL, ListingLimits{})
	sub := testSub(s, Filter{Collections: []string{testCollection}})
	sub.full = true
	err := s.resyncAll(context.Background(), sub, ResyncInitial)
	sub.resynced("", ResyncInitial) // what resyncLoop does on nil
	st, h, _ := sub.Snapshot()
	t.Logf("err=%v records=%d full=%v resyncing=%v errors=%d", err, len(st.Records), h.Full, h.Resyncing, st.Errors)
	if err == nil && !h.Resyncing {
		t.Errorf("a directory outage made the full listing succeed with %d records and the subscription not Resyncing", len(st.Records))
	}
}

// TestAttackDroppedUnlistedRepoIsNotRetried: a stranger's repo left
// unlisted, then gone from the source's listRepos, is not listed again
// (its queued retry is no longer owed), and a hold it had is released.
func TestAttackDroppedUnlistedRepoIsNotRetried(t *testing.T) {
	evil := newTestRepo(t, "did:plc:evil")
	var hits atomic.Int64
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1); w.WriteHeader(502) }))
	defer dead.Close()
	dir := identity.NewMockDirectory()
	dir.Insert(evil.identityAt(dead.URL))
	s := bareStream(t, dir, "http://pds.invalid", ListingLimits{})
	s.hub.opts.Listing.Retry.Initial, s.hub.opts.Listing.Retry.Max = 10*time.Millisecond, 20*time.Millisecond
	sub := testSub(s, Filter{Collections: []string{testCollection}})
	sub.owe(evil.did, ResyncSync, 5) // a #sync of it at seq 5: hold 4
	s.unlistRepo(sub, evil.did, ResyncInitial, repoFailure{errors.New("its PDS failed")})
	sub.dropReposExcept(nil) // the next full listing: the source no longer lists it
	sub.resynced("", ResyncInitial)
	ctx, cancel := context.WithCancel(context.Background())
	go s.resyncLoop(ctx)
	time.Sleep(500 * time.Millisecond)
	cancel()
	sub.settle(100, sub.gen)
	st, h, _ := sub.Snapshot()
	t.Logf("dead PDS asked %d times after the repo left the source; pending=%v holding=%v cursor=%d resyncErr=%v resyncing=%v", hits.Load(), sub.pending, sub.holding, st.Cursor, sub.resyncErr, h.Resyncing)
	if hits.Load() > 1 || st.Cursor != 100 {
		t.Errorf("a repo no longer owed is retried (%d) / cursor held at %d", hits.Load(), st.Cursor)
	}
}

// TestAttackUnlistedRepoDoesNotHoldAnotherRepoCursor: while a stranger's
// repo stays unlisted, another repo's ordinary relisting (a #sync) holds
// the cursor of a subscription of every repo only until that relisting
// ends.
func TestAttackUnlistedRepoDoesNotHoldAnotherRepoCursor(t *testing.T) {
	s := bareStream(t, identity.NewMockDirectory(), "http://pds.invalid", ListingLimits{})
	sub := testSub(s, Filter{Collections: []string{testCollection}})
	sub.unlistRepo("did:plc:evil", ResyncInitial, repoFailure{errors.New("its PDS failed")})
	sub.owe("did:plc:alice", ResyncSync, 5)
	sub.resynced("did:plc:alice", ResyncSync)
	sub.settle(100, sub.gen)
	if st, _, _ := sub.Snapshot(); st.Cursor != 100 {
		t.Errorf("cursor held at %d after alice's relisting, want 100", st.Cursor)
	}
}

// TestTombstonedPLCIsTheReposFailure: a did:plc its owner tombstoned (the
// PLC directory answers 410) while the PDS still lists the repo is the
// repo's own failure, not the directory's: it must not fail the source's
// whole listing. Another status from the directory still is the
// directory's.
func TestTombstonedPLCIsTheReposFailure(t *testing.T) {
	for status, own := range map[int]bool{410: true, 503: false} {
		s := bareStream(t, statusDir{status}, "http://pds.invalid", ListingLimits{})
		_, err := s.lookup(context.Background(), "did:plc:gone")
		if repoFailed(err) != own || !errors.Is(err, ErrDIDUnresolved) {
			t.Errorf("PLC directory status %d: %v (the repo's own: %v), want the repo's own: %v", status, err, repoFailed(err), own)
		}
	}
}

// statusDir answers every lookup as indigo does when the PLC directory
// answers status.
type statusDir struct{ status int }

func (d statusDir) LookupHandle(context.Context, syntax.Handle) (*identity.Identity, error) {
	return nil, identity.ErrHandleNotFound
}

func (d statusDir) LookupDID(context.Context, syntax.DID) (*identity.Identity, error) {
	return nil, fmt.Errorf("%w: PLC directory status %d", identity.ErrDIDResolutionFailed, d.status)
}

func (d statusDir) Lookup(context.Context, syntax.AtIdentifier) (*identity.Identity, error) {
	return nil, identity.ErrDIDResolutionFailed
}

func (d statusDir) Purge(context.Context, syntax.AtIdentifier) error { return nil }

// TestSourceIsRecognisedAsWrittenElsewhere: a DID document that names the
// source with another case or a final slash names the source, so that the
// source's own failure is not taken for each repo's.
func TestSourceIsRecognisedAsWrittenElsewhere(t *testing.T) {
	s := bareStream(t, identity.NewMockDirectory(), "https://pds.example", ListingLimits{})
	for endpoint, want := range map[string]bool{"https://PDS.example/": true, "https://pds.example": true, "https://pds.example.evil": false, "http://pds.example": false} {
		if got := s.isSource(endpoint); got != want {
			t.Errorf("isSource(%q) = %v, want %v", endpoint, got, want)
		}
	}
}

// TestAttackChangingRepoDoesNotSpendTheSourceBudget (from an attack): a
// repo's own PDS answers a new rev at every getLatestCommit and, at each
// try, records up to one repo's bound. The thrown-away tries do not count
// against the source's budget: the repo is left unlisted (it kept
// changing) and the honest repo is listed. Before, five tries within the
// repo's bound passed the source's and refused the whole listing, at
// every retry.
func TestAttackChangingRepoDoesNotSpendTheSourceBudget(t *testing.T) {
	var rev atomic.Int64
	evilPDS := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/xrpc/com.atproto.sync.getLatestCommit":
			_ = json.NewEncoder(w).Encode(map[string]string{"cid": "bafy", "rev": fmt.Sprintf("3%012d", rev.Add(1))})
		case "/xrpc/com.atproto.repo.listRecords":
			_, _ = w.Write(recordsPage(req.URL.Query().Get("repo"), 10, 10, ""))
		}
	}))
	defer evilPDS.Close()
	goodPDS := stablePDS(t)
	dir := identity.NewMockDirectory()
	for did, url := range map[string]string{"did:plc:evil": evilPDS.URL, "did:plc:good": goodPDS.URL} {
		dir.Insert(identity.Identity{DID: syntax.DID(did), Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: url}}})
	}
	body, _ := json.Marshal(map[string]any{"repos": []map[string]any{
		{"did": "did:plc:evil", "head": "bafy", "rev": "x"},
		{"did": "did:plc:good", "head": "bafy", "rev": "x"},
	}})
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	defer relay.Close()

	s := bareStream(t, dir, relay.URL, ListingLimits{Records: 10, SourceRecords: 40})
	sub := testSub(s, Filter{Collections: []string{testCollection}})
	if err := s.resyncAll(context.Background(), sub, ResyncInitial); err != nil {
		t.Fatalf("one repo that changes at every try (each try within its own bound) failed the whole listing: %v", err)
	}
	st, _, _ := sub.Snapshot()
	if len(st.Records) != 1 || sub.unlisted["did:plc:evil"] == nil {
		t.Errorf("records %v, unlisted %v: want the honest repo's record and the changing repo unlisted", keys(st.Records), sub.unlisted)
	}
}

// TestAttackChangingReposReadAtMostTwiceTheSourceBudget: many repos of a
// source that each change at every try (each try within one repo's
// bound) had every thrown-away try given back to the source's budget, so
// together they made a full listing read without bound: 8 such repos
// read 400 records against a source budget of 100. What tries that are
// thrown away read is bounded by the source's budget once more: past
// it, a repo that changed while it was read is unlisted at once, its
// try left charged to the source.
func TestAttackChangingReposReadAtMostTwiceTheSourceBudget(t *testing.T) {
	const sybils, perTry, sourceRecords = 8, 10, 100
	var rev, served atomic.Int64
	evilPDS := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/xrpc/com.atproto.sync.getLatestCommit":
			_ = json.NewEncoder(w).Encode(map[string]string{"cid": "bafy", "rev": fmt.Sprintf("3%012d", rev.Add(1))})
		case "/xrpc/com.atproto.repo.listRecords":
			served.Add(perTry)
			_, _ = w.Write(recordsPage(req.URL.Query().Get("repo"), perTry, 10, ""))
		}
	}))
	defer evilPDS.Close()
	goodPDS := stablePDS(t)
	dir := identity.NewMockDirectory()
	repos := []map[string]any{{"did": "did:plc:good", "head": "bafy", "rev": "x"}}
	dir.Insert(identity.Identity{DID: "did:plc:good", Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: goodPDS.URL}}})
	for i := range sybils {
		did := fmt.Sprintf("did:plc:evil%d", i)
		repos = append(repos, map[string]any{"did": did, "head": "bafy", "rev": "x"})
		dir.Insert(identity.Identity{DID: syntax.DID(did), Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: evilPDS.URL}}})
	}
	body, _ := json.Marshal(map[string]any{"repos": repos})
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	defer relay.Close()

	s := bareStream(t, dir, relay.URL, ListingLimits{Records: perTry, SourceRecords: sourceRecords})
	sub := testSub(s, Filter{Collections: []string{testCollection}})
	err := s.resyncAll(context.Background(), sub, ResyncInitial)
	t.Logf("changing repos served %d records for a source budget of %d (listing: %v)", served.Load(), sourceRecords, err)
	if got := served.Load(); got > 2*sourceRecords {
		t.Errorf("%d repos that change at every try read %d records, more than twice the source's budget of %d", sybils, got, sourceRecords)
	}
	if err != nil {
		t.Fatalf("the listing failed: %v", err)
	}
	st, _, _ := sub.Snapshot()
	if len(st.Records) != 1 || len(sub.unlisted) != sybils {
		t.Errorf("records %v, unlisted %d: want the honest repo's record and every changing repo unlisted", keys(st.Records), len(sub.unlisted))
	}
}

// stablePDS is a PDS whose repos each hold one record and never change.
func stablePDS(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/xrpc/com.atproto.sync.getLatestCommit":
			_ = json.NewEncoder(w).Encode(map[string]string{"cid": "bafy", "rev": "3333333333333"})
		case "/xrpc/com.atproto.repo.listRecords":
			_, _ = w.Write(recordsPage(req.URL.Query().Get("repo"), 1, 10, ""))
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestHonestRepoLeftOutOnceTheAllowanceIsSpentIsListedOnItsOwn: the price
// of bounding what a full listing throws away (from an attack review).
// Once another account's changing repo has spent the allowance, an
// honest repo that changes once while it is read is left out of that
// listing (not the whole source refused), queued for a retry, and its own
// listing then lists it.
func TestHonestRepoLeftOutOnceTheAllowanceIsSpentIsListedOnItsOwn(t *testing.T) {
	var rev, honestReads atomic.Int64
	evilPDS := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/xrpc/com.atproto.sync.getLatestCommit":
			_ = json.NewEncoder(w).Encode(map[string]string{"cid": "bafy", "rev": fmt.Sprintf("3%012d", rev.Add(1))})
		case "/xrpc/com.atproto.repo.listRecords":
			_, _ = w.Write(recordsPage(req.URL.Query().Get("repo"), 10, 10, ""))
		}
	}))
	defer evilPDS.Close()
	honestPDS := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/xrpc/com.atproto.sync.getLatestCommit":
			r := "3333333333333"
			if honestReads.Add(1) >= 2 { // one commit lands while it is first read
				r = "3333333333334"
			}
			_ = json.NewEncoder(w).Encode(map[string]string{"cid": "bafy", "rev": r})
		case "/xrpc/com.atproto.repo.listRecords":
			_, _ = w.Write(recordsPage(req.URL.Query().Get("repo"), 1, 10, ""))
		}
	}))
	defer honestPDS.Close()
	dir := identity.NewMockDirectory()
	for did, url := range map[string]string{"did:plc:aaevil": evilPDS.URL, "did:plc:honest": honestPDS.URL} {
		dir.Insert(identity.Identity{DID: syntax.DID(did), Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: url}}})
	}
	body, _ := json.Marshal(map[string]any{"repos": []map[string]any{
		{"did": "did:plc:aaevil", "head": "bafy", "rev": "x"},
		{"did": "did:plc:honest", "head": "bafy", "rev": "x"},
	}})
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	defer relay.Close()

	s := bareStream(t, dir, relay.URL, ListingLimits{Records: 10, SourceRecords: 40})
	sub := testSub(s, Filter{Collections: []string{testCollection}})
	if err := s.resyncAll(context.Background(), sub, ResyncInitial); err != nil {
		t.Fatalf("the whole source was refused: %v", err)
	}
	if sub.unlisted["did:plc:honest"] == nil || !slices.ContainsFunc(queued(s), func(r resyncReq) bool { return r.did == "did:plc:honest" }) {
		t.Fatalf("unlisted %v, queued %v: want the honest repo left out and queued for its own listing", sub.unlisted, queued(s))
	}
	if err := s.resyncRepo(context.Background(), sub, "did:plc:honest", nil); err != nil {
		t.Fatalf("the honest repo's own listing: %v", err)
	}
	if st, _, _ := sub.Snapshot(); len(st.Records) != 1 {
		t.Errorf("records %v after the honest repo's own listing: want its record", keys(st.Records))
	}
}
