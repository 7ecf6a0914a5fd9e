package firehose

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/gorilla/websocket"

	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// recorder is a server that counts the requests reaching it.
func recorder(t *testing.T) (*httptest.Server, *atomic.Int32) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	return srv, &hits
}

// redirectTo answers every request with a 302 to the same path on target.
func redirectTo(target string) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		http.Redirect(w, req, target+req.URL.RequestURI(), http.StatusFound)
	}
}

// A source whose address the policy refuses is never connected to; the
// subscription reports the refusal and the hub retries with backoff.
func TestPolicyRefusesTheSourceBeforeAnyConnection(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	l := &countingListener{Listener: srv.Listener}
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	// Public addresses only; the source is on loopback.
	h, m := startHub(t, Options{Directory: identity.NewMockDirectory(), Policy: netpolicy.New(nil, nil)})
	sub, err := h.Subscribe(srv.URL, Filter{Collections: []string{testCollection}}, 10, State{})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, sub, "a failed connection", func(_ State, h Health) bool { return h.Err != nil })
	time.Sleep(500 * time.Millisecond)
	if n := l.accepted.Load(); n != 0 {
		t.Fatalf("%d connections reached the refused source", n)
	}
	_, health, _ := sub.Snapshot()
	if health.Connected || !errors.Is(health.Err, netpolicy.ErrDenied) {
		t.Fatalf("health %+v, want a refusal", health)
	}
	t.Logf("reported: %v", health.Err)
	// 20 ms doubling to 100 ms: about 7 attempts in 500 ms.
	if n := counterValue(t, m.Reconnects.WithLabelValues(otherSource, "error")); n < 2 || n > 15 {
		t.Fatalf("%v attempts in 500 ms; want a few, with backoff", n)
	}
}

// The listings of a resync never follow a redirect, whether the hub made
// its HTTP client or was given one: the listing fails and the target of
// the redirect sees nothing.
func TestListingRedirectsAreNotFollowed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client *http.Client
	}{
		{"hub's client", nil},
		{"caller's client", &http.Client{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, hits := recorder(t)
			r := newTestRepo(t, "did:plc:alice")
			dir := identity.NewMockDirectory()
			dir.Insert(r.identity(nil))
			src := newWrappedFakeSource(t, r, func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
					if req.URL.Path == "/xrpc/com.atproto.sync.subscribeRepos" {
						next.ServeHTTP(w, req)
						return
					}
					redirectTo(rec.URL)(w, req)
				})
			})
			src.write(testOp{"create", testCollection + "/a", note("a")})
			h, _ := startHub(t, Options{Directory: dir, HTTPClient: tc.client})
			sub, err := h.Subscribe(src.srv.URL, Filter{Collections: []string{testCollection}}, 10, State{})
			if err != nil {
				t.Fatal(err)
			}
			waitState(t, sub, "two failed listings", func(st State, h Health) bool {
				return h.Connected && st.Errors >= 2 && h.ResyncErr != nil
			})
			if n := hits.Load(); n != 0 {
				t.Fatalf("the redirect was followed: %d requests reached its target", n)
			}
			_, health, _ := sub.Snapshot()
			if !health.Resyncing || !strings.Contains(health.ResyncErr.Error(), "302") {
				t.Fatalf("health %+v, want a listing failed with HTTP 302", health)
			}
			if tc.client != nil && tc.client.CheckRedirect != nil {
				t.Fatal("the caller's client was changed")
			}
		})
	}
}

// A redirect answering the websocket handshake fails the connection.
func TestHandshakeRedirectIsNotFollowed(t *testing.T) {
	rec, hits := recorder(t)
	src := httptest.NewServer(redirectTo(rec.URL))
	t.Cleanup(src.Close)
	h, _ := startHub(t, Options{Directory: identity.NewMockDirectory()})
	sub, err := h.Subscribe(src.URL, Filter{Collections: []string{testCollection}}, 10, State{})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, sub, "a failed handshake", func(_ State, h Health) bool { return errors.Is(h.Err, websocket.ErrBadHandshake) })
	_, health, _ := sub.Snapshot()
	if !strings.Contains(health.Err.Error(), "302") {
		t.Fatalf("error %v, want it to name HTTP 302", health.Err)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the redirect was followed: %d requests reached its target", n)
	}
}
