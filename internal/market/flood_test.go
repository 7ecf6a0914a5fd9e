package market

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/internal/backoff"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// floodSource is a PDS on loopback for every repo of a market test: an
// idle subscribeRepos websocket, and listings of fixed records, but for
// one repo whose bids it makes up, n of them, in pages of 5000 (it
// ignores the client's limit, as a hostile PDS may).
type floodSource struct {
	srv      *httptest.Server
	repos    []string
	fixed    map[string][]firehose.Record // by did and collection: did + " " + collection
	flooder  string
	n        int
	floodBid func(i int) json.RawMessage
}

const floodPage = 5000

func newFloodSource(t *testing.T, fs *floodSource) {
	mux := http.NewServeMux()
	mux.HandleFunc("/xrpc/com.atproto.sync.subscribeRepos", func(w http.ResponseWriter, req *http.Request) {
		con, err := (&websocket.Upgrader{}).Upgrade(w, req, nil)
		if err != nil {
			return
		}
		defer con.Close()
		for { // read (and drop) client frames so pings are answered
			if _, _, err := con.NextReader(); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/xrpc/com.atproto.sync.listRepos", func(w http.ResponseWriter, _ *http.Request) {
		var repos []map[string]any
		for _, d := range fs.repos {
			repos = append(repos, map[string]any{"did": d, "head": "bafy", "rev": "3kaaaaaaaaaa2"})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"repos": repos})
	})
	mux.HandleFunc("/xrpc/com.atproto.sync.getLatestCommit", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{"cid": "bafy", "rev": "3kaaaaaaaaaa2"})
	})
	mux.HandleFunc("/xrpc/com.atproto.repo.listRecords", func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		did, col := q.Get("repo"), q.Get("collection")
		type out struct {
			URI   string          `json:"uri"`
			CID   string          `json:"cid"`
			Value json.RawMessage `json:"value"`
		}
		page := map[string]any{}
		var recs []out
		if did == fs.flooder && col == lexicon.Bid {
			from, _ := strconv.Atoi(q.Get("cursor"))
			for i := from; i < fs.n && i < from+floodPage; i++ {
				recs = append(recs, out{URI(did, col, "f"+strconv.FormatInt(int64(i), 36)), "bafyflood", fs.floodBid(i)})
			}
			if from+floodPage < fs.n {
				page["cursor"] = strconv.Itoa(from + floodPage)
			}
		}
		for _, r := range fs.fixed[did+" "+col] {
			recs = append(recs, out{r.URI, r.CID, r.Value})
		}
		page["records"] = recs
		_ = json.NewEncoder(w).Encode(page)
	})
	fs.srv = httptest.NewServer(mux)
	t.Cleanup(fs.srv.Close)
}

// TestFloodOfStrangersBidsKeepsTheDeal: a stranger's repo lists 200 000
// valid bids (half on a request of the requester follower the feed holds,
// half on requests of the follower it does not hold) from a PDS on loopback, through the hub
// and the feed as the provider runs them, and is listed again twice. The
// follower's operator's associations, the lease and the accept of its
// live deal stay in the feed all along, so vouching holds and
// Absences.Gone does not end the deal; the stranger keeps its quota of
// bids and no more; the feed's records stay
// bounded (figures printed).
func TestFloodOfStrangersBidsKeepsTheDeal(t *testing.T) {
	op, shop, acme, stranger := "did:plc:op", "did:plc:shop", "did:plc:acme", "did:plc:stranger"
	now := time.Now()
	// Every strong reference names this CID (a record's own CID is not
	// checked against its value by a listing).
	const cid = "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"
	value := func(v any) json.RawMessage {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	reqURI := URI(shop, lexicon.Request, "r1")
	bidURI, accURI, leaseURI := URI(acme, lexicon.Bid, "b1"), URI(shop, lexicon.Accept, "a1"), URI(acme, lexicon.Lease, "l1")
	recs := []firehose.Record{
		{URI: URI(op, lexicon.Association, shop), CID: cid, Value: value(Association{Type: lexicon.Association, Subject: shop, Roles: []string{"requester"}, CreatedAt: Time(now)})},
		{URI: URI(op, lexicon.Association, acme), CID: cid, Value: value(Association{Type: lexicon.Association, Subject: acme, Roles: []string{"bidder"}, CreatedAt: Time(now)})},
		{URI: reqURI, CID: cid, Value: value(Request{Type: lexicon.Request, Shape: Shape{CPUMillis: 1000, MemoryMiB: 1024}, MaxPricePerHour: Price{10, "credits"},
			BidDeadline: Time(now.Add(time.Hour)), CreatedAt: Time(now)})},
		{URI: bidURI, CID: cid, Value: value(Bid{Type: lexicon.Bid, Request: StrongRef{reqURI, cid}, PricePerHour: Price{5, "credits"}, ValidUntil: Time(now.Add(time.Hour)), CreatedAt: Time(now)})},
		{URI: accURI, CID: cid, Value: value(Accept{Type: lexicon.Accept, Bid: StrongRef{bidURI, cid}, Request: StrongRef{reqURI, cid}, ConfirmBy: Time(now.Add(time.Hour)), CreatedAt: Time(now)})},
		{URI: leaseURI, CID: cid, Value: value(Lease{Type: lexicon.Lease, Accept: StrongRef{accURI, cid}, State: "running", CreatedAt: Time(now)})},
	}
	fs := &floodSource{repos: []string{op, shop, acme, stranger}, fixed: map[string][]firehose.Record{}, flooder: stranger, n: 200_000}
	for _, r := range recs {
		did, col, _ := SplitURI(r.URI)
		fs.fixed[did+" "+col] = append(fs.fixed[did+" "+col], r)
	}
	fs.floodBid = func(i int) json.RawMessage {
		// Short CIDs and keys: 200 000 of these fit in the hub's bound
		// of one repo's listing (64 MiB).
		on := StrongRef{reqURI, "bafyreic1"}
		if i%2 == 1 {
			on = StrongRef{URI(shop, lexicon.Request, "m"+strconv.FormatInt(int64(i), 36)), "bafyreic1"}
		}
		return value(Bid{Type: lexicon.Bid, Request: on, PricePerHour: Price{1, "credits"}, ValidUntil: Time(now.Add(time.Hour)), CreatedAt: Time(now)})
	}
	for _, v := range append(recs, firehose.Record{URI: URI(stranger, lexicon.Bid, "x"), Value: fs.floodBid(0)}, firehose.Record{URI: URI(stranger, lexicon.Bid, "y"), Value: fs.floodBid(1)}) {
		_, col, _ := SplitURI(v.URI)
		if err := lexicon.ValidateRecord(col, v.Value); err != nil {
			t.Fatalf("setup: %s is not valid: %v", v.URI, err)
		}
	}
	newFloodSource(t, fs)

	feeds, view := startFloodFeeds(t, fs, Follower{Role: RoleRequester, DID: shop, Operator: op,
		Request: mcreconcile.Request{Request: reconcile.Request{NamespacedName: types.NamespacedName{Name: "shop"}}}})
	fd := feeds.feed(fs.srv.URL)
	settled(t, fd, view, stranger, time.Time{})

	var absent Absences
	for round := range 2 {
		// The stranger's repo is listed again (a #sync or a broken
		// prevData of its own makes that happen at will).
		before := view.Listed(stranger)
		view.List(stranger)
		settled(t, fd, view, stranger, before)
		for _, uri := range []string{leaseURI, accURI, reqURI, bidURI} {
			if view.Get(uri) == nil {
				t.Errorf("round %d: %s was pushed out of the feed", round, uri)
			}
		}
		if !view.Vouches(op, acme, "bidder") || !view.Vouches(op, shop, "requester") {
			t.Errorf("round %d: the operator's associations were pushed out: vouching fails", round)
		}
		// What the requester does for a contract's lease (replica.go).
		acmeListed := view.Listed(acme)
		if view.Get(leaseURI) == nil && absent.Gone(view, acme, "lease|"+leaseURI, time.Now()) {
			t.Fatalf("round %d: Absences.Gone ended the live deal", round)
		}
		waitFor(t, "the counterparty's listing", func() bool { return view.Get(leaseURI) != nil || view.Listed(acme).After(acmeListed) }, new(string))
	}

	st, _, _ := fd.sub.Snapshot()
	members, strangers := fd.ledger.counts()
	held := 0
	for _, r := range view.Children(reqURI, lexicon.Bid) {
		if r.DID == stranger {
			held++
		}
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("after 3 listings of %d bids: the feed keeps %d records (%d of members, %d of the stranger, %d of them on the held request); heap in use %d MiB; refused by author quota %.0f",
		fs.n, len(st.Records), members, strangers, held, ms.HeapInuse>>20, testutil.ToFloat64(feeds.refused.WithLabelValues(refusedAuthor)))
	if strangers != feeds.opts.MaxRecordsPerStranger {
		t.Errorf("the stranger keeps %d records (%d on the held request), want its quota, %d", strangers, held, feeds.opts.MaxRecordsPerStranger)
	}
	if len(st.Records) > len(recs)+feeds.opts.MaxRecordsPerStranger {
		t.Errorf("the feed keeps %d records, want at most %d", len(st.Records), len(recs)+feeds.opts.MaxRecordsPerStranger)
	}
}

// startFloodFeeds runs a hub and feeds over fs (every repo's PDS) until
// the test ends, and follows fs as fl.
func startFloodFeeds(t *testing.T, fs *floodSource, fl Follower) (*Feeds, Reader) {
	t.Helper()
	dir := identity.NewMockDirectory()
	for _, d := range fs.repos {
		dir.Insert(identity.Identity{DID: syntax.DID(d), Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: fs.srv.URL}}})
	}
	metrics, err := firehose.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	hub, err := firehose.NewHub(firehose.Options{Directory: dir, Metrics: metrics, Log: testr.NewWithOptions(t, testr.Options{Verbosity: 1}), Gather: 10 * time.Millisecond,
		Policy:  netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil),
		Backoff: backoff.Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	feeds, err := NewFeeds(hub, FeedsOptions{Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{hub.Start, feeds.Start} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = run(ctx)
		}()
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	view, err := feeds.Follow(fl, []string{fs.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return feeds, view
}

// feed returns the feed of src.
func (f *Feeds) feed(src string) *feed {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, _ := firehose.NormalizeSource(src)
	return f.feeds[n]
}

// settled waits until view is complete, did was listed after after, and
// the feed's index holds what its subscription does.
func settled(t *testing.T, fd *feed, view Reader, did string, after time.Time) {
	t.Helper()
	var why string
	waitFor(t, "the listing of "+did, func() bool {
		if err := view.Complete(); err != nil || !view.Listed(did).After(after) {
			why = fmt.Sprintf("complete: %v; listed %v", err, view.Listed(did))
			return false
		}
		_, _, version := fd.sub.Snapshot()
		why = fmt.Sprintf("index at version %d of %d", fd.idx.Load().version, version)
		return fd.idx.Load().version == version
	}, &why)
}

func waitFor(t *testing.T, what string, ok func() bool, why *string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (%s)", what, *why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
