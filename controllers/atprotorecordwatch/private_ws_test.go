package atprotorecordwatch

import (
	"context"
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

// TestPrivateWebsocketSourceReadsLikeAClosedPort: a private address that
// accepts the websocket (any websocket server: it need not speak the
// firehose) and then sends something that is no frame and closes reads
// in the watch's condition exactly like a closed port (R17). Before, the
// connection had succeeded, so readLoop's error was not marked
// ErrPrivateUnreachable and its text ("reading header: cbor input ...")
// told the two apart.
func TestPrivateWebsocketSourceReadsLikeAClosedPort(t *testing.T) {
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
	go func() { _ = h.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
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
	for _, source := range []string{"https://" + nettest.ClosedAddr(t), ws.URL} {
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
	t.Logf("closed port: %s", msgs[0])
	t.Logf("websocket server: %s", msgs[1])
	if msgs[0] != msgs[1] {
		t.Errorf("a private source that accepts a websocket reads differently from a closed port")
	}
}
