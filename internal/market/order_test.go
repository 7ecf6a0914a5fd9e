package market

import (
	"encoding/json"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/lexicon"
)

// TestStrangersBidsListedBeforeTheRequestAreKept (from review): a full
// listing that reads a stranger's repo before the requester follower's
// keeps the stranger's bid on the follower's request. Were a bid kept
// only once the feed holds its request, the order of the listing would
// decide, and nothing lists the stranger again (the requester does not
// know it): its bids would stay out until it writes again.
func TestStrangersBidsListedBeforeTheRequestAreKept(t *testing.T) {
	shop, stranger := "did:plc:shop", "did:plc:stranger"
	now := time.Now()
	const cid = "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"
	reqURI := URI(shop, lexicon.Request, "r1")
	req, err := json.Marshal(Request{Type: lexicon.Request, Shape: Shape{CPUMillis: 1000, MemoryMiB: 1024}, MaxPricePerHour: Price{10, "credits"},
		BidDeadline: Time(now.Add(time.Hour)), CreatedAt: Time(now)})
	if err != nil {
		t.Fatal(err)
	}
	fs := &floodSource{repos: []string{stranger, shop}, flooder: stranger, n: 1,
		fixed: map[string][]firehose.Record{shop + " " + lexicon.Request: {{URI: reqURI, CID: cid, Value: req}}}}
	fs.floodBid = func(int) json.RawMessage {
		b, _ := json.Marshal(Bid{Type: lexicon.Bid, Request: StrongRef{reqURI, cid}, PricePerHour: Price{1, "credits"}, ValidUntil: Time(now.Add(time.Hour)), CreatedAt: Time(now)})
		return b
	}
	newFloodSource(t, fs)
	feeds, view := startFloodFeeds(t, fs, Follower{Role: RoleRequester, DID: shop,
		Request: mcreconcile.Request{Request: reconcile.Request{NamespacedName: types.NamespacedName{Name: "shop"}}}})
	fd := feeds.feed(fs.srv.URL)
	settled(t, fd, view, shop, time.Time{})
	settled(t, fd, view, stranger, time.Time{})
	if view.Get(reqURI) == nil {
		t.Fatal("the request is not in the feed")
	}
	if n := len(view.Children(reqURI, lexicon.Bid)); n != 1 {
		t.Errorf("the feed holds %d bids on the request, want the stranger's 1", n)
	}
}
