package gateway

// Second adversarial review: attacks on the fixes of ca8b066/3d8ecf4.
// TestAtk2* found a hole (fixed since; they guard it); TestHolds2* show
// a defence that held.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	streamhttp "k8s.io/streaming/pkg/httpstream"
)

// ---- holders ----

// TestAtk2HolderBlipHandsOver: the holder's routes are set to none for a
// moment (the controller does so on a transient error: liveContract's
// Get failing, Follow failing, the VM not Running during a reboot), and
// a hostile claimant, waiting with a later claim, takes the served
// hostname for good.
func TestAtk2HolderBlipHandsOver(t *testing.T) {
	var r Routes
	r.Set("vm-victim", []Route{{Hostname: "shop.gw.test", DID: "did:plc:victim", Rank: 10}})
	r.Set("vm-hostile", []Route{{Hostname: "shop.gw.test", DID: "did:plc:hostile", Rank: 99}})
	r.Set("vm-victim", nil) // a transient drop
	r.Set("vm-victim", []Route{{Hostname: "shop.gw.test", DID: "did:plc:victim", Rank: 10}})
	if got, _ := r.Get("shop.gw.test"); got.DID != "did:plc:victim" {
		t.Errorf("after a one-reconcile drop of its holder, the hostname went to %q for good", got.DID)
	}
}

// TestHolds2RestoredHolderDuringGrace: a hostile tenant set (and re-set,
// and removed and re-set) during HolderGrace never takes a restored
// holder's hostname.
func TestHolds2RestoredHolderDuringGrace(t *testing.T) {
	var r Routes
	r.Restore(map[string]string{"shop.gw.test": "vm-victim"})
	for range 3 {
		r.Set("vm-hostile", []Route{{Hostname: "SHOP.gw.test", DID: "did:plc:hostile", Rank: -1 << 62}})
		r.Set("vm-hostile", nil)
		r.Set("vm-hostile", []Route{{Hostname: "shop.gw.test", DID: "did:plc:hostile", Rank: -1 << 62}})
	}
	if got, ok := r.Get("shop.gw.test"); ok {
		t.Fatalf("hostile took the restored holder's hostname: %+v", got)
	}
	r.Set("vm-victim", []Route{{Hostname: "shop.gw.test", DID: "did:plc:victim", Rank: 10}})
	if got, _ := r.Get("shop.gw.test"); got.DID != "did:plc:victim" {
		t.Fatalf("restored holder: %+v", got)
	}
}

// TestAtk2GraceExpiryLeavesHostUnserved: a restored holder never comes
// back; after HolderGrace the waiting claimant is not served until its
// own routes are set again (nothing settles the hostname when the grace
// ends). A liveness gap, not a takeover.
func TestAtk2GraceExpiryLeavesHostUnserved(t *testing.T) {
	now := time.Now()
	r := Routes{Now: func() time.Time { return now }}
	r.Restore(map[string]string{"shop.gw.test": "vm-gone"})
	r.Set("vm-next", []Route{{Hostname: "shop.gw.test", DID: "did:plc:next", Rank: 10}})
	now = now.Add(HolderGrace + time.Second)
	r.Set("vm-other", nil) // other tenants' reconciles do not touch it
	if _, ok := r.Get("shop.gw.test"); !ok {
		t.Errorf("after HolderGrace the remaining claimant is still unserved (until its own Set)")
	}
}

// TestHolds2SaveOnlyOnChange: re-setting identical routes does not
// rewrite the holders file (Saved not called), so a tenant cannot make
// the agent write to disk at will.
func TestHolds2SaveOnlyOnChange(t *testing.T) {
	var n int
	r := Routes{Saved: func(map[string]string) { n++ }}
	rs := []Route{{Hostname: "a.gw.test", Rank: 1}}
	r.Set("vm-a", rs)
	for range 10 {
		r.Set("vm-a", rs)
	}
	if n != 1 {
		t.Fatalf("Saved called %d times", n)
	}
}

// ---- stripping ----

func trailerPod(t *testing.T, h2 bool, declare bool) (*http.Response, string) {
	t.Helper()
	port, pod := podPort(t, func(w http.ResponseWriter, _ *http.Request) {
		if declare {
			w.Header().Set("Trailer", "knotless-gateway-reason, X-Ok")
		}
		w.WriteHeader(200)
		_, _ = io.WriteString(w, "body")
		if declare {
			w.Header().Set("Knotless-Gateway-Reason", "NoRoute")
			w.Header().Set("X-Ok", "1")
		} else {
			w.Header().Set(http.TrailerPrefix+"knotless-gateway-reason", "NoRoute")
		}
	})
	t.Cleanup(pod.Close)
	routes, ts := atkGateway(t, &localBackend{eps: map[string][]Endpoint{"web/shop:80": {{Namespace: "web", Pod: "p", Port: port}}}})
	routes.Set("vm-a", []Route{{Hostname: "shop.gw.test", Namespace: "web", Service: "shop", Port: 80}})
	return call(t, ts, "shop.gw.test", "/", h2)
}

func TestHolds2TrailerStripped(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		for _, declare := range []bool{false, true} {
			resp, body := trailerPod(t, h2, declare)
			if body != "body" {
				t.Fatalf("body %q", body)
			}
			if v := resp.Trailer.Get(ReasonHeader); v != "" {
				t.Errorf("h2=%v declared=%v: reason trailer %q came through", h2, declare, v)
			}
			if v := resp.Header.Get(ReasonHeader); v != "" {
				t.Errorf("h2=%v declared=%v: reason header %q", h2, declare, v)
			}
			if declare && resp.Trailer.Get("X-Ok") != "1" {
				t.Errorf("h2=%v: other trailer lost: %v", h2, resp.Trailer)
			}
		}
	}
}

// TestHolds2UpgradeThroughWrapper: the websocket-style upgrade reaches
// Hijack through stripping.Unwrap (ResponseController).
func TestHolds2UpgradeThroughWrapper(t *testing.T) {
	TestServerUpgrade(t)
}

// ---- podConn ----

// stuckStream is a data stream whose Read gives what reads yields and
// whose Reset blocks until release is closed (a SPDY reset is a frame
// written on the tenant's connection: it blocks when the tenant's API
// server stops reading).
type stuckStream struct {
	streamhttp.Stream
	reads   chan []byte
	release chan struct{}
}

func (s *stuckStream) Read(p []byte) (int, error) {
	b, ok := <-s.reads
	if !ok {
		return 0, io.EOF
	}
	return copy(p, b), nil
}
func (s *stuckStream) Reset() error { <-s.release; return nil }
func (s *stuckStream) Close() error { return nil }

type quietStream struct{ streamhttp.Stream }

func (quietStream) Reset() error { return nil }
func (quietStream) Close() error { return nil }

type nopConnection struct{ streamhttp.Connection }

func (nopConnection) RemoveStreams(...streamhttp.Stream) {}

func newTestPodConn(data streamhttp.Stream) *podConn {
	c := &podConn{link: &podLink{d: &PodDialer{}, conn: nopConnection{}}, data: data, errs: quietStream{}, remote: make(chan error, 1), addr: "p:1"}
	c.cond = sync.NewCond(&c.bmu)
	close(c.remote)
	go c.pump()
	return c
}

// TestHolds2CloseUnblocksRead: a Read waiting for data returns when the
// connection is closed.
func TestHolds2CloseUnblocksRead(t *testing.T) {
	s := &stuckStream{reads: make(chan []byte), release: make(chan struct{})}
	close(s.release)
	c := newTestPodConn(s)
	done := make(chan error, 1)
	go func() { _, err := c.Read(make([]byte, 8)); done <- err }()
	time.Sleep(50 * time.Millisecond)
	_ = c.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("nil error")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Read blocked after Close")
	}
}

// TestAtk2PumpResetsUnderLock: the tenant sends more than maxBuffered and
// then stops reading its connection, so the pump's data.Reset blocks —
// while the pump holds bmu. Read and Close (and the deadline's Close)
// then block on bmu for as long as the tenant likes: the client's
// request, its goroutine and its upstream slot are held.
func TestAtk2PumpResetsUnderLock(t *testing.T) {
	s := &stuckStream{reads: make(chan []byte, 200), release: make(chan struct{})}
	defer close(s.release)
	chunk := bytes.Repeat([]byte("x"), 32<<10)
	for range 140 { // > 4 MiB
		s.reads <- chunk
	}
	c := newTestPodConn(s)
	time.Sleep(200 * time.Millisecond) // the pump is now in Reset, holding bmu
	done := make(chan struct{})
	go func() { _ = c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Error("Close blocked: the pump holds bmu while its Reset waits on the tenant")
	}
}

// ---- LimitPerIP ----

type fakeAddrConn struct {
	net.Conn
	addr net.Addr
}

func (c *fakeAddrConn) RemoteAddr() net.Addr { return c.addr }
func (c *fakeAddrConn) Close() error         { return nil }

type fakeListener struct {
	net.Listener
	conns chan net.Conn
}

func (l *fakeListener) Accept() (net.Conn, error) {
	c, ok := <-l.conns
	if !ok {
		return nil, net.ErrClosed
	}
	return c, nil
}
func (l *fakeListener) Close() error { return nil }

// TestAtk2LimitPerIPv6Rotation: one IPv6 client owns a /64 (2^64
// addresses) and takes every one of the gateway's 1024 connections, one
// per address: the per-address bound does not bind it.
func TestAtk2LimitPerIPv6Rotation(t *testing.T) {
	fl := &fakeListener{conns: make(chan net.Conn, 200)}
	for i := range 200 {
		ip := net.ParseIP(fmt.Sprintf("2001:db8:1:2::%x", i+1))
		fl.conns <- &fakeAddrConn{addr: &net.TCPAddr{IP: ip, Port: 4000}}
	}
	close(fl.conns)
	l := LimitPerIP(fl, 32)
	n := 0
	for {
		if _, err := l.Accept(); err != nil {
			break
		}
		n++
	}
	if n > 32 {
		t.Errorf("one /64 held %d connections (bound 32 per client)", n)
	}
}

// TestHolds2LimitPerIPMapShrinks: many distinct addresses, each closed,
// leave nothing in the map.
func TestHolds2LimitPerIPMapShrinks(t *testing.T) {
	fl := &fakeListener{conns: make(chan net.Conn, 5000)}
	for i := range 5000 {
		fl.conns <- &fakeAddrConn{addr: &net.TCPAddr{IP: net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)), Port: 1}}
	}
	close(fl.conns)
	l := LimitPerIP(fl, 2).(*perIP)
	for {
		c, err := l.Accept()
		if err != nil {
			break
		}
		_ = c.Close()
		_ = c.Close() // twice: released once
	}
	if len(l.open) != 0 {
		t.Fatalf("%d addresses left in the map", len(l.open))
	}
}

// ---- singleflight ----

func hangingBackend(release <-chan struct{}, calls *atomic.Int32) *KubeBackend {
	cs := fake.NewClientset()
	cs.PrependReactor("get", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		calls.Add(1)
		<-release
		return true, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: "web"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, nil
	})
	return &KubeBackend{cs: cs, seen: map[string]seenEndpoints{}}
}

// TestHolds2SingleflightCancelledFirstCaller: the first caller's
// cancelled context does not end (or poison) the shared read: the next
// caller gets its answer without a second read.
func TestHolds2SingleflightCancelledFirstCaller(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int32
	b := hangingBackend(release, &calls)
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { _, err := b.Endpoints(ctx, "web", "shop", 80); first <- err }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	close(release)
	// The first caller stops waiting when its context ends (see
	// TestAtk2SingleflightIgnoresWaiterContext), or had the answer.
	err := <-first
	var none *NoEndpoints
	if !errors.As(err, &none) && !errors.Is(err, context.Canceled) {
		t.Fatalf("first caller: %v, want its context's end or the read's own answer (NoEndpoints)", err)
	}
	_, err2 := b.Endpoints(context.Background(), "web", "shop", 80)
	if !errors.As(err2, &none) || calls.Load() != 1 {
		t.Fatalf("second: %v, %d reads", err2, calls.Load())
	}
}

// TestAtk2SingleflightIgnoresWaiterContext: the tenant's API server
// hangs; a waiting request whose client went away (its context ended)
// stays blocked in the single flight until the read ends (bounded only by
// the rest config's Timeout, 10 s per call in the agent, two calls): the
// goroutines of every request of that Service pile up meanwhile.
func TestAtk2SingleflightIgnoresWaiterContext(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var calls atomic.Int32
	b := hangingBackend(release, &calls)
	go func() { _, _ = b.Endpoints(context.Background(), "web", "shop", 80) }()
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	go func() { _, _ = b.Endpoints(ctx, "web", "shop", 80); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Error("a waiter whose context ended stays blocked in the single flight")
	}
}
