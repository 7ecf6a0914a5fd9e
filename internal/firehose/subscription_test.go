package firehose

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/identity"
)

// TestCheckRefusesRecords: records Filter.Check refuses are not kept (an
// earlier valid version is dropped), from commits and listings alike, and
// are counted in State.Invalid.
func TestCheckRefusesRecords(t *testing.T) {
	valid := func(_ string, v json.RawMessage) error {
		var m map[string]any
		if json.Unmarshal(v, &m) != nil || m["text"] == nil {
			return errors.New("no text")
		}
		return nil
	}
	sub := testSub(testStream(t, identity.NewMockDirectory()), Filter{Collections: []string{testCollection}, Check: valid})
	did := "did:plc:alice"
	uri := "at://" + did + "/" + testCollection + "/a"
	sub.apply(&commitUpdate{seq: 2, did: did, rev: "2222222222222", ops: []opUpdate{{action: "create", collection: testCollection, rkey: "a", cid: "c1", value: json.RawMessage(`{"text":"hi"}`)}}})
	if st, _, _ := sub.Snapshot(); len(st.Records) != 1 || st.Invalid != 0 {
		t.Fatalf("after a valid record: %d records, %d invalid", len(st.Records), st.Invalid)
	}
	sub.apply(&commitUpdate{seq: 3, did: did, rev: "3333333333333", ops: []opUpdate{{action: "update", collection: testCollection, rkey: "a", cid: "c2", value: json.RawMessage(`{"nope":1}`)}}})
	if st, _, _ := sub.Snapshot(); len(st.Records) != 0 || st.Invalid != 1 {
		t.Fatalf("after an invalid update: records %v, %d invalid", st.Records, st.Invalid)
	}
	if !sub.replaceRepo(did, &listing{rev: "4444444444444", records: []Record{
		{URI: uri, CID: "c3", Value: json.RawMessage(`{"text":"back"}`)},
		{URI: "at://" + did + "/" + testCollection + "/b", CID: "c4", Value: json.RawMessage(`[]`)},
	}}) {
		t.Fatal("listing refused")
	}
	st, _, _ := sub.Snapshot()
	if len(st.Records) != 1 || st.Records[uri].CID != "c3" || st.Invalid != 2 {
		t.Fatalf("after a listing: records %v, %d invalid", st.Records, st.Invalid)
	}
}

// TestChangedAndRefresh: Changed wakes a reader after every change
// (coalesced); Refresh owes a listing of one repo, which makes the
// subscription Resyncing but not Full.
func TestChangedAndRefresh(t *testing.T) {
	sub := testSub(testStream(t, identity.NewMockDirectory()), Filter{Collections: []string{testCollection}})
	drain := func() bool {
		select {
		case <-sub.Changed():
			return true
		default:
			return false
		}
	}
	drain()
	if drain() {
		t.Fatal("Changed fired without a change")
	}
	for i := range 3 {
		sub.apply(&commitUpdate{seq: int64(10 + i), did: "did:plc:alice", rev: "222222222222" + string(rune('a'+i)), ops: []opUpdate{{action: "create", collection: testCollection, rkey: "a", cid: "c" + string(rune('a'+i)), value: json.RawMessage(`{}`)}}})
	}
	if !drain() || drain() {
		t.Fatal("three changes should wake a reader once")
	}
	sub.resynced("", ResyncInitial)
	drain()
	sub.Refresh("did:plc:alice")
	if !drain() {
		t.Fatal("Refresh did not wake the reader")
	}
	if h := sub.Health(); !h.Resyncing || h.Full {
		t.Fatalf("after Refresh: %+v", h)
	}
	sub.resynced("did:plc:alice", ResyncRefresh)
	if h := sub.Health(); h.Resyncing || h.Full {
		t.Fatalf("after the listing: %+v", h)
	}
}

// TestEvictionTakesTheOldestChange: past max, the record changed longest
// ago goes first: loaded records in their order, an update makes a record
// new again, a deleted one is not counted, and replacing a repo's records
// leaves other repos' alone.
func TestEvictionTakesTheOldestChange(t *testing.T) {
	const alice, bob = "did:plc:alice", "did:plc:bob"
	uri := func(did, rkey string) string { return "at://" + did + "/" + testCollection + "/" + rkey }
	loaded := LoadRecords([]Record{{URI: uri(alice, "c"), CID: "c"}, {URI: uri(alice, "b"), CID: "b"}, {URI: uri(alice, "a"), CID: "a"}})
	sub := newSubscription(Filter{Collections: []string{testCollection}}, 3, State{Records: loaded})
	sub.stream = testStream(t, identity.NewMockDirectory())
	seq := int64(0)
	write := func(did, action, rkey string) {
		seq++
		sub.apply(&commitUpdate{seq: seq, did: did, rev: fmt.Sprintf("3%012d", seq), ops: []opUpdate{{action: action, collection: testCollection, rkey: rkey, cid: rkey, value: json.RawMessage(`{}`)}}})
	}
	kept := func(want ...string) {
		t.Helper()
		st, _, _ := sub.Snapshot()
		var got []string
		for _, r := range st.RecordsNewestFirst() {
			got = append(got, strings.TrimPrefix(r.URI, "at://"))
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("kept %v, want %v", got, want)
		}
	}
	write(alice, "create", "d") // a is the oldest
	kept(alice+"/"+testCollection+"/d", alice+"/"+testCollection+"/c", alice+"/"+testCollection+"/b")
	write(alice, "update", "b") // now c is
	write(bob, "create", "e")
	kept(bob+"/"+testCollection+"/e", alice+"/"+testCollection+"/b", alice+"/"+testCollection+"/d")
	write(alice, "delete", "d") // 2 kept: nothing to evict
	write(bob, "create", "f")
	kept(bob+"/"+testCollection+"/f", bob+"/"+testCollection+"/e", alice+"/"+testCollection+"/b")
	if !sub.replaceRepo(alice, &listing{rev: "4000000000000", records: []Record{{URI: uri(alice, "g"), CID: "g"}}}) {
		t.Fatal("listing refused")
	}
	kept(alice+"/"+testCollection+"/g", bob+"/"+testCollection+"/f", bob+"/"+testCollection+"/e")
	if st, _, _ := sub.Snapshot(); st.Evicted != 2 {
		t.Fatalf("evicted %d, want 2 (a, c)", st.Evicted)
	}
	// Updating one record over and over does not grow what eviction keeps.
	for range 1000 {
		write(bob, "update", "e")
	}
	if n := len(sub.ages); n > 2*3+64+1 {
		t.Fatalf("%d places kept for 3 records", n)
	}
}

// BenchmarkEvict: one commit that creates a record, and so evicts one,
// in a subscription full at max records. ns/op must not grow with max
// (before the eviction queue each eviction scanned every record: 1e5
// cost ten times 1e4).
func BenchmarkEvict(b *testing.B) {
	for _, n := range []int{1e4, 1e5} {
		b.Run(fmt.Sprintf("max=%d", n), func(b *testing.B) {
			sub := newSubscription(Filter{Collections: []string{testCollection}}, n, State{})
			seq := int64(0)
			create := func() {
				seq++
				sub.apply(&commitUpdate{seq: seq, did: "did:plc:alice", rev: fmt.Sprintf("3%012d", seq), ops: []opUpdate{{action: "create", collection: testCollection, rkey: strconv.FormatInt(seq, 10), cid: "c", value: json.RawMessage(`{}`)}}})
			}
			for range n {
				create()
			}
			b.ResetTimer()
			for range b.N {
				create()
			}
			if sub.state.Evicted != int64(b.N) {
				b.Fatalf("evicted %d, want %d", sub.state.Evicted, b.N)
			}
		})
	}
}

// TestUnlistedRepoHoldsOnlyASubscriptionNamingIt: a repo a full listing
// left unlisted (its own PDS failed) keeps a subscription that names it
// Resyncing, not one of every repo; a later listing of it clears it.
func TestUnlistedRepoHoldsOnlyASubscriptionNamingIt(t *testing.T) {
	const did = "did:plc:moved"
	resyncing := func(sub *Subscription) bool {
		sub.mu.Lock()
		defer sub.mu.Unlock()
		return sub.resyncing()
	}
	for _, dids := range [][]string{nil, {did}} {
		sub := newSubscription(Filter{Collections: []string{testCollection}, DIDs: dids}, 10, State{Cursor: 1})
		sub.unlistRepo(did, ResyncInitial, errors.New("its PDS failed"))
		if got := resyncing(sub); got != (dids != nil) {
			t.Errorf("dids %v: resyncing %v after the repo was left unlisted", dids, got)
		}
		if sub.state.Errors != 1 {
			t.Errorf("dids %v: errors %d, want 1", dids, sub.state.Errors)
		}
		sub.relisted(did)
		if resyncing(sub) || len(sub.unlisted) > 0 {
			t.Errorf("dids %v: still owed after a listing of the repo (resyncing %v, unlisted %v, pending %v, full %v)", dids, resyncing(sub), sub.unlisted, sub.pending, sub.full)
		}
	}
}
