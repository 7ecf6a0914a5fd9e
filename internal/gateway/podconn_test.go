package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	streamhttp "k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/spdy"
)

// kubelet serves the port-forward subresource as a kubelet does behind
// the API server (k8s.io/cri-streaming's httpStreamHandler): streams come
// in pairs of one request id, the data stream is joined to the port on
// this host (the pod's "localhost"), and a port that cannot be dialled is
// reported on the error stream before both are reset.
type kubelet struct {
	*httptest.Server
	upgrades atomic.Int32
	// pair handles a pair of streams (forward when nil).
	pair  func(data, errs streamhttp.Stream)
	pairs sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newKubelet(t *testing.T) *kubelet { return kubeletWith(t, forward) }

// kubeletWith is a kubelet whose pairs of streams go to pair.
func kubeletWith(t *testing.T, pair func(data, errs streamhttp.Stream)) *kubelet {
	t.Helper()
	k := &kubelet{pair: pair}
	k.Server = httptest.NewUnstartedServer(http.HandlerFunc(k.serve))
	k.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			k.mu.Lock()
			k.conns = append(k.conns, c)
			k.mu.Unlock()
		}
	}
	k.Start()
	t.Cleanup(func() {
		k.breakAll()
		k.Close()
		k.pairs.Wait()
	})
	return k
}

func (k *kubelet) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/") || !strings.HasSuffix(r.URL.Path, "/portforward") {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if _, err := streamhttp.Handshake(r, w, []string{"portforward.k8s.io"}); err != nil {
		return
	}
	streams := make(chan streamhttp.Stream, 16)
	conn := spdy.NewResponseUpgrader().UpgradeResponse(w, r, func(s streamhttp.Stream, _ <-chan struct{}) error {
		streams <- s
		return nil
	})
	if conn == nil {
		return
	}
	defer conn.Close()
	k.upgrades.Add(1)
	pending := map[string]streamhttp.Stream{}
	for {
		select {
		case s := <-streams:
			id := s.Headers().Get(corev1.PortForwardRequestIDHeader)
			other, ok := pending[id]
			if !ok {
				pending[id] = s
				continue
			}
			delete(pending, id)
			data, errs := s, other
			if s.Headers().Get(corev1.StreamType) == corev1.StreamTypeError {
				data, errs = other, s
			}
			k.pairs.Go(func() { k.pair(data, errs) })
		case <-conn.CloseChan():
			return
		}
	}
}

// forward joins a data stream to its port, as the kubelet's portForward.
func forward(data, errs streamhttp.Stream) {
	defer data.Close()
	defer errs.Close()
	port, _ := strconv.Atoi(data.Headers().Get(corev1.PortHeader))
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		fmt.Fprintf(errs, "error forwarding port %d: %v", port, err)
		_ = data.Reset()
		_ = errs.Reset()
		return
	}
	defer c.Close()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(data, c)
		close(done)
	}()
	_, _ = io.Copy(c, data)
	_ = c.(*net.TCPConn).CloseWrite()
	<-done
}

// breakAll closes every TCP connection made to it, as an API server
// restart does.
func (k *kubelet) breakAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range k.conns {
		_ = c.Close()
	}
	k.conns = nil
}

// backend is an HTTP server on a free port of this host: the pod's app.
func backend(t *testing.T) int32 {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", r.URL.Path)
	}))
	t.Cleanup(s.Close)
	_, p, _ := net.SplitHostPort(s.Listener.Addr().String())
	n, _ := strconv.Atoi(p)
	return int32(n)
}

// through is an HTTP client whose every connection is DialPod of pod.
func through(d *PodDialer, pod string, port int32) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialPod(ctx, "shop", pod, port) },
	}}
}

func get(t *testing.T, hc *http.Client, path string) (string, error) {
	t.Helper()
	resp, err := hc.Get("http://pod" + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestDialPod(t *testing.T) {
	k := newKubelet(t)
	port := backend(t)
	d, err := NewPodDialer(&rest.Config{Host: k.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	// Requests reach the pod's port; new connections share the pod's
	// one upgraded connection.
	for i := range 3 {
		hc := through(d, "web-0", port)
		got, err := get(t, hc, fmt.Sprintf("/%d", i))
		if err != nil || got != fmt.Sprintf("hello from /%d", i) {
			t.Fatalf("request %d: %q, %v", i, got, err)
		}
		hc.CloseIdleConnections()
	}
	if n := k.upgrades.Load(); n != 1 {
		t.Fatalf("%d upgrades for one pod, want 1", n)
	}

	// Another pod has a connection of its own.
	if _, err := get(t, through(d, "web-1", port), "/"); err != nil {
		t.Fatal(err)
	}
	if n := k.upgrades.Load(); n != 2 {
		t.Fatalf("%d upgrades for two pods, want 2", n)
	}

	// The API server goes away and comes back: the next dial upgrades
	// again instead of failing on the broken connection.
	k.breakAll()
	hc := through(d, "web-0", port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := get(t, hc, "/again")
		if err == nil && got == "hello from /again" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the break: %q, %v", got, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Closed, its goroutines (upgrades, stream readers) end and are
	// joined (R10); it dials no more.
	hc.CloseIdleConnections()
	_ = d.Close()
	joined := make(chan struct{})
	go func() {
		d.Wait()
		close(joined)
	}()
	select {
	case <-joined:
	case <-time.After(10 * time.Second):
		t.Fatal("the dialer's goroutines were not joined after Close")
	}
	if _, err := d.DialPod(t.Context(), "shop", "web-0", port); err == nil {
		t.Fatal("a closed dialer dialled")
	}
}

func TestDialPodClosedPort(t *testing.T) {
	k := newKubelet(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := int32(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
	d, err := NewPodDialer(&rest.Config{Host: k.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// The streams open; the first read says the port was not reached, in
	// the kubelet's words (bounded).
	c, err := d.DialPod(t.Context(), "shop", "web-0", closed)
	if err != nil {
		// The kubelet reset the streams before the dial had both.
		return
	}
	defer c.Close()
	_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: pod\r\n\r\n"))
	_, err = c.Read(make([]byte, 64))
	if err == nil || errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "the pod's port") {
		t.Fatalf("read from a closed port: %v, want the pod's error", err)
	}
}

func TestDialPodRefused(t *testing.T) {
	// An API server that does not upgrade (403, 404): the dial fails and
	// no connection is kept.
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "forbidden", http.StatusForbidden)
	}))
	defer s.Close()
	d, err := NewPodDialer(&rest.Config{Host: s.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.DialPod(t.Context(), "shop", "web-0", 80); err == nil {
		t.Fatal("a refused upgrade dialled")
	}
	if len(d.links) != 0 {
		t.Fatalf("%d connections kept after a refusal", len(d.links))
	}
	// A redirect is not followed (R18).
	var hops atomic.Int32
	r := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		hops.Add(1)
		http.Redirect(w, req, "/elsewhere", http.StatusTemporaryRedirect)
	}))
	defer r.Close()
	d, _ = NewPodDialer(&rest.Config{Host: r.URL, Timeout: 5 * time.Second})
	if _, err := d.DialPod(t.Context(), "shop", "web-0", 80); err == nil {
		t.Fatal("a redirect dialled")
	}
	if n := hops.Load(); n != 1 {
		t.Fatalf("%d requests: a redirect was followed", n)
	}
}

func TestDialPodContext(t *testing.T) {
	// An API server that never answers: the dial ends with its context.
	block := make(chan struct{})
	s := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-block }))
	defer s.Close()
	defer close(block)
	d, err := NewPodDialer(&rest.Config{Host: s.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := d.DialPod(ctx, "shop", "web-0", 80); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial: %v, want the context's end", err)
	}
}
