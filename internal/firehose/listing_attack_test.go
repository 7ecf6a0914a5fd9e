package firehose

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// hostile overrides a fake source's listings; hits counts the listing
// requests it answered.
type hostile struct {
	listRepos   http.HandlerFunc
	listRecords http.HandlerFunc
	// anyRepo makes getLatestCommit answer for every DID.
	anyRepo bool
	hits    atomic.Int64
}

// hostileSource is a fake source for r whose listings h answers.
func hostileSource(t *testing.T, r *testRepo, h *hostile) *fakeSource {
	return newWrappedFakeSource(t, r, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			switch {
			case req.URL.Path == "/xrpc/com.atproto.sync.listRepos" && h.listRepos != nil:
				h.hits.Add(1)
				h.listRepos(w, req)
			case req.URL.Path == "/xrpc/com.atproto.repo.listRecords" && h.listRecords != nil:
				h.hits.Add(1)
				h.listRecords(w, req)
			case req.URL.Path == "/xrpc/com.atproto.sync.getLatestCommit" && h.anyRepo:
				_ = json.NewEncoder(w).Encode(map[string]string{"cid": "bafy", "rev": "3333333333333"})
			default:
				next.ServeHTTP(w, req)
			}
		})
	})
}

// constantPage answers every request with body, whatever the cursor.
func constantPage(body []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }
}

// endlessRepos is a listRepos page of n DIDs whose cursor never ends.
func endlessRepos(n int) []byte {
	repos := make([]map[string]any, n)
	for i := range repos {
		repos[i] = map[string]any{"did": fmt.Sprintf("did:plc:endless%09d", i), "head": "bafy", "rev": "x"}
	}
	b, _ := json.Marshal(map[string]any{"repos": repos, "cursor": "more"})
	return b
}

// recordsPage is a listRecords page of n records of did with values of
// about size bytes, and cursor (none if "").
func recordsPage(did string, n, size int, cursor string) []byte {
	recs := make([]map[string]any, n)
	for i := range recs {
		recs[i] = map[string]any{
			"uri":   fmt.Sprintf("at://%s/%s/r%06d", did, testCollection, i),
			"cid":   "bafy",
			"value": map[string]any{"$type": testCollection, "text": strings.Repeat("x", size)},
		}
	}
	page := map[string]any{"records": recs}
	if cursor != "" {
		page["cursor"] = cursor
	}
	b, _ := json.Marshal(page)
	return b
}

// healthySource starts a well-behaved source for bob holding one record
// and adds bob's identity to dir.
func healthySource(t *testing.T, dir *identity.MockDirectory) *fakeSource {
	bob := newTestRepo(t, "did:plc:bob")
	src := newFakeSource(t, bob)
	dir.Insert(bob.identityAt(src.srv.URL))
	src.write(testOp{"create", testCollection + "/bob", note("bob")})
	return src
}

// subscribe subscribes to testCollection on src (of dids, if any).
func subscribe(t *testing.T, h *Hub, src *fakeSource, dids ...string) *Subscription {
	t.Helper()
	sub, err := h.Subscribe(src.srv.URL, Filter{Collections: []string{testCollection}, DIDs: dids}, 100, State{})
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

// refused waits for sub's listing to be refused as too large, and returns
// the error.
func refused(t *testing.T, sub *Subscription) error {
	t.Helper()
	var err error
	waitState(t, sub, "the listing refused as too large", func(_ State, h Health) bool {
		err = h.ResyncErr
		return errors.Is(err, ErrListingTooLarge)
	})
	return err
}

// noRetryStorm checks that the refused listing is not asked again soon
// (the hub's refusal backoff starts at a minute) while the stream's
// ordinary retries (20–100 ms in tests) would have asked many times.
func noRetryStorm(t *testing.T, h *hostile) {
	t.Helper()
	before := h.hits.Load()
	time.Sleep(500 * time.Millisecond)
	if after := h.hits.Load(); after != before {
		t.Errorf("the refused source was asked %d more times within 500 ms", after-before)
	}
}

// TestAttackEndlessListReposIsRefused: a source answers listRepos with
// pages of 1000 DIDs and a cursor that never ends. With the default
// limits the listing stops after DefaultListingRepos repos (pages
// counted), the subscription that asked for it says ListingTooLarge and
// is not retried at once, and a subscription of one repo on the same
// source and one on another source get their records.
func TestAttackEndlessListReposIsRefused(t *testing.T) {
	alice := newTestRepo(t, "did:plc:alice")
	dir := identity.NewMockDirectory()
	h := &hostile{listRepos: constantPage(endlessRepos(1000))}
	src := hostileSource(t, alice, h)
	dir.Insert(alice.identityAt(src.srv.URL))
	src.write(testOp{"create", testCollection + "/alice", note("alice")})
	other := healthySource(t, dir)
	hub, _ := startHub(t, Options{Directory: dir})

	everyRepo := subscribe(t, hub, src)
	oneRepo := subscribe(t, hub, src, alice.did)
	elsewhere := subscribe(t, hub, other)

	err := refused(t, everyRepo)
	if !strings.Contains(err.Error(), "more than 200000 repos") {
		t.Errorf("error %q does not name the bound", err)
	}
	if pages := h.hits.Load(); pages > DefaultListingRepos/1000+1 {
		t.Errorf("%d pages asked, want at most %d", pages, DefaultListingRepos/1000+1)
	}
	if st, _, _ := everyRepo.Snapshot(); len(st.Records) != 0 || len(st.Repos) != 0 {
		t.Errorf("the refused listing kept %d records, %d repos", len(st.Records), len(st.Repos))
	}
	waitState(t, oneRepo, "alice's record on the same source", func(st State, h Health) bool {
		return h.Connected && !h.Resyncing && len(st.Records) == 1
	})
	waitState(t, elsewhere, "bob's record on another source", func(st State, h Health) bool {
		return h.Connected && !h.Resyncing && len(st.Records) == 1
	})
	noRetryStorm(t, h)
}

// TestAttackEndlessListRecordsIsRefused: a repo's PDS answers listRecords
// without end (an endless cursor, huge pages, pages of records that are
// not the repo's, many repos each within bounds): each listing stops at
// its bound, having asked a bounded number of pages, with an error naming
// the bound; a subscription on another source gets its records.
func TestAttackEndlessListRecordsIsRefused(t *testing.T) {
	const alice = "did:plc:alice"
	for _, tc := range []struct {
		name    string
		limits  ListingLimits
		page    []byte
		repos   int // > 0: a subscription of every repo, listRepos names this many
		bound   string
		maxHits int64
	}{
		{"records", ListingLimits{Records: 1000}, recordsPage(alice, 100, 10, "more"), 0, "more than 1000 records in one repo's listing", 11},
		{"bytes", ListingLimits{Bytes: 1 << 20}, recordsPage(alice, 100, 10<<10, "more"), 0, "bytes in one repo's listing", 2},
		{"pages", ListingLimits{Pages: 50}, recordsPage("did:plc:mallory", 100, 10, "more"), 0, "more than 50 pages in one repo's listing", 50},
		{"one response", ListingLimits{PageBytes: 1 << 20}, recordsPage(alice, 100, 20<<10, "more"), 0, "bytes in one response", 1},
		{"source", ListingLimits{SourceRecords: 2000}, nil, 10, "more than 2000 records in a listing of the source", 10 + 20 + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRepo(t, alice)
			dir := identity.NewMockDirectory()
			h := &hostile{listRecords: constantPage(tc.page)}
			dids := []string{alice}
			if tc.repos > 0 {
				h = &hostile{anyRepo: true, listRepos: reposOf(tc.repos), listRecords: threePages}
				dids = nil
			}
			src := hostileSource(t, r, h)
			dir.Insert(r.identityAt(src.srv.URL))
			for i := range tc.repos {
				dir.Insert(identity.Identity{DID: syntax.DID(repoDID(i)), Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: src.srv.URL}}})
			}
			src.write(testOp{"create", testCollection + "/alice", note("alice")})
			other := healthySource(t, dir)
			hub, _ := startHub(t, Options{Directory: dir, Listing: tc.limits})

			bad := subscribe(t, hub, src, dids...)
			elsewhere := subscribe(t, hub, other)
			err := refused(t, bad)
			if !strings.Contains(err.Error(), tc.bound) {
				t.Errorf("error %q does not name the bound %q", err, tc.bound)
			}
			if n := h.hits.Load(); n > tc.maxHits {
				t.Errorf("%d listing pages asked, want at most %d", n, tc.maxHits)
			}
			waitState(t, elsewhere, "bob's record on another source", func(st State, h Health) bool {
				return h.Connected && !h.Resyncing && len(st.Records) == 1
			})
			noRetryStorm(t, h)
		})
	}
}

func repoDID(i int) string { return fmt.Sprintf("did:plc:many%03d", i) }

// reposOf answers listRepos with n repos, in one page.
func reposOf(n int) http.HandlerFunc {
	repos := make([]map[string]any, n)
	for i := range repos {
		repos[i] = map[string]any{"did": repoDID(i), "head": "bafy", "rev": "x"}
	}
	b, _ := json.Marshal(map[string]any{"repos": repos})
	return constantPage(b)
}

// threePages answers listRecords of any repo with three pages of 100
// records each: 300 records a repo, within one repo's bounds.
func threePages(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	n, _ := strconv.Atoi(q.Get("cursor"))
	next := ""
	if n < 2 {
		next = strconv.Itoa(n + 1)
	}
	_, _ = w.Write(recordsPage(q.Get("repo"), 100, 10, next))
}

// TestAttackEndlessListingMemoryBounded runs the default limits against
// a source whose listRepos never ends (pages of 1000 DIDs) and a repo
// whose listRecords never ends (pages of 100 records of 1 KiB), until
// both are refused, and logs the pages asked and the peak heap in use
// and RSS of the test process meanwhile. The heap must stay under 512
// MiB: the limits allow 64 MiB for one repo's records, decoded pages of
// at most 8 MiB, and 200 000 DIDs.
func TestAttackEndlessListingMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("lists about 64 MiB")
	}
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	stop := make(chan struct{})
	heap, rss := peak(stop)

	alice := newTestRepo(t, "did:plc:alice")
	dir := identity.NewMockDirectory()
	h := &hostile{listRepos: constantPage(endlessRepos(1000)), listRecords: constantPage(recordsPage(alice.did, 100, 1<<10, "more"))}
	src := hostileSource(t, alice, h)
	dir.Insert(alice.identityAt(src.srv.URL))
	src.write(testOp{"create", testCollection + "/alice", note("alice")})
	hub, _ := startHub(t, Options{Directory: dir})
	started := time.Now()
	reposErr := refused(t, subscribe(t, hub, src))
	recordsErr := refused(t, subscribe(t, hub, src, alice.did))
	took := time.Since(started)
	close(stop)
	t.Logf("refused after %v and %d pages: %v; %v", took.Round(time.Millisecond), h.hits.Load(), reposErr, recordsErr)
	t.Logf("heap in use: %d MiB before, peak %d MiB; RSS peak %d MiB", base.HeapInuse>>20, heap.Load()>>20, rss.Load()>>20)
	if peak := heap.Load(); peak > 512<<20 {
		t.Errorf("peak heap in use %d MiB, want under 512 MiB", peak>>20)
	}
}

// peak samples the heap in use and the RSS until stop is closed.
func peak(stop <-chan struct{}) (heap, rss *atomic.Uint64) {
	heap, rss = new(atomic.Uint64), new(atomic.Uint64)
	go func() {
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > heap.Load() {
				heap.Store(ms.HeapInuse)
			}
			if r := vmRSS(); r > rss.Load() {
				rss.Store(r)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return heap, rss
}

// vmRSS is the process's resident set in bytes (0 where /proc is not).
func vmRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
