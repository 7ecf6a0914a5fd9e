package market

import (
	"slices"
	"time"

	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/internal/lexicon"
)

// TestVouchedSybilsDoNotFillTheMembersPool (from review): anyone with a
// knotless workspace is a follower, and a follower's MarketIdentity
// vouches for up to 256 DIDs of its choosing (approvedAssociations), each
// then a member with its own per-author quota. Enough vouched sybils fill
// the source's member pool, and another follower's counterparty's lease is
// refused: a stranger flood again, one vouch away.
func TestVouchedSybilsDoNotFillTheMembersPool(t *testing.T) {
	f, err := NewFeeds(nil, FeedsOptions{MaxRecords: 100, MaxRecordsPerAuthor: 10, MaxStrangerRecords: 10, MaxRecordsPerStranger: 2})
	if err != nil {
		t.Fatal(err)
	}
	req := func(name string) mcreconcile.Request {
		return mcreconcile.Request{ClusterName: "ws", Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}}
	}
	var sybils []string
	for i := range 20 {
		sybils = append(sybils, fmt.Sprintf("did:plc:sybil%02d", i))
	}
	f.followers[req("mallory")] = &following{Follower: Follower{Role: RoleRequester, DID: "did:plc:mallory", Request: req("mallory"), Vouches: sybils}}
	f.followers[req("alice")] = &following{Follower: Follower{Role: RoleRequester, DID: "did:plc:alice", Request: req("alice"), Vouches: []string{"did:plc:bob"}}}
	f.rebuildInterest()
	fd := f.newFeed("wss://relay.example")
	for _, s := range sybils {
		for j := range 10 {
			f.keep(fd, URI(s, lexicon.Bid, fmt.Sprintf("b%d", j)), s, lexicon.Bid, []byte(`{}`))
		}
	}
	if !f.keep(fd, URI("did:plc:bob", lexicon.Lease, "l1"), "did:plc:bob", lexicon.Lease, []byte(`{}`)) {
		members, strangers := fd.ledger.counts()
		t.Fatalf("alice's bidder's lease refused: mallory's %d vouched sybils hold the member pool (%d members' records, %d strangers')", len(sybils), members, strangers)
	}
}

// TestOperatorsSybilsStayInTheirOperatorsPool: a follower's network names
// an operator DID of the follower's choosing, whose associations vouch for
// participants; they and a follower's approvals are charged to whoever
// vouches (the operator, the follower), so sybils vouched both ways fill
// only their vouchers' pools. A counterparty that the sybils' follower
// approves too is charged to another voucher with room, and another
// follower's operator's associations and the participants these vouch for
// are kept.
func TestOperatorsSybilsStayInTheirOperatorsPool(t *testing.T) {
	f, err := NewFeeds(nil, FeedsOptions{MaxRecords: 100, MaxRecordsPerAuthor: 10, MaxStrangerRecords: 10, MaxRecordsPerStranger: 2})
	if err != nil {
		t.Fatal(err)
	}
	req := func(name string) mcreconcile.Request {
		return mcreconcile.Request{ClusterName: "ws", Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}}
	}
	evilOp, op := "did:plc:evilop", "did:plc:op"
	var sybils []string
	vouchers := map[string][]*Rec{}
	for i := range 40 {
		s := fmt.Sprintf("did:plc:sybil%02d", i)
		sybils = append(sybils, s)
		a, err := NewRec(URI(evilOp, lexicon.Association, s), "c", "", []byte(`{"subject":"`+s+`","roles":["bidder"]}`), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		vouchers[s] = []*Rec{a}
	}
	carolAssoc, err := NewRec(URI(op, lexicon.Association, "did:plc:carol"), "c", "", []byte(`{"subject":"did:plc:carol","roles":["bidder"]}`), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	vouchers["did:plc:carol"] = []*Rec{carolAssoc}
	f.followers[req("mallory")] = &following{Follower: Follower{Role: RoleRequester, DID: "did:plc:mallory", Request: req("mallory"), Operator: evilOp, Vouches: append(sybils[:20:20], "did:plc:bob")}}
	f.followers[req("alice")] = &following{Follower: Follower{Role: RoleRequester, DID: "did:plc:alice", Request: req("alice"), Operator: op, Vouches: []string{"did:plc:bob"}}}
	f.rebuildInterest()
	fd := f.newFeed("wss://relay.example")
	fd.idx.Store(&index{recs: map[string]*Rec{}, vouchers: vouchers})
	f.feeds[fd.source] = fd
	fd.users[req("mallory")], fd.users[req("alice")] = true, true
	f.rebuildInterest()
	f.rebuildVouchers()
	for _, s := range sybils {
		f.keep(fd, URI(evilOp, lexicon.Association, s), evilOp, lexicon.Association, []byte(`{}`))
		for j := range 10 {
			f.keep(fd, URI(s, lexicon.Bid, fmt.Sprintf("b%d", j)), s, lexicon.Bid, []byte(`{}`))
		}
	}
	for _, c := range []struct{ did, col string }{{op, lexicon.Association}, {"did:plc:carol", lexicon.Lease}, {"did:plc:bob", lexicon.Lease}} {
		if !f.keep(fd, URI(c.did, c.col, "x"), c.did, c.col, []byte(`{}`)) {
			members, _ := fd.ledger.counts()
			t.Errorf("%s's %s refused: sybils vouched by mallory and her operator hold the pool (%d members' records)", c.did, c.col, members)
		}
	}
}

// TestSponsorsThatLeaveFreeTheirPool: a follower that stops vouching (it
// is gone, withdraws an approval, or its network names another operator)
// has the repos it vouched for listed again, and a record listed again is
// charged to who vouches for it now, so churning followers or operators
// leaves no records charged to sponsors that are gone.
func TestSponsorsThatLeaveFreeTheirPool(t *testing.T) {
	prev, next := newInterest(), newInterest()
	prev.participants["did:plc:mallory"] = true
	prev.operators["did:plc:evilop"] = true
	prev.approved[RoleBidder]["did:plc:bob"] = []string{"did:plc:mallory", "did:plc:alice"}
	prev.approved[RoleBidder]["did:plc:carol"] = []string{"did:plc:alice"}
	next.participants["did:plc:alice"] = true
	next.approved[RoleBidder]["did:plc:bob"] = []string{"did:plc:alice"}
	next.approved[RoleBidder]["did:plc:carol"] = []string{"did:plc:alice"}
	dids, ops := forsaken(prev, next)
	slices.Sort(dids)
	if want := []string{"did:plc:bob", "did:plc:evilop", "did:plc:mallory"}; !slices.Equal(dids, want) || !slices.Equal(ops, []string{"did:plc:evilop"}) {
		t.Errorf("forsaken: %v and operators %v, want %v and did:plc:evilop", dids, ops, want)
	}
	f := &Feeds{feeds: map[string]*feed{}}
	fd := f.newFeed("wss://relay.example")
	assoc, err := NewRec(URI("did:plc:evilop", lexicon.Association, "did:plc:sybil"), "c", "", []byte(`{"subject":"did:plc:sybil","roles":["bidder"]}`), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	fd.idx.Store(&index{vouchers: map[string][]*Rec{"did:plc:sybil": {assoc}}})
	f.feeds[fd.source] = fd
	f.rebuildVouchers()
	if got := f.vouchedBy(ops); !slices.Equal(got, []string{"did:plc:sybil"}) {
		t.Errorf("the gone operator's subjects: %v", got)
	}
	l := newLedger(quotas{Records: 1, PerAuthor: 10, Strangers: 1, PerStranger: 1}, nil)
	uri := URI("did:plc:bob", lexicon.Lease, "l")
	if !l.admit(uri, "did:plc:bob", []string{"did:plc:mallory"}) || !l.admit(uri, "did:plc:bob", []string{"did:plc:alice"}) {
		t.Fatal("bob's lease refused")
	}
	if !l.admit(URI("did:plc:sybil", lexicon.Bid, "b"), "did:plc:sybil", []string{"did:plc:mallory"}) {
		t.Error("bob's lease, listed again, is still charged to mallory, who no longer vouches for bob")
	}
}
