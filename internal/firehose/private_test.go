package firehose

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"

	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/netpolicy/nettest"
)

// TestPrivatePDSListingsFailAlike (R17, from review): a listing from a
// repo's PDS at a loopback, private or shared address (the DID document,
// which the repo's owner writes, names it) fails with
// ErrPrivateUnreachable whether the port is closed, the host is silent,
// the certificate does not verify, or a plain-http server there answers
// with any status (404) or a body that is no listing (200), so a watch's
// Resyncing message cannot tell them apart and a user cannot scan the
// operator's networks by status code. (The subscription names the repo:
// one of every repo of the source leaves it unlisted and goes on, see
// TestAttackDeadRepoPDSDoesNotStallTheSource.)
func TestPrivatePDSListingsFailAlike(t *testing.T) {
	answering := func(code int) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(code)
			_, _ = w.Write([]byte("ok"))
		}))
		t.Cleanup(s.Close)
		return s.URL
	}
	policy := netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil)
	for name, pds := range map[string]string{
		"closed port":           "https://" + nettest.ClosedAddr(t),
		"silent host":           "https://" + nettest.SilentAddr(t),
		"untrusted certificate": nettest.UntrustedURL(t),
		"plain http 404":        answering(http.StatusNotFound),
		"plain http 200":        answering(http.StatusOK),
	} {
		t.Run(name, func(t *testing.T) {
			r := newTestRepo(t, "did:plc:alice")
			dir := identity.NewMockDirectory()
			dir.Insert(r.identityAt(pds))
			src := newFakeSource(t, r)
			src.write(testOp{"create", testCollection + "/a", note("a")})
			h, _ := startHub(t, Options{Directory: dir, Policy: policy,
				HTTPClient: &http.Client{Timeout: 300 * time.Millisecond, Transport: policy.Transport(), CheckRedirect: netpolicy.NoRedirects}})
			sub, err := h.Subscribe(src.srv.URL, Filter{Collections: []string{testCollection}, DIDs: []string{r.did}}, 10, State{})
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
