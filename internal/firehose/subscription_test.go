package firehose

import (
	"encoding/json"
	"errors"
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
