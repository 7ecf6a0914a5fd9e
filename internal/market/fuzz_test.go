package market

import (
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/knotless-dev/knotless/internal/lexicon"
)

// FuzzSplitURI: the at-URIs of records from the network. SplitURI takes
// exactly what URI makes (a round trip, three non-empty parts without
// '/'), and a record at-URI indigo parses splits into indigo's parts.
func FuzzSplitURI(f *testing.F) {
	for _, s := range []string{
		URI("did:plc:ewvi7nxzyoun6zhxrhs64oiz", lexicon.Bid, "b0123456789abcdefghijklmnopqrstuv"),
		"at://did:plc:bob/" + lexicon.Request + "/at://did:plc:alice/" + lexicon.Request + "/smuggled",
		"at://alice.example.com/app.bsky.feed.post/3jzfcijpj2z2a",
		"AT://did:plc:alice/c/r", "did:plc:a/c/r", "at://did:plc:a/c",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		did, col, rkey := SplitURI(uri)
		if did == "" {
			if col != "" || rkey != "" {
				t.Fatalf("%q: no repo, but collection %q and key %q", uri, col, rkey)
			}
		} else {
			for _, p := range []string{did, col, rkey} {
				if p == "" || strings.Contains(p, "/") {
					t.Fatalf("%q split into %q %q %q", uri, did, col, rkey)
				}
			}
			if back := URI(did, col, rkey); back != uri {
				t.Fatalf("%q split and joined is %q", uri, back)
			}
		}
		a, err := syntax.ParseATURI(uri)
		if err != nil || a.RecordKey() == "" {
			return
		}
		if did != a.Authority().String() || col != a.Collection().String() || rkey != a.RecordKey().String() {
			t.Fatalf("%q: split into %q %q %q, indigo parses %q %q %q", uri, did, col, rkey, a.Authority(), a.Collection(), a.RecordKey())
		}
	})
}

// FuzzParseRequestKey: a request key is what RequestKey makes of its
// parts, and Written agrees with the owner's parse.
func FuzzParseRequestKey(f *testing.F) {
	owner := Owner("uid-1")
	at := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, k := range []string{RequestKey(owner, 3, at), RequestKey(owner, 0, time.UnixMilli(1)), "r" + owner + "-03-x", "r" + owner + "-1-", "r" + owner + "--1-abc", "r" + owner + "-2147483648-1", BidKey(owner, "at://x")} {
		f.Add(owner, k)
	}
	f.Fuzz(func(t *testing.T, owner, rkey string) {
		replica, stamp, ok := ParseRequestKey(owner, rkey)
		if !ok {
			return
		}
		if replica < 0 || stamp <= 0 {
			t.Fatalf("%q: replica %d, stamp %d", rkey, replica, stamp)
		}
		if back := RequestKey(owner, replica, time.UnixMilli(stamp)); back != rkey {
			t.Fatalf("%q parsed as %d %d, which is the key %q", rkey, replica, stamp, back)
		}
		if len(owner) == 8 && !Written(rkey) {
			t.Fatalf("%q is a request key of %q, but not Written", rkey, owner)
		}
	})
}

// FuzzParseTime: a record datetime from the network. ParseTime gives the
// zero time or a UTC time a Kubernetes time field holds; a datetime indigo
// accepts whose year (in UTC) is 1–9999 is that time.
func FuzzParseTime(f *testing.F) {
	for _, s := range []string{"2026-06-01T12:00:00.000Z", "2026-06-01T14:00:00+02:00", "9999-12-31T23:59:59.999Z", "9999-12-31T23:59:59.999-23:59",
		"0000-01-01T00:00:00+01:00", "yesterday", "", "2026-06-01T12:00:00.123456789123Z", "2026-06-01t12:00:00z", "2026-06-01T12:00:00-00:00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := ParseTime(s)
		if !got.IsZero() {
			if got.Location() != time.UTC || got.Year() < 1 || got.Year() > 9999 {
				t.Fatalf("%q: %v", s, got)
			}
			if _, err := metav1.NewTime(got).MarshalJSON(); err != nil {
				t.Fatalf("%q: %v does not fit a Kubernetes time: %v", s, got, err)
			}
			if back := ParseTime(Time(got)); !back.Equal(got.Truncate(time.Millisecond)) {
				t.Fatalf("%q: %v formatted and parsed is %v", s, got, back)
			}
		}
		dt, err := syntax.ParseDatetime(s)
		if err != nil {
			return
		}
		if want := dt.Time().UTC(); want.Year() >= 1 && want.Year() <= 9999 && !got.Equal(want) {
			t.Fatalf("%q: a record datetime of %v, ParseTime gives %v", s, want, got)
		}
	})
}
