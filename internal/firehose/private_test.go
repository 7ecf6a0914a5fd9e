package firehose

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/bluesky-social/indigo/atproto/identity"
)

// TestPrivatePDSListingsFailAlike (R17, from review): a listing from a
// repo's PDS at a loopback, private or shared address (the DID document,
// which the repo's owner writes, names it) fails with
// ErrPrivateUnreachable whether the port is closed or the certificate
// does not verify, so a watch's Resyncing message cannot tell them apart.
func TestPrivatePDSListingsFailAlike(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "https://" + closed.Addr().String()
	closed.Close()
	untrusted := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(untrusted.Close)
	for name, pds := range map[string]string{"closed port": closedURL, "untrusted certificate": untrusted.URL} {
		t.Run(name, func(t *testing.T) {
			r := newTestRepo(t, "did:plc:alice")
			dir := identity.NewMockDirectory()
			dir.Insert(r.identityAt(pds))
			src := newFakeSource(t, r)
			src.write(testOp{"create", testCollection + "/a", note("a")})
			h, _ := startHub(t, Options{Directory: dir})
			sub, err := h.Subscribe(src.srv.URL, Filter{Collections: []string{testCollection}}, 10, State{})
			if err != nil {
				t.Fatal(err)
			}
			waitState(t, sub, "a failed listing", func(_ State, h Health) bool { return h.Connected && h.ResyncErr != nil })
			_, health, _ := sub.Snapshot()
			if !errors.Is(health.ResyncErr, ErrPrivateUnreachable) {
				t.Fatalf("listing error %v, want ErrPrivateUnreachable", health.ResyncErr)
			}
		})
	}
}
