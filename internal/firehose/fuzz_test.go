package firehose

import (
	"bytes"
	"context"
	"encoding/hex"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/bluesky-social/indigo/events"
	"github.com/go-logr/logr"
)

// fuzzKey signs the commits of fuzzDID in testdata/fuzz/FuzzFrame (frames
// a testRepo made with this key), so that mutations of them get past the
// signature to the MST, the ops and the records.
const (
	fuzzKey = "2dbd72d0d3b13445eb532607b40f87f8295cb2ffb0567e36995834b4be3e58c7"
	fuzzDID = "did:plc:alice"
	// fuzzMaxRecords is the subscription's bound: small, so that a
	// frame with more records than it must evict.
	fuzzMaxRecords = 3
)

func fuzzIdentity(tb testing.TB) identity.Identity {
	raw, err := hex.DecodeString(fuzzKey)
	if err != nil {
		tb.Fatal(err)
	}
	key, err := atcrypto.ParsePrivateBytesK256(raw)
	if err != nil {
		tb.Fatal(err)
	}
	pub, err := key.PublicKey()
	if err != nil {
		tb.Fatal(err)
	}
	return identity.Identity{
		DID:  syntax.DID(fuzzDID),
		Keys: map[string]identity.VerificationMethod{"atproto": {Type: "Multikey", PublicKeyMultibase: pub.Multibase()}},
	}
}

func frame(tb testing.TB, ev *events.XRPCStreamEvent) []byte {
	var buf bytes.Buffer
	if err := ev.Serialize(&buf); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

type noDeadline struct{}

func (noDeadline) SetReadDeadline(time.Time) error { return nil }

// FuzzFrame: one websocket message from a source, decoded as the read loop
// does (events.XRPCStreamEvent.Deserialize, what HandleRepoStream reads)
// and handed to the stream's scheduler and handler. Whatever the bytes, no
// panic, and the subscription holds at most its bound of records, each of
// the signed repo, of a wanted collection, accepted by Check.
func FuzzFrame(f *testing.F) {
	now := time.Now().UTC().Format(time.RFC3339Nano)
	f.Add(frame(f, &events.XRPCStreamEvent{RepoIdentity: &comatproto.SyncSubscribeRepos_Identity{Did: fuzzDID, Seq: 1, Time: now}}))
	f.Add(frame(f, &events.XRPCStreamEvent{RepoInfo: &comatproto.SyncSubscribeRepos_Info{Name: "OutdatedCursor"}}))
	f.Add(frame(f, &events.XRPCStreamEvent{Error: &events.ErrorFrame{Error: "FutureCursor", Message: "cursor in the future"}}))
	f.Add(frame(f, &events.XRPCStreamEvent{RepoSync: &comatproto.SyncSubscribeRepos_Sync{Did: fuzzDID, Seq: 2, Rev: "3jzfcijpj2z2a", Time: now, Blocks: []byte{0x3a}}}))
	id := fuzzIdentity(f)
	f.Fuzz(func(t *testing.T, msg []byte) {
		var ev events.XRPCStreamEvent
		if err := ev.Deserialize(bytes.NewReader(msg)); err != nil {
			return
		}
		dir := identity.NewMockDirectory()
		dir.Insert(id)
		h, err := NewHub(Options{Directory: dir, Log: logr.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		if h.opts.Metrics, err = NewMetrics(nil); err != nil {
			t.Fatal(err)
		}
		s := newStream(h, "http://pds.invalid")
		sub := newSubscription(Filter{Collections: []string{testCollection}, Check: noteCheck}, fuzzMaxRecords, State{})
		sub.full, sub.stream = false, s
		s.subs[sub] = struct{}{}
		sub.join(1)

		ctx := context.Background()
		sc := newScheduler(ctx, s, 1, newCursorTracker(0), time.Minute, noDeadline{})
		_ = sc.AddWork(ctx, fuzzDID, &ev)
		sc.Shutdown()

		st, _, _ := sub.Snapshot()
		if len(st.Records) > fuzzMaxRecords {
			t.Fatalf("%d records kept, the bound is %d", len(st.Records), fuzzMaxRecords)
		}
		for uri, rec := range st.Records {
			if uri != rec.URI || rec.DID() != fuzzDID || rec.collection() != testCollection {
				t.Fatalf("kept %s as %s: not of %s's %s", uri, rec.URI, fuzzDID, testCollection)
			}
			if _, err := syntax.ParseATURI(uri); err != nil {
				t.Fatalf("kept %q: %v", uri, err)
			}
			if err := noteCheck(testCollection, rec.Value); err != nil {
				t.Fatalf("kept %s, which Check refuses: %v", uri, err)
			}
		}
	})
}
