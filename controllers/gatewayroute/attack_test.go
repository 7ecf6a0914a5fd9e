package gatewayroute

// Adversarial tests of the routes a requester's records make, from a
// review: TestAtk* are attacks that found a hole (fixed since; they guard
// it), TestHolds* show a defence that held.

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/driver/drivertest"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/gateway"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// TestAtkOlderLeaseTakesServedHostname: bob's lease serves
// bob.gw.test (his ATProto handle: the gateway answers his DID at
// /.well-known/atproto-did). Mallory, who has held an older lease of the
// same bidder, publishes a record claiming bob.gw.test for her lease: the
// older contract ranks first, so from her next commit the gateway sends
// bob's visitors to mallory's Service, with the bidder's valid
// certificate, and answers mallory's DID for bob's handle. The rank meant
// to stop a later lease from taking an earlier one's hostname lets an
// earlier lease take any hostname a later one serves.
func TestAtkOlderLeaseTakesServedHostname(t *testing.T) {
	const (
		bob, mallory = "did:plc:bob", "did:plc:mallory"
		bobLease     = "at://did:plc:bidder/dev.knotless.market.lease/bob"
		malLease     = "at://did:plc:bidder/dev.knotless.market.lease/mallory"
	)
	now := time.Now().Truncate(time.Second)
	bobVM, bobCC := contractFor("bob", bob, bobLease, now)
	malVM, malCC := contractFor("mallory", mallory, malLease, now.Add(-30*24*time.Hour))
	ws := clustertest.New(bobVM, bobCC, malVM, malCC)
	records := &fakeRecords{byDID: map[string]map[string]json.RawMessage{bob: {}, mallory: {}}, follows: map[types.NamespacedName]string{}}
	routes := &gateway.Routes{}
	r := &Reconciler{Client: ws.Client, Drivers: map[string]driver.Driver{"kind": podDriver{drivertest.New(t)}},
		Records: records, Routes: routes, Covers: func(h string) bool { return strings.HasSuffix(h, ".gw.test") }}
	rec := func(name string) {
		t.Helper()
		if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "bids", Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	uri, v := claim(bob, "bob.gw.test", "bob.gw.test", bobLease)
	records.byDID[bob][uri] = v
	rec("bob")
	rec("mallory")
	if got, ok := routes.Get("bob.gw.test"); !ok || got.DID != bob {
		t.Fatalf("bob's hostname: %+v %v", got, ok)
	}
	// Mallory claims it later.
	uri, v = claim(mallory, "bob.gw.test", "bob.gw.test", malLease)
	records.byDID[mallory][uri] = v
	rec("mallory")
	if got, _ := routes.Get("bob.gw.test"); got.DID != bob {
		t.Errorf("a hostname bob's lease serves is now served for %s (its atproto-did answers %s)", got.DID, got.DID)
	}
}

// TestHoldsOddRecords: records of odd shape never panic and never make a
// route other than the one a well-formed record of this DID and lease
// makes.
func TestHoldsOddRecords(t *testing.T) {
	prefix := "at://" + alice + "/" + lexicon.GatewayAssociation + "/"
	good := `"lease":{"uri":"` + lease + `"},"service":{"namespace":"web","name":"shop","port":80}`
	records := map[string]json.RawMessage{
		prefix + "a.gw.test":                    json.RawMessage(`null`),
		prefix + "b.gw.test":                    json.RawMessage(`[]`),
		prefix + "c.gw.test":                    json.RawMessage(`"c.gw.test"`),
		prefix + "d.gw.test":                    json.RawMessage(`{"hostname":null,` + good + `}`),
		prefix + "e.gw.test":                    json.RawMessage(`{"hostname":"e.gw.test","lease":{"uri":"` + lease + `"},"service":{"namespace":"web","name":"shop","port":"80"}}`),
		prefix + "f.gw.test":                    json.RawMessage(`{"hostname":"f.gw.test","lease":{"uri":"` + lease + `"},"service":{"namespace":"web","name":"shop","port":1e99}}`),
		prefix + "g.gw.test":                    json.RawMessage(`{"hostname":"g.gw.test","lease":{"uri":"` + lease + `"},"service":{"namespace":"web","name":"shop","port":65536}}`),
		prefix + "h.gw.test":                    json.RawMessage(`{"hostname":"h.gw.test","lease":{"uri":"` + lease + `"},"service":{"namespace":"../x","name":"shop","port":80}}`),
		prefix + "i.gw.test.":                   json.RawMessage(`{"hostname":"i.gw.test.",` + good + `}`),
		prefix + "*.gw.test":                    json.RawMessage(`{"hostname":"*.gw.test",` + good + `}`),
		prefix + "j.gw.test:443":                json.RawMessage(`{"hostname":"j.gw.test:443",` + good + `}`),
		prefix + "k\u212a.gw.test":              json.RawMessage(`{"hostname":"k\u212a.gw.test",` + good + `}`),
		prefix + "xn--n3h.gw.test/../m.gw.test": json.RawMessage(`{"hostname":"xn--n3h.gw.test/../m.gw.test",` + good + `}`),
		prefix + "m.gw.test":                    json.RawMessage(`{"hostname":"m.gw.test","lease":{"uri":"at://did:plc:bidder/dev.knotless.market.lease/other"},"lease":{"uri":"` + lease + `"},"service":{"namespace":"web","name":"shop","port":80}}`),
		"at://" + alice + "x/" + lexicon.GatewayAssociation + "/n.gw.test": json.RawMessage(`{"hostname":"n.gw.test",` + good + `}`),
		"at://" + alice + "/dev.knotless.other/o.gw.test":                  json.RawMessage(`{"hostname":"o.gw.test",` + good + `}`),
		prefix + "ok.gw.test": json.RawMessage(`{"hostname":"ok.gw.test",` + good + `}`),
	}
	got := Routes(records, alice, lease, func(h string) bool { return strings.HasSuffix(h, ".gw.test") })
	var hosts []string
	for _, r := range got {
		hosts = append(hosts, r.Hostname)
		if r.DID != alice || r.Namespace != "web" || r.Service != "shop" || r.Port != 80 {
			t.Errorf("route %+v", r)
		}
	}
	// m.gw.test: duplicate keys, the last (this lease) wins; it is alice's
	// own record for her own lease, so nothing is gained.
	for _, h := range hosts {
		if h != "ok.gw.test" && h != "m.gw.test" {
			t.Errorf("odd record served: %v", hosts)
		}
	}
}

// TestHoldsHubRecordsJoined: every relay goroutine of HubRecords ends
// when its last VM unfollows and when the runnable stops; a Follow after
// the stop starts nothing.
func TestHoldsHubRecordsJoined(t *testing.T) {
	dir := identity.NewMockDirectory()
	for _, d := range []string{"did:plc:aaa", "did:plc:bbb", "did:plc:ccc"} {
		dir.Insert(identity.Identity{DID: syntax.DID(d), Handle: syntax.HandleInvalid,
			Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: "https://pds.example.test"}}})
	}
	hub, err := firehose.NewHub(firehose.Options{Directory: dir, Policy: netpolicy.New(nil, nil)})
	if err != nil {
		t.Fatal(err)
	}
	h := NewHubRecords(hub, dir)
	relays := func() int {
		buf := make([]byte, 4<<20)
		return strings.Count(string(buf[:runtime.Stack(buf, true)]), "(*HubRecords).relay")
	}
	base := relays()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- h.Start(ctx) }()
	vm := func(i int) types.NamespacedName {
		return types.NamespacedName{Namespace: "bids", Name: string(rune('a' + i))}
	}
	for i := range 6 {
		if err := h.Follow(t.Context(), vm(i), []string{"did:plc:aaa", "did:plc:bbb", "did:plc:ccc"}[i%3]); err != nil {
			t.Fatal(err)
		}
	}
	// A VM moves to another DID, a VM follows twice: still 3 relays.
	_ = h.Follow(t.Context(), vm(0), "did:plc:bbb")
	_ = h.Follow(t.Context(), vm(1), "did:plc:bbb")
	if err := h.Follow(t.Context(), vm(2), "not a did"); err == nil {
		t.Fatal("a non-DID followed")
	}
	if err := h.Follow(t.Context(), vm(2), "did:plc:unknown"); err == nil {
		t.Fatal("an unresolved DID followed")
	}
	// aaa (vm 3), bbb (vms 0, 1, 4), ccc (vm 5; vm 2 unfollowed by its
	// failed Follows): one relay per DID.
	waitFor := func(want int) int {
		n := relays() - base
		for deadline := time.Now().Add(2 * time.Second); n != want && time.Now().Before(deadline); n = relays() - base {
			time.Sleep(10 * time.Millisecond)
		}
		return n
	}
	if n := waitFor(3); n != 3 {
		t.Errorf("%d relays, want 3", n)
	}
	for i := range 6 {
		h.Unfollow(vm(i))
	}
	if n := waitFor(0); n != 0 {
		t.Errorf("%d relays after every VM unfollowed", n)
	}
	_ = h.Follow(t.Context(), vm(0), "did:plc:aaa")
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("HubRecords did not stop")
	}
	if n := relays() - base; n != 0 {
		t.Errorf("%d relays after the stop", n)
	}
	if err := h.Follow(t.Context(), vm(1), "did:plc:aaa"); err == nil {
		t.Error("a Follow after the stop started a subscription")
	}
}
