package firehose

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/events"
	"github.com/go-logr/logr"
	"github.com/gorilla/websocket"

	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// frameServer is a source on loopback that sends, on every connection,
// the frames its test stores, one websocket binary message each, and
// then closes the connection.
type frameServer struct {
	*httptest.Server
	frames atomic.Pointer[[][]byte]
}

func newFrameServer(tb testing.TB) *frameServer {
	fs := &frameServer{}
	fs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up := websocket.Upgrader{}
		con, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer con.Close()
		if p := fs.frames.Load(); p != nil {
			for _, f := range *p {
				if err := con.WriteMessage(websocket.BinaryMessage, f); err != nil {
					return
				}
			}
		}
		_ = con.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	}))
	tb.Cleanup(fs.Close)
	return fs
}

func (fs *frameServer) send(frames ...[]byte) { fs.frames.Store(&frames) }

// readLoopStream is a stream of the source at url with one subscription
// (fuzzDID's repo, testCollection, at most fuzzMaxRecords records), as
// the hub makes them, without its connect and resync loops.
func readLoopStream(tb testing.TB, url string, id identity.Identity) (*stream, *Subscription) {
	dir := identity.NewMockDirectory()
	dir.Insert(id)
	m, err := NewMetrics(nil)
	if err != nil {
		tb.Fatal(err)
	}
	h, err := NewHub(Options{Directory: dir, Log: logr.Discard(), Metrics: m, Workers: 2,
		Policy: netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil)})
	if err != nil {
		tb.Fatal(err)
	}
	s := newStream(h, url)
	sub := newSubscription(Filter{Collections: []string{testCollection}, Check: noteCheck}, fuzzMaxRecords, State{})
	sub.full, sub.stream = false, s
	s.subs[sub] = struct{}{}
	return s, sub
}

// corpusFrame reads the input of testdata/fuzz/<target>/<name>, a
// corpus file of one []byte.
func corpusFrame(tb testing.TB, target, name string) []byte {
	b, err := os.ReadFile(filepath.Join("testdata", "fuzz", target, name))
	if err != nil {
		tb.Fatal(err)
	}
	_, lit, ok := strings.Cut(strings.TrimSpace(string(b)), "\n[]byte(")
	if !ok || !strings.HasSuffix(lit, ")") {
		tb.Fatalf("%s/%s is not a corpus file of one []byte", target, name)
	}
	s, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
	if err != nil {
		tb.Fatalf("%s/%s: %v", target, name, err)
	}
	return []byte(s)
}

// FuzzReadLoop: one websocket message from a source, through the whole
// read path of a connection (stream.connect over a websocket on loopback:
// indigo's HandleRepoStream decoding the header and the body of every
// frame type, the scheduler, the workers and the handlers). Whatever the
// bytes, the process does not panic: a frame whose decoding or handling
// panics ends the connection with ErrFaultyFrame; and the subscription
// holds at most its bound of records, each of the signed repo.
func FuzzReadLoop(f *testing.F) {
	now := time.Now().UTC().Format(time.RFC3339Nano)
	f.Add(frame(f, &events.XRPCStreamEvent{RepoIdentity: &comatproto.SyncSubscribeRepos_Identity{Did: fuzzDID, Seq: 1, Time: now}}))
	f.Add(frame(f, &events.XRPCStreamEvent{RepoAccount: &comatproto.SyncSubscribeRepos_Account{Did: fuzzDID, Seq: 1, Time: now}}))
	f.Add(frame(f, &events.XRPCStreamEvent{RepoInfo: &comatproto.SyncSubscribeRepos_Info{Name: "OutdatedCursor"}}))
	f.Add(frame(f, &events.XRPCStreamEvent{Error: &events.ErrorFrame{Error: "FutureCursor", Message: "cursor in the future"}}))
	f.Add(frame(f, &events.XRPCStreamEvent{RepoSync: &comatproto.SyncSubscribeRepos_Sync{Did: fuzzDID, Seq: 2, Rev: "3jzfcijpj2z2a", Time: now, Blocks: []byte{0x3a}}}))
	// A header of an unknown type, and one that is not a map.
	f.Add([]byte{0xa2, 0x62, 'o', 'p', 0x01, 0x61, 't', 0x65, '#', 'n', 'o', 'p', 'e', 0xa0})
	f.Add([]byte{0x82, 0x01, 0x02})
	// A #sync carrying the signed CAR of a commit of the corpus, so that
	// mutations reach the CAR reader and the commit's signature check.
	var commit events.XRPCStreamEvent
	if err := commit.Deserialize(bytes.NewReader(corpusFrame(f, "FuzzFrame", "commit-create"))); err != nil || commit.RepoCommit == nil {
		f.Fatalf("the corpus's commit-create: %v", err)
	}
	f.Add(frame(f, &events.XRPCStreamEvent{RepoSync: &comatproto.SyncSubscribeRepos_Sync{Did: fuzzDID, Seq: 4, Rev: commit.RepoCommit.Rev, Time: now, Blocks: commit.RepoCommit.Blocks}}))
	id := fuzzIdentity(f)
	src := newFrameServer(f)
	f.Fuzz(func(t *testing.T, msg []byte) {
		src.send(msg)
		s, sub := readLoopStream(t, src.URL, id)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.connect(ctx); errors.Is(err, ErrFaultyFrame) {
			t.Logf("faulty frame: %v", err)
		}
		st, _, _ := sub.Snapshot()
		if len(st.Records) > fuzzMaxRecords {
			t.Fatalf("%d records kept, the bound is %d", len(st.Records), fuzzMaxRecords)
		}
		for uri, rec := range st.Records {
			if rec.DID() != fuzzDID || rec.collection() != testCollection {
				t.Fatalf("kept %s: not of %s's %s", uri, fuzzDID, testCollection)
			}
		}
	})
}
