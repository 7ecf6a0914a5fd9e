package firehose

// A repo whose listing is all records it drops (they claim another
// repo): before, nothing but pages was charged for them, so one repo
// could make knotless read pages × page size (5000 × 8 MiB by default)
// at every try (R21). Found by an attack on the source budget.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// hostilePDS serves listRecords for did:plc:evil* repos and honest
// did:plc:bob*. changing repos get a new rev at every getLatestCommit.
// foreign: evil's records claim another repo (dropped, never charged).
// pages: pages per collection listing of an evil repo; size: bytes of
// each record's value; per: records per page.
type hostilePDS struct {
	srv               *httptest.Server
	served            atomic.Int64 // bytes of listRecords bodies
	revs              atomic.Int64
	changing, foreign bool
	pages, per, size  int
}

func newHostilePDS(t *testing.T, p *hostilePDS) *hostilePDS {
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		did := q.Get("repo")
		if did == "" {
			did = q.Get("did")
		}
		evil := strings.HasPrefix(did, "did:plc:evil")
		switch req.URL.Path {
		case "/xrpc/com.atproto.sync.getLatestCommit":
			rev := "3333333333333"
			if evil && p.changing {
				rev = fmt.Sprintf("3%012d", p.revs.Add(1))
			}
			_ = json.NewEncoder(w).Encode(map[string]string{"cid": "bafy", "rev": rev})
		case "/xrpc/com.atproto.repo.listRecords":
			if !evil {
				_, _ = w.Write(recordsPage(did, 1, 10, ""))
				return
			}
			n := 0
			_, _ = fmt.Sscan(q.Get("cursor"), &n) // no cursor: the first page
			cursor := ""
			if n+1 < p.pages {
				cursor = fmt.Sprint(n + 1)
			}
			owner := did
			if p.foreign {
				owner = "did:plc:someoneelse"
			}
			b := recordsPage(owner, p.per, p.size, cursor)
			p.served.Add(int64(len(b)))
			_, _ = w.Write(b)
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func relayOf(t *testing.T, dir *identity.MockDirectory, pds string, dids []string) string {
	var list []map[string]any
	for _, d := range dids {
		list = append(list, map[string]any{"did": d, "head": "bafy", "rev": "x"})
		dir.Insert(identity.Identity{DID: syntax.DID(d), Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: pds}}})
	}
	body, _ := json.Marshal(map[string]any{"repos": list})
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	t.Cleanup(relay.Close)
	return relay.URL
}

// TestAttackDroppedRecordsAreCharged: a repo serving only records of
// another repo is read up to its own bound, not up to the pages' (before:
// 39 pages of about 60 KiB read against a 256 KiB bound), and the listing
// goes on for the other repos.
func TestAttackDroppedRecordsAreCharged(t *testing.T) {
	lim := ListingLimits{PageBytes: 64 << 10, Pages: 40, Bytes: 256 << 10, SourceBytes: 1 << 20, Records: 1 << 20, SourceRecords: 1 << 20}
	p := newHostilePDS(t, &hostilePDS{foreign: true, pages: lim.Pages - 1, per: 30, size: 2000})
	dir := identity.NewMockDirectory()
	relay := relayOf(t, dir, p.srv.URL, []string{"did:plc:evil", "did:plc:bob"})
	s := bareStream(t, dir, relay, lim)
	sub := testSub(s, Filter{Collections: []string{testCollection}})
	if err := s.resyncAll(context.Background(), sub, ResyncInitial); err != nil {
		t.Fatalf("the listing failed for everyone: %v", err)
	}
	if served, most := p.served.Load(), lim.Bytes+2*lim.PageBytes; served > most {
		t.Errorf("the hostile repo was read for %d bytes, past its bound of %d (and a page)", served, lim.Bytes)
	}
	st, _, _ := sub.Snapshot()
	bob := 0
	for uri := range st.Records {
		if strings.HasPrefix(uri, "at://did:plc:bob/") {
			bob++
		}
	}
	if bob == 0 {
		t.Errorf("bob's records were not listed: %v", st.Records)
	}
}
