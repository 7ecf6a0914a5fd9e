package marketidentity

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/gorilla/websocket"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// endlessOperatorPDS is the operator's PDS and the network's firehose: it
// keeps a firehose connection open without events and answers listRecords
// of the operator's associations with pages that never end.
func endlessOperatorPDS(t *testing.T, op string) *httptest.Server {
	recs := make([]map[string]any, 100)
	for i := range recs {
		recs[i] = map[string]any{
			"uri":   fmt.Sprintf("at://%s/%s/r%04d", op, lexicon.Association, i),
			"cid":   "bafy",
			"value": map[string]any{"$type": lexicon.Association, "subject": "did:plc:someone", "roles": []string{"bidder"}},
		}
	}
	page, _ := json.Marshal(map[string]any{"records": recs, "cursor": "more"})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/xrpc/com.atproto.sync.subscribeRepos":
			con, err := (&websocket.Upgrader{}).Upgrade(w, req, nil)
			if err != nil {
				return
			}
			defer con.Close()
			_, _, _ = con.ReadMessage()
		case "/xrpc/com.atproto.sync.getLatestCommit":
			_ = json.NewEncoder(w).Encode(map[string]string{"cid": "bafy", "rev": "3333333333333"})
		case "/xrpc/com.atproto.repo.listRecords":
			_, _ = w.Write(page)
		default:
			http.NotFound(w, req)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestVouchListingTooLarge: the operator's PDS lists associations without
// end. The identity is not vouched for, with the reason ListingTooLarge
// (not SourceUnreachable: the source answered, too much).
func TestVouchListingTooLarge(t *testing.T) {
	const op = "did:plc:operator"
	srv := endlessOperatorPDS(t, op)
	dir := identity.NewMockDirectory()
	dir.Insert(identity.Identity{DID: syntax.DID(op), Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: srv.URL}}})
	hub, err := firehose.NewHub(firehose.Options{
		Directory: dir,
		Policy:    netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil),
		Gather:    time.Millisecond,
		Listing:   firehose.ListingLimits{Records: 1000},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = hub.Start(t.Context()) }()
	t.Cleanup(func() { <-done })

	r := &Reconciler{Hub: hub}
	id := &marketv1alpha1.MarketIdentity{ObjectMeta: metav1.ObjectMeta{Name: "me", Generation: 1}}
	net := &marketv1alpha1.MarketNetwork{ObjectMeta: metav1.ObjectMeta{Name: "net"}}
	net.Spec.OperatorDID = op
	net.Spec.Firehoses = []string{srv.URL}
	st := &marketv1alpha1.MarketIdentityStatus{DID: "did:plc:me"}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.vouch("ws/me", id, net, st)
		c := vouched(st)
		if c != nil && c.Reason == marketv1alpha1.ReasonListingTooLarge {
			t.Logf("%s: %s", c.Reason, c.Message)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Vouched %+v, want reason %s", c, marketv1alpha1.ReasonListingTooLarge)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.unfollow("ws/me", nil)
}

func vouched(st *marketv1alpha1.MarketIdentityStatus) *metav1.Condition {
	for i := range st.Conditions {
		if st.Conditions[i].Type == marketv1alpha1.ConditionVouched {
			return &st.Conditions[i]
		}
	}
	return nil
}
