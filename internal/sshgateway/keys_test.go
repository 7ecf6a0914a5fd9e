package sshgateway

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
)

// TestKeysFromHostilePDS: what a PDS answers is read bounded and
// checked: no record is no keys (kept for the TTL, then asked again; a
// failure for failTTL), an
// answer that is not a signed proof is refused, an answer past the
// bound is refused, a redirect is not followed; a handle that does not
// resolve, or a name that is neither, is refused before any request.
func TestKeysFromHostilePDS(t *testing.T) {
	var answer func(w http.ResponseWriter)
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		if r.URL.Path != "/xrpc/com.atproto.sync.getRecord" || r.URL.Query().Get("collection") != "dev.knotless.gateway.sshKeys" || r.URL.Query().Get("rkey") != "self" {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		answer(w)
	}))
	defer srv.Close()
	dir := identity.NewMockDirectory()
	dir.Insert(identity.Identity{DID: syntax.DID("did:plc:alice"), Handle: syntax.Handle("alice.test"),
		Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: srv.URL}}})
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	k := &Keys{Directory: dir, Client: pds.NewHTTPClient(netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil), nil, 5*time.Second),
		TTL: time.Minute, Now: func() time.Time { return now }}

	answer = func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":"RecordNotFound","message":"Could not locate record"}`))
	}
	if did, _, err := k.Lookup(t.Context(), "alice.test"); did != "did:plc:alice" || !errors.Is(err, ErrNoKeys) {
		t.Fatalf("no record: %q %v", did, err)
	}
	if _, _, err := k.Lookup(t.Context(), "did:plc:alice"); !errors.Is(err, ErrNoKeys) || hits != 1 {
		t.Errorf("no record again within the TTL: %v, %d requests", err, hits)
	}
	now = now.Add(time.Minute)
	for name, c := range map[string]struct {
		answer func(w http.ResponseWriter)
		want   string
	}{
		"not a CAR": {func(w http.ResponseWriter) { _, _ = w.Write([]byte("not a car")) }, "proof is invalid"},
		"too large": {func(w http.ResponseWriter) { _, _ = w.Write([]byte(strings.Repeat("x", MaxRecordProof+10))) }, "more than"},
		"a redirect": {func(w http.ResponseWriter) {
			w.Header().Set("Location", "http://169.254.169.254/")
			w.WriteHeader(http.StatusFound)
		}, "answered 302"},
		"an error": {func(w http.ResponseWriter) { w.WriteHeader(http.StatusInternalServerError) }, "answered 500"},
	} {
		answer = c.answer
		now = now.Add(failTTL) // a failure is kept that long
		if _, _, err := k.Lookup(t.Context(), "alice.test"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
	before := hits
	for _, user := range []string{"nobody.test", "not a name", "did:plc:nobody"} {
		if _, _, err := k.Lookup(t.Context(), user); err == nil {
			t.Errorf("%s resolved", user)
		}
	}
	if hits != before {
		t.Errorf("%d requests for users that do not resolve", hits-before)
	}
}
