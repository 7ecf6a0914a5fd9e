package firehose

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/events"
	"github.com/go-logr/logr/testr"
	"github.com/gorilla/websocket"

	"github.com/knotless-dev/knotless/internal/backoff"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// fakeSource is a PDS for one repo: a subscribeRepos websocket that
// replays commits after the client's cursor and then streams new ones,
// plus the XRPC reads a resync uses.
type fakeSource struct {
	t    *testing.T
	repo *testRepo
	srv  *httptest.Server

	mu      sync.Mutex
	frames  []*comatproto.SyncSubscribeRepos_Commit
	values  map[string]json.RawMessage // path -> value
	rev     string
	changed chan struct{}
	conns   []*websocket.Conn
	cursors []string
}

func newFakeSource(t *testing.T, r *testRepo) *fakeSource {
	return newWrappedFakeSource(t, r, func(h http.Handler) http.Handler { return h })
}

// newWrappedFakeSource is newFakeSource serving through wrap.
func newWrappedFakeSource(t *testing.T, r *testRepo, wrap func(http.Handler) http.Handler) *fakeSource {
	f := &fakeSource{t: t, repo: r, values: map[string]json.RawMessage{}, changed: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/xrpc/com.atproto.sync.subscribeRepos", f.subscribe)
	mux.HandleFunc("/xrpc/com.atproto.sync.getLatestCommit", func(w http.ResponseWriter, req *http.Request) {
		if did := req.URL.Query().Get("did"); did != r.did {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "RepoNotFound", "message": "Could not find repo for DID: " + did})
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]string{"cid": "bafy", "rev": f.rev})
	})
	mux.HandleFunc("/xrpc/com.atproto.sync.listRepos", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"repos": []map[string]any{{"did": r.did, "head": "bafy", "rev": "x"}}})
	})
	mux.HandleFunc("/xrpc/com.atproto.repo.listRecords", func(w http.ResponseWriter, req *http.Request) {
		col := req.URL.Query().Get("collection")
		f.mu.Lock()
		defer f.mu.Unlock()
		var recs []map[string]any
		for path, v := range f.values {
			if strings.HasPrefix(path, col+"/") {
				recs = append(recs, map[string]any{"uri": "at://" + r.did + "/" + path, "cid": "listed", "value": v})
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"records": recs})
	})
	f.srv = httptest.NewServer(wrap(mux))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeSource) write(ops ...testOp) {
	msg := f.repo.commit(ops...)
	f.mu.Lock()
	defer f.mu.Unlock()
	msg.Seq = int64(len(f.frames) + 1)
	f.frames = append(f.frames, msg)
	f.rev = msg.Rev
	for _, op := range ops {
		if op.action == "delete" {
			delete(f.values, op.path)
			continue
		}
		raw, _ := atdata.MarshalCBOR(op.value)
		v, _ := atdata.UnmarshalCBOR(raw)
		f.values[op.path], _ = json.Marshal(v)
	}
	close(f.changed)
	f.changed = make(chan struct{})
}

// dropConnections closes every open websocket (the source restarted).
func (f *fakeSource) dropConnections() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.conns = nil
}

func (f *fakeSource) subscribe(w http.ResponseWriter, req *http.Request) {
	// Live starts before the handshake completes: a commit written once
	// the client is connected is sent.
	f.mu.Lock()
	head := int64(len(f.frames))
	f.mu.Unlock()
	up := websocket.Upgrader{}
	con, err := up.Upgrade(w, req, nil)
	if err != nil {
		return
	}
	defer con.Close()
	cursorParam := req.URL.Query().Get("cursor")
	cursor, _ := strconv.ParseInt(cursorParam, 10, 64)
	f.mu.Lock()
	f.conns = append(f.conns, con)
	f.cursors = append(f.cursors, cursorParam)
	f.mu.Unlock()
	send := func(ev *events.XRPCStreamEvent) error {
		wc, err := con.NextWriter(websocket.BinaryMessage)
		if err != nil {
			return err
		}
		if err := ev.Serialize(wc); err != nil {
			return err
		}
		return wc.Close()
	}
	if cursor > head {
		_ = send(&events.XRPCStreamEvent{Error: &events.ErrorFrame{Error: "FutureCursor", Message: "cursor in the future"}})
		return
	}
	next := cursor
	if cursorParam == "" {
		next = head // live
	}
	go func() { // read (and drop) client frames so pings are answered
		for {
			if _, _, err := con.NextReader(); err != nil {
				return
			}
		}
	}()
	for {
		f.mu.Lock()
		pending := f.frames[next:]
		changed := f.changed
		f.mu.Unlock()
		for _, msg := range pending {
			if err := send(&events.XRPCStreamEvent{RepoCommit: msg}); err != nil {
				return
			}
			next = msg.Seq
		}
		select {
		case <-changed:
		case <-req.Context().Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}

func (f *fakeSource) seenCursors() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.cursors...)
}

// startHub runs a hub with opts, whose Directory is required; by default
// it has fresh metrics, short delays and a policy that allows loopback
// addresses (the fake sources').
func startHub(t *testing.T, opts Options) (*Hub, *Metrics) {
	t.Helper()
	if opts.Metrics == nil {
		m, err := NewMetrics(nil)
		if err != nil {
			t.Fatal(err)
		}
		opts.Metrics = m
	}
	if opts.Policy == nil {
		opts.Policy = netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil)
	}
	opts.Log = testr.NewWithOptions(t, testr.Options{Verbosity: 1})
	opts.Gather = 10 * time.Millisecond
	opts.Backoff = backoff.Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}
	h, err := NewHub(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = h.Start(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return h, opts.Metrics
}

func waitState(t *testing.T, sub *Subscription, what string, ok func(State, Health) bool) State {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, h, _ := sub.Snapshot()
		if ok(st, h) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: cursor %d records %d resync %+v health %+v", what, st.Cursor, len(st.Records), st.LastResync, h)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sourceAndHub starts a fake source for alice's repo holding one record
// (rkey first) and a running hub whose directory knows alice.
func sourceAndHub(t *testing.T, first string) (*testRepo, *fakeSource, *Hub, *Metrics) {
	t.Helper()
	r := newTestRepo(t, "did:plc:alice")
	dir := identity.NewMockDirectory()
	src := newFakeSource(t, r)
	dir.Insert(r.identityAt(src.srv.URL))
	src.write(testOp{"create", testCollection + "/" + first, note(first)})
	h, m := startHub(t, Options{Directory: dir})
	return r, src, h, m
}

func TestStreamListsFollowsAndResumesFromItsCursor(t *testing.T) {
	r, src, h, m := sourceAndHub(t, "old")

	sub, err := h.Subscribe(src.srv.URL, Filter{Collections: []string{testCollection}}, 100, State{})
	if err != nil {
		t.Fatal(err)
	}
	st := waitState(t, sub, "the initial listing", func(st State, h Health) bool {
		return h.Connected && !h.Resyncing && len(st.Records) == 1
	})
	if st.LastResync == nil || st.LastResync.Reason != ResyncInitial {
		t.Fatalf("last resync %+v, want Initial", st.LastResync)
	}
	src.write(testOp{"create", testCollection + "/a", note("a")})
	src.write(testOp{"update", testCollection + "/a", note("a2")})
	waitState(t, sub, "two events", func(st State, _ Health) bool { return st.Cursor == 3 && st.Matched == 2 })

	// The source restarts; writes happen before we reconnect.
	src.dropConnections()
	src.write(testOp{"create", testCollection + "/b", note("b")})
	src.write(testOp{"delete", testCollection + "/old", nil})
	st = waitState(t, sub, "the events written while disconnected", func(st State, _ Health) bool { return st.Cursor == 5 })
	if len(st.Records) != 2 || st.Matched != 4 {
		t.Fatalf("records %v matched %d; want a and b, 4", st.Records, st.Matched)
	}
	cursors := src.seenCursors()
	if len(cursors) < 2 || cursors[0] != "" || cursors[len(cursors)-1] != "3" {
		t.Fatalf("cursors sent %q; want live first, then 3", cursors)
	}
	if got := counterValue(t, m.Reconnects.WithLabelValues(otherSource, "error")); got < 1 {
		t.Fatalf("reconnects %v", got)
	}

	// A second subscription resuming from an older cursor rewinds the
	// shared connection; the first one applies nothing twice.
	before, _, _ := sub.Snapshot()
	old := State{Cursor: 1, Records: LoadRecords([]Record{{URI: "at://did:plc:alice/" + testCollection + "/old", CID: "x"}}), Repos: map[string]Repo{r.did: {Rev: src.frames[0].Rev}}}
	sub2, err := h.Subscribe(src.srv.URL, Filter{Collections: []string{testCollection}}, 100, old)
	if err != nil {
		t.Fatal(err)
	}
	st2 := waitState(t, sub2, "the replay", func(st State, _ Health) bool { return st.Cursor == 5 })
	if len(st2.Records) != 2 || st2.Matched != 4 {
		t.Fatalf("resumed subscription: records %v matched %d; want a and b, 4", st2.Records, st2.Matched)
	}
	after, _, _ := sub.Snapshot()
	if after.Matched != before.Matched || after.Seen != before.Seen {
		t.Fatalf("the rewind re-applied events to the first subscription: matched %d -> %d", before.Matched, after.Matched)
	}
	h.Unsubscribe(sub)
	h.Unsubscribe(sub2)
	if got := len(h.streams); got != 0 {
		t.Fatalf("%d streams left without subscriptions", got)
	}
}

func TestFutureCursorListsAgain(t *testing.T) {
	_, src, h, _ := sourceAndHub(t, "a")
	// A cursor the source never reached (it lost its data, or is another
	// instance): the source answers FutureCursor.
	stale := State{Cursor: 1000, Records: LoadRecords([]Record{{URI: "at://did:plc:alice/" + testCollection + "/gone", CID: "x"}})}
	sub, err := h.Subscribe(src.srv.URL, Filter{Collections: []string{testCollection}}, 100, stale)
	if err != nil {
		t.Fatal(err)
	}
	st := waitState(t, sub, "a listing after FutureCursor", func(st State, h Health) bool {
		return st.LastResync != nil && !h.Resyncing && h.Connected
	})
	if st.LastResync.Reason != ResyncFutureCursor {
		t.Fatalf("resync reason %q, want FutureCursor", st.LastResync.Reason)
	}
	if _, ok := st.Records["at://did:plc:alice/"+testCollection+"/a"]; !ok || len(st.Records) != 1 {
		t.Fatalf("records %v, want only a", st.Records)
	}
	src.write(testOp{"create", testCollection + "/b", note("b")})
	waitState(t, sub, "following live after the listing", func(st State, _ Health) bool { return st.Cursor == 2 && len(st.Records) == 2 })
}

// TestSourceThatDoesNotCarryARepoListsNothing: a subscription on one PDS's
// firehose that names a DID hosted on another PDS keeps none of its
// records (they would never be updated from this stream); the same
// subscription on the DID's own PDS lists them.
func TestSourceThatDoesNotCarryARepoListsNothing(t *testing.T) {
	alice := newTestRepo(t, "did:plc:alice")
	bob := newTestRepo(t, "did:plc:bob")
	srcA, srcB := newFakeSource(t, alice), newFakeSource(t, bob)
	srcB.write(testOp{"create", testCollection + "/b", note("b")})
	dir := identity.NewMockDirectory()
	dir.Insert(alice.identity(nil))
	bobID := bob.identity(nil)
	bobID.Services = map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: srcB.srv.URL}}
	dir.Insert(bobID)
	h, _ := startHub(t, Options{Directory: dir})

	onA, err := h.Subscribe(srcA.srv.URL, Filter{Collections: []string{testCollection}, DIDs: []string{bob.did}}, 100, State{})
	if err != nil {
		t.Fatal(err)
	}
	onB, err := h.Subscribe(srcB.srv.URL, Filter{Collections: []string{testCollection}, DIDs: []string{bob.did}}, 100, State{})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, onB, "bob's records from his PDS", func(st State, h Health) bool { return h.Connected && !h.Resyncing && len(st.Records) == 1 })
	st := waitState(t, onA, "the listing on alice's PDS", func(st State, h Health) bool { return h.Connected && !h.Resyncing && st.LastResync != nil })
	if len(st.Records) != 0 {
		t.Fatalf("alice's PDS does not carry bob's repo, yet the subscription keeps %v", st.Records)
	}
}
