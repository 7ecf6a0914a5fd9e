package repoconn

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/netpolicy/nettest"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/pds/pdstest"
)

// TestPrivatePDSFailuresLookAlike (R17, from review): an AtprotoRepo whose
// spec.pds.url is an address inside the operator's allowed private
// ranges must not tell a closed port, a host that does not answer and a
// certificate that does not verify apart: otherwise any workspace user
// scans the operator's networks with AtprotoRepos, as TenantClusters no
// longer can (TestPrivateTenantFailuresLookAlike). Nor a plain-http
// server there that answers with any status, a redirect, or a 200 that is
// no session (from review: their status showed in the condition); only a
// PDS's own refusal of the credential (an XRPC authentication error) is
// told apart (TestPrivatePDSRefusalIsTold).
func TestPrivatePDSFailuresLookAlike(t *testing.T) {
	p := &Pool{Directory: pdstest.Directory("http://localhost"), Policy: local, Timeout: 300 * time.Millisecond}
	c := workspace(t)
	var first string
	answering := func(code int, body string) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(code)
			_, _ = w.Write([]byte(body))
		}))
		t.Cleanup(s.Close)
		return s.URL
	}
	redirecting := httptest.NewServer(http.RedirectHandler("http://127.0.0.1:1/", http.StatusFound))
	t.Cleanup(redirecting.Close)
	for i, url := range []string{
		"https://" + nettest.ClosedAddr(t), "https://" + nettest.SilentAddr(t), nettest.UntrustedURL(t),
		// Plain-http servers there (the operator allows plain http to its
		// private ranges) that answer anything but a PDS's session.
		answering(http.StatusNotFound, "not found"), answering(http.StatusOK, "ok"), answering(http.StatusInternalServerError, `{"error":"InternalServerError"}`),
		answering(http.StatusUnauthorized, "who are you"), answering(http.StatusForbidden, `{"error":"forbidden"}`), redirecting.URL,
	} {
		got, msg := reason(t, p, c, newRepo(url))
		if i == 0 {
			first = got + ": " + msg
			continue
		}
		if got+": "+msg != first {
			t.Errorf("%s: %s: %s\nfirst: %s", url, got, msg, first)
		}
	}
}

// TestPrivatePDSRefusalIsTold: a PDS at a private address that refuses
// the credential with an XRPC authentication error is still
// AuthenticationFailed (only a PDS answers so), not the one message of
// TestPrivatePDSFailuresLookAlike.
func TestPrivatePDSRefusalIsTold(t *testing.T) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":"AuthenticationRequired","message":"Invalid identifier or password"}`))
	}))
	t.Cleanup(s.Close)
	p := &Pool{Directory: pdstest.Directory("http://localhost"), Policy: local, Timeout: 300 * time.Millisecond}
	if got, msg := reason(t, p, workspace(t), newRepo(s.URL)); got != atprotov1alpha1.ReasonAuthenticationFailed {
		t.Errorf("a PDS's refusal at a private address: %s: %s, want %s", got, msg, atprotov1alpha1.ReasonAuthenticationFailed)
	}
}

// TestPublicRedirectIsPDSRedirected: outside private addresses a redirect
// keeps its own reason (R18), which TestConnectNeverFollowsRedirects, on
// loopback, cannot show.
func TestPublicRedirectIsPDSRedirected(t *testing.T) {
	var ce *conditions.Error
	if err := Classify(fmt.Errorf("pds: logging in: %w (HTTP 302)", pds.ErrRedirect)); !errors.As(err, &ce) || ce.Reason != atprotov1alpha1.ReasonPDSRedirected {
		t.Errorf("Classify(redirect) = %v, want %s", err, atprotov1alpha1.ReasonPDSRedirected)
	}
}
