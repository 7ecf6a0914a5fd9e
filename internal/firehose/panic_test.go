package firehose

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/identity"
)

// boomCheck is noteCheck, except that a note whose text is "boom" panics
// it: a stand-in for a validator, or a decoder of indigo's, that a
// hostile record makes panic.
func boomCheck(col string, v json.RawMessage) error {
	if strings.Contains(string(v), `"boom"`) {
		panic("boom: a record panicked its check")
	}
	return noteCheck(col, v)
}

// hostileAndCalm starts two sources on loopback, alice's (hostile, with
// one note of text first) and bob's (one note), and a hub with a
// subscription to each whose Check panics on a "boom" note.
func hostileAndCalm(t *testing.T, first string) (hostile *fakeSource, calm *fakeSource, subA, subB *Subscription) {
	t.Helper()
	alice, bob := newTestRepo(t, "did:plc:alice"), newTestRepo(t, "did:plc:bob")
	dir := identity.NewMockDirectory()
	hostile, calm = newFakeSource(t, alice), newFakeSource(t, bob)
	dir.Insert(alice.identityAt(hostile.srv.URL))
	dir.Insert(bob.identityAt(calm.srv.URL))
	hostile.write(testOp{"create", testCollection + "/" + first, note(first)})
	calm.write(testOp{"create", testCollection + "/b", note("b")})
	hub, _ := startHub(t, Options{Directory: dir})
	for _, s := range []struct {
		src *fakeSource
		sub **Subscription
	}{{hostile, &subA}, {calm, &subB}} {
		sub, err := hub.Subscribe(s.src.srv.URL, Filter{Collections: []string{testCollection}, Check: boomCheck}, 100, State{})
		if err != nil {
			t.Fatal(err)
		}
		*s.sub = sub
	}
	return hostile, calm, subA, subB
}

func (f *fakeSource) connections() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}

// TestPanickingEventIsRejected (R21, from review): an event whose
// handling panics (here a record that panics the subscription's check;
// in the field indigo's decoders and verifiers, which dereference what a
// hostile source leaves out) must not crash the provider every workspace
// shares, nor stall its source: through the real read loop over a
// websocket, the event is rejected (counted, nothing of that commit
// applied, not even its op before the panicking one) and the source goes
// on over the same connection with its next event; another source of
// the same hub is not touched. (Closing the connection instead left the
// cursor before the event: every reconnection got it again, for good.)
func TestPanickingEventIsRejected(t *testing.T) {
	hostile, calm, subA, subB := hostileAndCalm(t, "a")
	for _, sub := range []*Subscription{subA, subB} {
		waitState(t, sub, "the first record", func(st State, h Health) bool { return h.Connected && !h.Resyncing && len(st.Records) == 1 })
	}
	conns := hostile.connections()
	errs := func() int64 { st, _, _ := subA.Snapshot(); return st.Errors }
	before := errs()
	// One commit: a note the check accepts, then one that panics it.
	hostile.write(testOp{"create", testCollection + "/aa", note("aa")}, testOp{"create", testCollection + "/boom", note("boom")})
	waitState(t, subA, "the event rejected", func(st State, _ Health) bool { return st.Errors > before })
	hostile.write(testOp{"create", testCollection + "/d", note("d")})
	waitState(t, subA, "the hostile source's next record", func(st State, h Health) bool { return h.Connected && len(st.Records) == 2 })
	calm.write(testOp{"create", testCollection + "/c", note("c")})
	waitState(t, subB, "the calm source's next record", func(st State, h Health) bool { return h.Connected && len(st.Records) == 2 })

	st, h, _ := subA.Snapshot()
	for _, k := range []string{"aa", "boom"} {
		if _, ok := st.Records["at://did:plc:alice/"+testCollection+"/"+k]; ok {
			t.Errorf("record %s of the commit whose handling panicked is kept: the commit was applied", k)
		}
	}
	if _, ok := st.Records["at://did:plc:alice/"+testCollection+"/d"]; !ok {
		t.Error("the source's event after the panicking one was not applied")
	}
	if n := hostile.connections(); n != conns {
		t.Errorf("%d connections to the source, want %d: the panic closed it", n, conns)
	}
	if h.Err != nil {
		t.Errorf("health error %v after a rejected event", h.Err)
	}
}

// TestPanickingCheckRejectsForItsSubscriptionOnly (from review): two
// subscriptions follow one source; a commit whose record panics the check
// of one is rejected for that one only, and the other applies it.
func TestPanickingCheckRejectsForItsSubscriptionOnly(t *testing.T) {
	alice := newTestRepo(t, "did:plc:alice")
	dir := identity.NewMockDirectory()
	src := newFakeSource(t, alice)
	dir.Insert(alice.identityAt(src.srv.URL))
	src.write(testOp{"create", testCollection + "/a", note("a")})
	hub, _ := startHub(t, Options{Directory: dir})
	var subs []*Subscription
	for _, check := range []func(string, json.RawMessage) error{boomCheck, noteCheck} {
		sub, err := hub.Subscribe(src.srv.URL, Filter{Collections: []string{testCollection}, Check: check}, 100, State{})
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, sub)
	}
	for _, sub := range subs {
		waitState(t, sub, "the first record", func(st State, h Health) bool { return h.Connected && !h.Resyncing && len(st.Records) == 1 })
	}
	src.write(testOp{"create", testCollection + "/boom", note("boom")})
	waitState(t, subs[1], "the commit, by the subscription whose check takes it", func(st State, _ Health) bool { return len(st.Records) == 2 })
	waitState(t, subs[0], "the commit rejected by the subscription whose check panics", func(st State, _ Health) bool { return st.Errors > 0 })
	if st, _, _ := subs[0].Snapshot(); len(st.Records) != 1 {
		t.Errorf("the panicking subscription holds %d records, want 1", len(st.Records))
	}
	if st, _, _ := subs[1].Snapshot(); st.Errors != 0 {
		t.Errorf("the other subscription counted %d errors", st.Errors)
	}
}

// TestPanickingListedRecordLeavesTheRepoUnlisted (R21, from review): a
// record that panics its check while a listing reads it (a listing runs
// on its own goroutine, not the read loop's) leaves that repo unlisted
// (counted, none of its records kept, listed again later) while the full
// listing completes; the provider goes on, and so does another source.
// (It failed the whole listing before, retried forever.)
func TestPanickingListedRecordLeavesTheRepoUnlisted(t *testing.T) {
	_, _, subA, subB := hostileAndCalm(t, "boom")
	st := waitState(t, subA, "the listing complete, alice's repo left out", func(st State, h Health) bool {
		return h.Connected && !h.Full && st.Errors > 0
	})
	if len(st.Records) != 0 {
		t.Errorf("records %v kept from a listing that panicked", keys(st.Records))
	}
	waitState(t, subB, "the calm source's record", func(st State, h Health) bool { return h.Connected && !h.Resyncing && len(st.Records) == 1 })
}
