package firehose

import (
	"errors"
	"testing"

	"github.com/bluesky-social/indigo/atproto/identity"

	"github.com/knotless-dev/knotless/internal/netpolicy/nettest"
)

// TestPrivatePDSListingsFailAlike (R17, from review): a listing from a
// repo's PDS at a loopback, private or shared address (the DID document,
// which the repo's owner writes, names it) fails with
// ErrPrivateUnreachable whether the port is closed or the certificate
// does not verify, so a watch's Resyncing message cannot tell them apart.
func TestPrivatePDSListingsFailAlike(t *testing.T) {
	for name, pds := range map[string]string{"closed port": "https://" + nettest.ClosedAddr(t), "untrusted certificate": nettest.UntrustedURL(t)} {
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
