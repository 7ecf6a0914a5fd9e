package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/gorilla/websocket"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
)

// rssBound is how far the provider's resident set may grow above what it
// was before an attack: generous, the listing limits allow far less.
const rssBound = 512 << 20

// hostileSource is an ATProto source on loopback whose listRepos never
// ends (pages of 1000 DIDs, always another cursor) and whose
// subscribeRepos websocket stays idle. pages counts the listRepos pages
// it answered.
func hostileSource(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	page := endlessReposPage(1000)
	pages := new(atomic.Int64)
	mux := http.NewServeMux()
	mux.HandleFunc("/xrpc/com.atproto.sync.subscribeRepos", idleFirehose)
	mux.HandleFunc("/xrpc/com.atproto.sync.listRepos", func(w http.ResponseWriter, _ *http.Request) {
		pages.Add(1)
		_, _ = w.Write(page)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, pages
}

// idleFirehose upgrades to a websocket that sends nothing; it reads (and
// drops) the client's frames so pings are answered, until the client goes.
func idleFirehose(w http.ResponseWriter, req *http.Request) {
	con, err := (&websocket.Upgrader{}).Upgrade(w, req, nil)
	if err != nil {
		return
	}
	defer con.Close()
	for {
		if _, _, err := con.NextReader(); err != nil {
			return
		}
	}
}

// endlessReposPage is a listRepos page of n DIDs whose cursor never ends.
func endlessReposPage(n int) []byte {
	repos := make([]map[string]any, n)
	for i := range repos {
		repos[i] = map[string]any{"did": fmt.Sprintf("did:plc:endless%09d", i), "head": "bafy", "rev": "x"}
	}
	b, _ := json.Marshal(map[string]any{"repos": repos, "cursor": "more"})
	return b
}

// rssSampler samples a process's resident set every 500 ms until stop is
// called, and keeps the peak.
type rssSampler struct {
	before, peak atomic.Int64
	done         chan struct{}
	stopped      chan struct{}
}

func sampleRSS(t *testing.T, p *framework.Process) *rssSampler {
	t.Helper()
	before, err := p.RSS()
	if err != nil {
		t.Fatal(err)
	}
	s := &rssSampler{done: make(chan struct{}), stopped: make(chan struct{})}
	s.before.Store(before)
	s.peak.Store(before)
	go func() {
		defer close(s.stopped)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
			if r, err := p.RSS(); err == nil && r > s.peak.Load() {
				s.peak.Store(r)
			}
		}
	}()
	return s
}

// stop ends the sampling, logs the figure and fails the test if the peak
// passed before + rssBound.
func (s *rssSampler) stop(t *testing.T, p *framework.Process, what string) {
	t.Helper()
	close(s.done)
	<-s.stopped
	after, err := p.RSS()
	if err != nil {
		t.Fatal(err)
	}
	before, peak := s.before.Load(), s.peak.Load()
	t.Logf("FIGURE provider RSS before/peak/after (%s): %d/%d/%d MiB", what, before>>20, peak>>20, after>>20)
	if peak > before+rssBound {
		t.Errorf("%s: the provider's RSS peaked at %d MiB, more than %d MiB above the %d MiB before", what, peak>>20, rssBound>>20, before>>20)
	}
}

// TestProviderRSSUnderHostileSources runs hostile sources on loopback
// against the suite's knotless-provider and prints its resident set
// before, at the peak and after, which must stay within rssBound of where
// it started: an AtprotoRecordWatch of every repo of a source whose
// listRepos never ends (refused with ListingTooLarge), and a market
// network whose firehose lists a stranger's 200 000 bids.
func TestProviderRSSUnderHostileSources(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	t.Run("EndlessListRepos", func(t *testing.T) { endlessListRepos(ctx, t) })
	t.Run("MarketFeedFlood", func(t *testing.T) { floodMarketFeed(ctx, t) })
}

// endlessListRepos: an AtprotoRecordWatch of every repo of a source
// whose listRepos never ends is refused with ListingTooLarge.
func endlessListRepos(ctx context.Context, t *testing.T) {
	started := time.Now()
	src, pages := hostileSource(t)
	c, _ := appWorkspace(ctx, t, env.prefix+"-hostile")

	rss := sampleRSS(t, env.provider.Process)
	w := recordWatch("endless", nil, watchCollection)
	w.Spec.Source.URL = src.URL
	create(ctx, t, c, w)
	waitWatch(ctx, t, c, "endless", "ListingTooLarge", 5*time.Minute, watchReason(atprotov1alpha1.ReasonListingTooLarge))
	rss.stop(t, env.provider.Process, "endless listRepos")
	t.Logf("endless listRepos refused after %d pages in %v", pages.Load(), time.Since(started).Round(time.Millisecond))
}

// floodPDS is a PDS on loopback that holds one repo, stranger's, of n
// valid bids on someone else's request (in pages of 5000, whatever limit
// the client asks), with an idle subscribeRepos websocket: as a firehose
// of a network its listing floods the provider's market feed. listed
// counts the complete listings of the bids it served.
type floodPDS struct {
	srv      *httptest.Server
	stranger string
	n        int
	bid      json.RawMessage
	listed   atomic.Int64
}

const floodPage = 5000

func newFloodPDS(t *testing.T, n int) *floodPDS {
	t.Helper()
	now := time.Now()
	on := market.StrongRef{URI: market.URI("did:plc:someoneelse", lexicon.Request, "r1"), CID: "bafyreic1"}
	bid, err := json.Marshal(market.Bid{Type: lexicon.Bid, Request: on, PricePerHour: market.Price{Amount: 1, Currency: "credits"},
		ValidUntil: market.Time(now.Add(time.Hour)), CreatedAt: market.Time(now)})
	if err != nil {
		t.Fatal(err)
	}
	if err := lexicon.ValidateRecord(lexicon.Bid, bid); err != nil {
		t.Fatalf("the flood's bid is not valid: %v", err)
	}
	f := &floodPDS{n: n, bid: bid}
	mux := http.NewServeMux()
	mux.HandleFunc("/xrpc/com.atproto.sync.subscribeRepos", idleFirehose)
	mux.HandleFunc("/xrpc/com.atproto.sync.listRepos", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"repos": []map[string]any{{"did": f.stranger, "head": "bafy", "rev": "3kaaaaaaaaaa2"}}})
	})
	mux.HandleFunc("/xrpc/com.atproto.sync.getLatestCommit", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{"cid": "bafy", "rev": "3kaaaaaaaaaa2"})
	})
	mux.HandleFunc("/xrpc/com.atproto.repo.listRecords", f.listRecords)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *floodPDS) listRecords(w http.ResponseWriter, req *http.Request) {
	type record struct {
		URI   string          `json:"uri"`
		CID   string          `json:"cid"`
		Value json.RawMessage `json:"value"`
	}
	q := req.URL.Query()
	page := map[string]any{"records": []record{}}
	if q.Get("repo") == f.stranger && q.Get("collection") == lexicon.Bid {
		from, _ := strconv.Atoi(q.Get("cursor"))
		recs := make([]record, 0, floodPage)
		for i := from; i < f.n && i < from+floodPage; i++ {
			recs = append(recs, record{market.URI(f.stranger, lexicon.Bid, "f"+strconv.FormatInt(int64(i), 36)), "bafyflood", f.bid})
		}
		page["records"] = recs
		if from+floodPage < f.n {
			page["cursor"] = strconv.Itoa(from + floodPage)
		} else {
			defer f.listed.Add(1)
		}
	}
	_ = json.NewEncoder(w).Encode(page)
}

// createPLCIdentity registers a new did:plc in the suite's PLC whose PDS
// is pds, with a genesis operation signed by a fresh key, and returns the
// DID.
func createPLCIdentity(ctx context.Context, t *testing.T, handle, pds string) string {
	t.Helper()
	key, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := key.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	op := map[string]any{
		"type":                "plc_operation",
		"rotationKeys":        []any{pub.DIDKey()},
		"verificationMethods": map[string]any{"atproto": pub.DIDKey()},
		"alsoKnownAs":         []any{"at://" + handle},
		"services":            map[string]any{"atproto_pds": map[string]any{"type": "AtprotoPersonalDataServer", "endpoint": pds}},
		"prev":                nil,
	}
	signPLC(t, key, op)
	signed, err := atdata.MarshalCBOR(op)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(signed)
	did := "did:plc:" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:]))[:24]
	body, err := json.Marshal(op)
	if err != nil {
		t.Fatal(err)
	}
	plcDo(ctx, t, http.MethodPost, env.plc.URL+"/"+did, body, nil)
	return did
}

// floodMarketFeed: a network whose firehose is a PDS listing one
// stranger's repo of 200 000 valid bids is followed by a bidder; the
// provider's market feed reads the whole listing (the hostile PDS serves
// its last page) while the provider's RSS is sampled, and 10 s after.
func floodMarketFeed(ctx context.Context, t *testing.T) {
	started := time.Now()
	f := newFloodPDS(t, 200_000)
	f.stranger = createPLCIdentity(ctx, t, env.prefix+"stranger.test", f.srv.URL)
	c := marketWorkspace(ctx, t, env.prefix+"-flood")
	create(ctx, t, c, &marketv1alpha1.MarketNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: "flooded"},
		Spec:       marketv1alpha1.MarketNetworkSpec{Firehoses: []string{f.srv.URL}, PDSHosts: []string{env.pds.URL}},
	})
	participant(ctx, t, c, env.pds, env.prefix+"floodseller.test", "seller", "flooded")

	rss := sampleRSS(t, env.provider.Process)
	create(ctx, t, c, bidder("b", "seller", "flooded", 25))
	if err := framework.Eventually(ctx, 5*time.Minute, "the flood's bids listed", func(context.Context) (bool, string, error) {
		return f.listed.Load() >= 1, fmt.Sprintf("%d listings", f.listed.Load()), nil
	}); err != nil {
		t.Fatal(err)
	}
	// The feed indexes what it read after the last page: keep sampling
	// a while.
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
	}
	rss.stop(t, env.provider.Process, "200 000 bids")
	t.Logf("the flood of %d bids listed %d times in %v", f.n, f.listed.Load(), time.Since(started).Round(time.Millisecond))
}
