package market

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/lexicon"
)

func rec(t *testing.T, did, collection, rkey, cid string, v any) firehose.Record {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return firehose.Record{URI: URI(did, collection, rkey), CID: cid, Value: b}
}

// TestBuildIndexesAndRemembersFirstSeen: a feed's index finds records by
// the record they answer (an accept also by its request), keeps when it
// first saw each version, and reports new, changed and deleted records.
func TestBuildIndexesAndRemembersFirstSeen(t *testing.T) {
	t0 := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	req := rec(t, "did:plc:req", lexicon.Request, "r1", "c1", Request{Type: lexicon.Request, Shape: Shape{CPUMillis: 1, MemoryMiB: 1},
		MaxPricePerHour: Price{1, "credits"}, BidDeadline: Time(t0), CreatedAt: Time(t0)})
	bid := rec(t, "did:plc:bid", lexicon.Bid, "b1", "c2", Bid{Type: lexicon.Bid, Request: StrongRef{req.URI, "c1"}, PricePerHour: Price{1, "credits"}, ValidUntil: Time(t0), CreatedAt: Time(t0)})
	acc := rec(t, "did:plc:req", lexicon.Accept, "a1", "c3", Accept{Type: lexicon.Accept, Bid: StrongRef{bid.URI, "c2"}, Request: StrongRef{req.URI, "c1"}, ConfirmBy: Time(t0), CreatedAt: Time(t0)})
	state := firehose.State{Records: map[string]firehose.Record{req.URI: req, bid.URI: bid}}
	idx, changed := build(&index{}, state, 1, firehose.Health{Connected: true}, t0, logr.Discard())
	if len(changed) != 2 || len(idx.requests) != 1 || len(idx.children[req.URI]) != 1 {
		t.Fatalf("changed %d, requests %d, children %v", len(changed), len(idx.requests), idx.children)
	}
	state.Records[acc.URI] = acc
	idx2, changed := build(idx, state, 2, firehose.Health{Connected: true}, t0.Add(time.Minute), logr.Discard())
	if len(changed) != 1 || changed[0].URI != acc.URI {
		t.Fatalf("changed %v", changed)
	}
	if idx2.recs[bid.URI].FirstSeen != t0 || idx2.recs[acc.URI].FirstSeen != t0.Add(time.Minute) {
		t.Errorf("first seen: bid %v, accept %v", idx2.recs[bid.URI].FirstSeen, idx2.recs[acc.URI].FirstSeen)
	}
	fd := &feed{}
	fd.idx.Store(idx2)
	v := View{feeds: []*feed{fd}, refreshEvery: time.Second, now: time.Now}
	if got := v.Children(req.URI, lexicon.Accept); len(got) != 1 || got[0].URI != acc.URI {
		t.Errorf("accepts of the request: %v", got)
	}
	if got := v.Children(bid.URI, lexicon.Accept); len(got) != 1 {
		t.Errorf("accepts of the bid: %v", got)
	}
	if err := v.Complete(); err != nil {
		t.Errorf("Complete: %v", err)
	}
	delete(state.Records, bid.URI)
	_, changed = build(idx2, state, 3, firehose.Health{Connected: true, Full: true}, t0, logr.Discard())
	if len(changed) != 1 || changed[0].URI != bid.URI {
		t.Errorf("a deleted record is a change: %v", changed)
	}
	fd.idx.Store(&index{built: true, health: firehose.Health{Connected: true, Full: true}})
	if v.Complete() == nil {
		t.Error("a feed in a full listing is complete")
	}
}

// TestRouteWakesWhomARecordConcerns: a request wakes every bidder of the
// feed; a bid or lease the requester whose record it answers; an accept
// or release the bidder whose record it answers.
func TestRouteWakesWhomARecordConcerns(t *testing.T) {
	f, err := NewFeeds(nil, FeedsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	req := func(name string) mcreconcile.Request {
		return mcreconcile.Request{ClusterName: "ws", Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}}
	}
	for _, fl := range []Follower{{Role: RoleRequester, DID: "did:plc:shop", Request: req("shop")}, {Role: RoleBidder, DID: "did:plc:acme", Request: req("acme")},
		{Role: RoleBidder, DID: "did:plc:other", Request: req("other")}} {
		f.followers[fl.Request] = &following{Follower: fl, sources: []string{"https://pds"}}
		f.index(fl, true)
	}
	f.feeds["https://pds"] = &feed{users: map[mcreconcile.Request]bool{req("shop"): true, req("acme"): true, req("other"): true}}
	woken := func() map[string]bool {
		out := map[string]bool{}
		for _, role := range []Role{RoleRequester, RoleBidder} {
			for len(f.triggers[role]) > 0 {
				out[string(role)+"/"+(<-f.triggers[role]).Object.Name] = true
			}
		}
		return out
	}
	f.route("https://pds", []*Rec{{Collection: lexicon.Request}}, &index{})
	if w := woken(); len(w) != 2 || !w["bidder/acme"] || !w["bidder/other"] {
		t.Errorf("a request woke %v", w)
	}
	f.route("https://pds", []*Rec{{Collection: lexicon.Bid, Parent: StrongRef{URI: URI("did:plc:shop", lexicon.Request, "r")}}}, &index{})
	if w := woken(); len(w) != 1 || !w["requester/shop"] {
		t.Errorf("a bid woke %v", w)
	}
	f.route("https://pds", []*Rec{{Collection: lexicon.Accept, Parent: StrongRef{URI: URI("did:plc:acme", lexicon.Bid, "b")}}}, &index{})
	if w := woken(); len(w) != 1 || !w["bidder/acme"] {
		t.Errorf("an accept woke %v", w)
	}
	f.route("https://pds", []*Rec{{Collection: lexicon.Lease, Parent: StrongRef{URI: URI("did:plc:shop", lexicon.Accept, "a")}}}, &index{})
	if w := woken(); len(w) != 3 || !w["requester/shop"] || !w["bidder/other"] {
		t.Errorf("a lease woke %v (its requester, and every bidder: a lease of another bid ends a bid)", w)
	}
	if got := f.Followers(RoleRequester, "did:plc:shop"); len(got) != 1 {
		t.Errorf("the DID index: %v", got)
	}
}

// TestKeepOnlyWhatFollowersDealWith: the feeds keep associations of
// followed operators only; requests of vouched requesters (by an
// operator's association, a follower's approval, or a follower itself);
// of a stranger, only bids on a request of a requester follower (held
// yet or not: a listing may read the bid first), not on a bidder
// follower's or anyone else's; nothing over 8 KiB.
func TestKeepOnlyWhatFollowersDealWith(t *testing.T) {
	f, err := NewFeeds(nil, FeedsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	op, shop, acme, stranger, friend := "did:plc:op", "did:plc:shop", "did:plc:acme", "did:plc:stranger", "did:plc:friend"
	for _, fl := range []Follower{{Role: RoleRequester, DID: shop, Operator: op}, {Role: RoleBidder, DID: acme, Operator: op, Vouches: []string{friend}}} {
		fl.Request = mcreconcile.Request{Request: reconcile.Request{NamespacedName: types.NamespacedName{Name: fl.DID}}}
		f.followers[fl.Request] = &following{Follower: fl}
	}
	f.rebuildInterest()
	fd := f.newFeed("https://pds")
	assoc, err := NewRec(URI(op, lexicon.Association, "did:plc:vouched"), "c", "", []byte(`{"subject":"did:plc:vouched","roles":["requester"]}`), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	fd.idx.Store(&index{recs: map[string]*Rec{assoc.URI: assoc}, vouchers: map[string][]*Rec{"did:plc:vouched": {assoc}}})
	f.feeds[fd.source] = fd
	for req := range f.followers {
		fd.users[req] = true
	}
	f.rebuildInterest()
	f.rebuildVouchers()
	req := []byte(`{"shape":{"cpuMillis":1,"memoryMiB":1}}`)
	bidOn := func(requester, rkey string) []byte {
		return []byte(`{"request":{"uri":"` + URI(requester, lexicon.Request, rkey) + `","cid":"c"}}`)
	}
	for i, c := range []struct {
		did, col, rkey string
		value          []byte
		want           bool
	}{
		{op, lexicon.Association, "a", []byte(`{}`), true},
		{stranger, lexicon.Association, "a", []byte(`{}`), false},
		{"did:plc:vouched", lexicon.Request, "r", req, true},
		{friend, lexicon.Request, "r", req, true},
		{shop, lexicon.Request, "held", req, true},
		{stranger, lexicon.Request, "r", req, false},
		{stranger, lexicon.Accept, "a", []byte(`{}`), false},
		{stranger, lexicon.Bid, "b1", bidOn(shop, "held"), true},
		{stranger, lexicon.Bid, "b2", bidOn(shop, "not-listed-yet"), true},
		{stranger, lexicon.Bid, "b3", bidOn(acme, "r"), false},
		{stranger, lexicon.Bid, "b4", bidOn("did:plc:elsewhere", "r"), false},
		{shop, lexicon.Request, "big", make([]byte, maxFeedRecord+1), false},
	} {
		if got := f.keep(fd, URI(c.did, c.col, c.rkey), c.did, c.col, c.value); got != c.want {
			t.Errorf("%d: keep(%s, %s) = %v, want %v", i, c.did, c.col, got, c.want)
		}
	}
}

// TestVouchedAcrossSources (found by e2e TestMarketAcrossInstallations):
// an operator's association that one source's feed holds (the
// operator's PDS) vouches for a requester whose records come from
// another source of the network (its own PDS): its requests are kept
// from there too, but not from a source only another operator's network
// follows (from the review).
// Before, a feed looked for associations among its own records only, so
// a bidder never saw the requests of a requester vouched for on another
// PDS unless its own workspace approved it.
func TestVouchedAcrossSources(t *testing.T) {
	f, err := NewFeeds(nil, FeedsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	op, acme, shop := "did:plc:op", "did:plc:acme", "did:plc:shop"
	fl := Follower{Role: RoleBidder, DID: acme, Operator: op, Request: mcreconcile.Request{Request: reconcile.Request{NamespacedName: types.NamespacedName{Name: acme}}}}
	f.followers[fl.Request] = &following{Follower: fl}
	// Another network (its own operator) follows a third source.
	other := Follower{Role: RoleBidder, DID: "did:plc:beta", Operator: "did:plc:otherop", Request: mcreconcile.Request{Request: reconcile.Request{NamespacedName: types.NamespacedName{Name: "beta"}}}}
	f.followers[other.Request] = &following{Follower: other}
	f.rebuildInterest()
	opFeed, shopFeed := f.newFeed("https://pds1.example"), f.newFeed("https://pds2.example")
	assoc, err := NewRec(URI(op, lexicon.Association, shop), "c", "", []byte(`{"subject":"`+shop+`","roles":["requester"]}`), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	opFeed.idx.Store(&index{recs: map[string]*Rec{assoc.URI: assoc}, vouchers: map[string][]*Rec{shop: {assoc}}})
	otherFeed := f.newFeed("https://pds3.example")
	f.feeds[opFeed.source], f.feeds[shopFeed.source], f.feeds[otherFeed.source] = opFeed, shopFeed, otherFeed
	opFeed.users[fl.Request], shopFeed.users[fl.Request], otherFeed.users[other.Request] = true, true, true
	f.rebuildInterest()
	f.rebuildVouchers()
	req := []byte(`{"shape":{"cpuMillis":1,"memoryMiB":1}}`)
	if !f.keep(shopFeed, URI(shop, lexicon.Request, "r"), shop, lexicon.Request, req) {
		t.Error("a request from the requester's own PDS, vouched for by an association on the operator's, was not kept")
	}
	if f.keep(otherFeed, URI(shop, lexicon.Request, "r"), shop, lexicon.Request, req) {
		t.Error("the association vouched on a source that only another operator's network follows")
	}
	if f.keep(shopFeed, URI(shop, lexicon.Lease, "l"), shop, lexicon.Lease, []byte(`{}`)) {
		t.Error("a lease of a DID vouched for as a requester only was kept")
	}
	// The operator's feed goes: its associations vouch no more.
	f.release(fl.Request, []string{opFeed.source}, nil)
	if f.keep(shopFeed, URI(shop, lexicon.Request, "r2"), shop, lexicon.Request, req) {
		t.Error("a request kept after the feed that held its association went")
	}
}

// TestQuotasRefuseInsteadOfPushingOut: a member's records past its
// author quota, or past its sponsor's, are refused (a new version of one
// kept still is); strangers have their own pool and quota, and filling
// them refuses no member's record; a dropped record frees its place; and
// while a member is over quota, a listing of it does not tell that a
// record is gone from its repo.
func TestQuotasRefuseInsteadOfPushingOut(t *testing.T) {
	var refused []string
	l := newLedger(quotas{Records: 5, PerAuthor: 3, Strangers: 4, PerStranger: 2}, func(r string) { refused = append(refused, r) })
	op := []string{"did:plc:op"} // every member's sponsor
	u := func(did string, i int) string { return URI(did, lexicon.Bid, fmt.Sprint(i)) }
	for i := range 3 {
		if !l.admit(u("did:plc:a", i), "did:plc:a", op) {
			t.Fatalf("a's record %d refused", i)
		}
	}
	if l.admit(u("did:plc:a", 3), "did:plc:a", op) || !l.admit(u("did:plc:a", 0), "did:plc:a", op) {
		t.Error("a's fourth record was kept, or a new version of its first refused")
	}
	for i := range 10 {
		l.admit(u("did:plc:s1", i), "did:plc:s1", nil)
		l.admit(u("did:plc:s2", i), "did:plc:s2", nil)
		l.admit(u("did:plc:s3", i), "did:plc:s3", nil)
	}
	if m, s := l.counts(); m != 3 || s != 4 {
		t.Errorf("kept %d members', %d strangers' records; want 3 and 4", m, s)
	}
	for i := range 2 {
		if !l.admit(u("did:plc:b", i), "did:plc:b", op) {
			t.Errorf("b's record %d refused while strangers filled their pool", i)
		}
	}
	if l.admit(u("did:plc:c", 0), "did:plc:c", op) {
		t.Error("a record past the source's quota was kept")
	}
	if !slices.Contains(refused, refusedAuthor) || !slices.Contains(refused, refusedStrangers) || !slices.Contains(refused, refusedSponsor) {
		t.Errorf("refusals %v, want each reason", refused)
	}
	t0 := time.Now()
	if !l.hides("did:plc:a", t0) || l.hides("did:plc:b", t0) {
		t.Error("a listing of a member over quota counts, or one of a member under it does not")
	}
	mark := l.mark()
	held := func(uri string) bool { return uri != u("did:plc:a", 1) && uri != u("did:plc:a", 2) }
	under := l.reconcile(held, mark)
	if _, ok := under["did:plc:a"]; !ok || !l.admit(u("did:plc:c", 0), "did:plc:c", op) {
		t.Fatalf("dropped records did not free their places (under quota again: %v)", under)
	}
	l.settle("did:plc:a", under["did:plc:a"], t0)
	if !l.hides("did:plc:a", t0) || l.hides("did:plc:a", t0.Add(time.Second)) {
		t.Error("a listing that ended before a's records could be kept again counts, or a later one does not")
	}
}

// TestKeys: record keys are stable, derived from owner and parent, and
// request keys parse back.
func TestKeys(t *testing.T) {
	owner := Owner("uid-1")
	first, again := BidKey(owner, "at://a/b/c"), BidKey(Owner("uid-1"), "at://a/b/c")
	if first != again || first == BidKey(Owner("uid-2"), "at://a/b/c") || first == BidKey(owner, "at://a/b/d") {
		t.Error("bid keys are not derived from owner and request")
	}
	for _, k := range []string{BidKey(owner, "x"), AcceptKey(owner, "x"), LeaseKey(owner, "x"), ReleaseKey(owner, "x")} {
		if !Owns(owner, k) || Owns(Owner("uid-2"), k) || len(k) != 33 {
			t.Errorf("key %s", k)
		}
	}
	at := time.UnixMilli(1780000000123)
	k := RequestKey(owner, 3, at)
	if i, stamp, ok := ParseRequestKey(owner, k); !ok || i != 3 || stamp != at.UnixMilli() {
		t.Errorf("ParseRequestKey(%s) = %d %d %v", k, i, stamp, ok)
	}
	if RequestKey(owner, 3, at) == RequestKey(owner, 3, at.Add(time.Millisecond)) {
		t.Error("two requests of a replica share a key")
	}
	for _, bad := range []string{"r" + owner + "-3", "r" + owner + "-03-1", "r" + owner + "--1-1", "r" + owner + "-1-0", "r" + owner + "-1-A", "x"} {
		if _, _, ok := ParseRequestKey(owner, bad); ok {
			t.Errorf("ParseRequestKey(%s) accepted", bad)
		}
	}
	if n := ChildName("a-very-long-name-of-a-requester-in-a-namespace-xyz", "k"); len(n) > 63 {
		t.Errorf("ChildName too long: %s", n)
	}
}
