package atprotorecordwatch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/gorilla/websocket"

	"github.com/knotless-dev/knotless/internal/backoff"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/netpolicy/nettest"
)

// TestPrivateSourceFailuresLookAlike (R17, from review): an
// AtprotoRecordWatch whose source is an address inside the operator's
// allowed private ranges must not tell a closed port from a certificate
// that does not verify: otherwise any workspace user scans the operator's
// networks with watches, as TenantClusters and AtprotoRepos no longer
// can. All are SourceUnreachable with one message, also a websocket
// server that accepts and then sends anything; the cause is in the
// provider's log.
func TestPrivateSourceFailuresLookAlike(t *testing.T) {
	m, err := firehose.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	policy := netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil)
	h, err := firehose.NewHub(firehose.Options{
		Directory: identity.NewMockDirectory(), Policy: policy, Metrics: m,
		Dialer: &websocket.Dialer{NetDialContext: policy.Dialer(time.Second).DialContext, HandshakeTimeout: time.Second},
		Gather: 10 * time.Millisecond, Backoff: backoff.Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = h.Start(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	answering := func(code int) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(code)
			_, _ = w.Write([]byte("ok"))
		}))
		t.Cleanup(s.Close)
		return s.URL
	}
	// A websocket server that accepts, sends what is no frame and closes
	// (from review: its text showed, the connection having opened).
	up := websocket.Upgrader{}
	ws := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		_ = c.WriteMessage(websocket.BinaryMessage, []byte("internal service v1.2"))
		time.Sleep(50 * time.Millisecond)
		_ = c.Close()
	}))
	t.Cleanup(ws.Close)
	var msgs []string
	for _, source := range []string{"https://" + nettest.ClosedAddr(t), nettest.UntrustedURL(t), "https://" + nettest.SilentAddr(t), answering(http.StatusNotFound), answering(http.StatusOK), ws.URL} {
		hostport := strings.TrimPrefix(strings.TrimPrefix(source, "https://"), "http://")
		w := watchOf(source, "app.bsky.feed.post")
		sub, err := h.Subscribe(w.Spec.Source.URL, firehose.Filter{Collections: w.Spec.Collections}, 10, firehose.State{})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, health, _ := sub.Snapshot()
			if health.Err != nil {
				c := buildStatus(w, &w.Status, firehose.State{}, health).Conditions[0]
				msgs = append(msgs, c.Reason+": "+strings.ReplaceAll(c.Message, hostport, "HOST"))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no connection error", hostport)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for i := range msgs[1:] {
		if msgs[i+1] != msgs[0] {
			t.Errorf("failures at private sources differ:\n%s\n%s", msgs[0], msgs[i+1])
		}
	}
	// A listing from a private PDS (firehose TestPrivatePDSListingsFailAlike)
	// reads alike too.
	w := watchOf("https://source.example", "app.bsky.feed.post")
	listing := firehose.Health{Connected: true, Resyncing: true, ResyncErr: fmt.Errorf("%w: %w", firehose.ErrPrivateUnreachable, errors.New("x509: certificate signed by unknown authority"))}
	if c := buildStatus(w, &w.Status, firehose.State{}, listing).Conditions[0]; c.Reason != "Resyncing" || strings.Contains(c.Message, "x509") {
		t.Errorf("a failed listing from a private PDS: %s: %s", c.Reason, c.Message)
	}
	for _, m := range msgs {
		if !strings.HasPrefix(m, "SourceUnreachable: ") || strings.Contains(m, "refused") || strings.Contains(m, "x509") {
			t.Errorf("message %q: want SourceUnreachable without the cause", m)
		}
	}
}
