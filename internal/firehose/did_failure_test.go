package firehose

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"

	"github.com/knotless-dev/knotless/internal/netpolicy/nettest"
)

// TestDIDFailuresReadAlike: a DID whose document cannot be read fails a
// listing with one message, however it failed (a closed port, an HTTP
// status), on the first try and on a retry that the directory answers
// from its cache of failures without any connection (which
// privateFailure could not mark). Before, the cause ("connection
// refused", "HTTP status 404", the address) reached the watch's message:
// a did:web owner scanned the operator's networks through it (R17).
func TestDIDFailuresReadAlike(t *testing.T) {
	srv404 := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) }))
	defer srv404.Close()
	var msgs []string
	for _, target := range []string{nettest.ClosedAddr(t), srv404.Listener.Addr().String()} {
		base := &identity.BaseDirectory{SkipHandleVerification: true, HTTPClient: http.Client{Timeout: time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the test's own server; only its status matters
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", target) // the DID's host resolves to a private address
			}}}}
		// As pds.NewDirectory caches: failures for a minute.
		s := testStream(t, identity.NewCacheDirectory(base, 100, time.Hour, time.Minute, time.Minute))
		for range 2 {
			_, err := s.client(context.Background(), "did:web:evil.example.com")
			if err == nil {
				t.Fatal("a DID whose document cannot be read resolved")
			}
			msgs = append(msgs, err.Error())
			if _, err := s.carries(context.Background(), "did:web:evil.example.com"); err == nil || err.Error() != msgs[len(msgs)-1] {
				t.Errorf("carries: %v, want %q", err, msgs[len(msgs)-1])
			}
		}
	}
	for _, m := range msgs[1:] {
		if m != msgs[0] {
			t.Errorf("DID failures read differently: %q", msgs)
			break
		}
	}
}
