package gateway

// Adversarial tests of the gateway's data path, from a review: TestAtk*
// are attacks that found a hole (fixed since; they guard it), TestHolds*
// show a defence that held.

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	streamhttp "k8s.io/streaming/pkg/httpstream"
)

// atkGateway is a TLS (h1 + h2) gateway whose every tenant is b.
func atkGateway(t *testing.T, b Backend) (*Routes, *httptest.Server) {
	t.Helper()
	routes := &Routes{}
	srv := &Server{Routes: routes, Tenant: func(context.Context, string) (Backend, error) { return b, nil }}
	ts := httptest.NewUnstartedServer(srv)
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
	})
	return routes, ts
}

// podPort is the port of an httptest server standing for a pod's app.
func podPort(t *testing.T, h http.HandlerFunc) (int32, *httptest.Server) {
	t.Helper()
	s := httptest.NewServer(h)
	p, _ := strconv.Atoi(s.URL[strings.LastIndex(s.URL, ":")+1:])
	return int32(p), s
}

// rawTLS sends one raw HTTP/1.1 request on a TLS connection with the
// given SNI ("" sends none) and returns the response.
func rawTLS(t *testing.T, ts *httptest.Server, sni, request string) (*http.Response, string) {
	t.Helper()
	c, err := tls.Dial("tcp", ts.Listener.Addr().String(), &tls.Config{ServerName: sni, InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}) //nolint:gosec // test certificate
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: strings.Fields(request)[0]})
	if err != nil {
		t.Fatalf("%q: %v", request, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestAtkTenantForgesReasonHeader: the tenant's pod sends the gateway's
// reason header in a 1xx answer and in a trailer. ModifyResponse strips it
// from the final header only; ReverseProxy copies 1xx headers (its
// Got1xxResponse trace) and trailers straight to the client, so a tenant
// can make its answers look like the gateway's own (e.g. NoRoute).
func TestAtkTenantForgesReasonHeader(t *testing.T) {
	port, pod := podPort(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set(ReasonHeader, "NoRoute")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del(ReasonHeader)
		w.Header().Set("Trailer", ReasonHeader)
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "tenant")
		w.Header().Set(ReasonHeader, "NoRoute")
	})
	defer pod.Close()
	routes, ts := atkGateway(t, &localBackend{eps: map[string][]Endpoint{"web/shop:80": {{Namespace: "web", Pod: "p", Port: port}}}})
	routes.Set("vm-a", []Route{{Hostname: "shop.gw.test", Namespace: "web", Service: "shop", Port: 80}})
	for _, h2 := range []bool{false, true} {
		tr := ts.Client().Transport.(*http.Transport).Clone()
		tr.TLSClientConfig.ServerName = "shop.gw.test"
		tr.TLSClientConfig.InsecureSkipVerify = true //nolint:gosec // test certificate
		tr.ForceAttemptHTTP2 = h2
		if !h2 {
			tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
		}
		var in1xx atomic.Value
		ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
			if v := h.Get(ReasonHeader); v != "" {
				in1xx.Store(v)
			}
			return nil
		}})
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/", nil)
		req.Host = "shop.gw.test"
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.Header.Get(ReasonHeader) != "" {
			t.Errorf("h2=%v: forged in the header", h2)
		}
		if v := resp.Trailer.Get(ReasonHeader); v != "" {
			t.Errorf("h2=%v: the tenant's trailer %s: %s reaches the client", h2, ReasonHeader, v)
		}
		if v := in1xx.Load(); v != nil {
			t.Errorf("h2=%v: the tenant's 1xx %s: %s reaches the client", h2, ReasonHeader, v)
		}
	}
}

// TestAtkRefusalRevealsServiceConfig (R17): the gateway's 503 body tells
// any internet client the tenant's namespace and Service names the
// requester configured ("service internal-billing/admin-api does not
// exist in the tenant").
func TestAtkRefusalRevealsServiceConfig(t *testing.T) {
	b := &KubeBackend{cs: fake.NewClientset(), seen: map[string]seenEndpoints{}}
	routes, ts := atkGateway(t, b)
	routes.Set("vm-a", []Route{{Hostname: "shop.gw.test", Namespace: "internal-billing", Service: "admin-api", Port: 8443}})
	resp, body := rawTLS(t, ts, "shop.gw.test", "GET / HTTP/1.1\r\nHost: shop.gw.test\r\nConnection: close\r\n\r\n")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(ReasonHeader) != ReasonServiceNotFound {
		t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get(ReasonHeader))
	}
	for _, secret := range []string{"internal-billing", "admin-api", "8443"} {
		if strings.Contains(body, secret) {
			t.Errorf("the public refusal reveals %q: %q", secret, body)
		}
	}
}

// countingBackend dials 127.0.0.1:port and counts the upstream
// connections open at once.
type countingBackend struct {
	localBackend
	open, peak atomic.Int32
}

type atkCountedConn struct {
	net.Conn
	b    *countingBackend
	once sync.Once
}

func (c *atkCountedConn) Close() error {
	c.once.Do(func() { c.b.open.Add(-1) })
	return c.Conn.Close()
}

func (b *countingBackend) DialPod(ctx context.Context, ns, pod string, port int32) (net.Conn, error) {
	c, err := b.localBackend.DialPod(ctx, ns, pod, port)
	if err != nil {
		return nil, err
	}
	n := b.open.Add(1)
	for {
		p := b.peak.Load()
		if n <= p || b.peak.CompareAndSwap(p, n) {
			break
		}
	}
	return &atkCountedConn{Conn: c, b: b}, nil
}

// TestAtkOneConnectionManyUpstreams: one client TCP connection (one slot
// of the agent's 1024-connection listener limit) multiplexes HTTP/2
// streams (250 by default), and every stream to a slow pod is its own
// upstream connection (a port-forward stream pair and its goroutines):
// nothing bounds the upstream connections per pod, per tenant or per
// client. 1024 connections x 250 streams = 256k upstreams.
func TestAtkOneConnectionManyUpstreams(t *testing.T) {
	const streams, bound = 200, 64
	release := make(chan struct{})
	var releaseOnce sync.Once
	port, pod := podPort(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	b := &countingBackend{localBackend: localBackend{eps: map[string][]Endpoint{"web/shop:80": {{Namespace: "web", Pod: "p", Port: port}}}}}
	routes, ts := atkGateway(t, b)
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }); pod.Close() })
	routes.Set("vm-a", []Route{{Hostname: "shop.gw.test", Namespace: "web", Service: "shop", Port: 80}})
	tr := ts.Client().Transport.(*http.Transport).Clone()
	tr.TLSClientConfig.ServerName = "shop.gw.test"
	tr.TLSClientConfig.InsecureSkipVerify = true //nolint:gosec // test certificate
	tr.ForceAttemptHTTP2 = true
	tr.MaxConnsPerHost = 1 // one client connection
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	// One request first, so that the others share its HTTP/2 connection.
	req, _ := http.NewRequest(http.MethodGet, ts.URL+"/.well-known/atproto-did", nil)
	req.Host = "shop.gw.test"
	if resp, err := hc.Do(req); err == nil {
		resp.Body.Close()
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range streams {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/slow", nil)
			req.Host = "shop.gw.test"
			if resp, err := hc.Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	deadline := time.Now().Add(3 * time.Second)
	for b.peak.Load() < streams && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	peak := b.peak.Load()
	releaseOnce.Do(func() { close(release) })
	cancel()
	wg.Wait()
	tr.CloseIdleConnections()
	if peak > bound {
		t.Errorf("one client connection held %d upstream connections to one pod at once (bound %d)", peak, bound)
	}
}

// fakeConn is an upgraded connection that opens streams that do nothing.
type fakeConn struct{ closed chan bool }

func (c *fakeConn) CreateStream(h http.Header) (streamhttp.Stream, error) {
	return &fakeStream{h: h}, nil
}
func (c *fakeConn) Close() error                       { return nil }
func (c *fakeConn) CloseChan() <-chan bool             { return c.closed }
func (c *fakeConn) SetIdleTimeout(time.Duration)       {}
func (c *fakeConn) RemoveStreams(...streamhttp.Stream) {}

type fakeStream struct{ h http.Header }

func (s *fakeStream) Read([]byte) (int, error)    { return 0, io.EOF }
func (s *fakeStream) Write(p []byte) (int, error) { return len(p), nil }
func (s *fakeStream) Close() error                { return nil }
func (s *fakeStream) Reset() error                { return nil }
func (s *fakeStream) Headers() http.Header        { return s.h }
func (s *fakeStream) Identifier() uint32          { return 0 }

// TestAtkPodLinksUnbounded: the pods dialled are the names in the tenant's
// EndpointSlices (targetRef.name, up to 16 slices x 1000 endpoints per
// Service, 64 Services per requester), and PodDialer keeps one upgraded
// connection (a TCP connection and ~13 spdystream goroutines) per name
// for 2 minutes, without a bound per tenant.
func TestAtkPodLinksUnbounded(t *testing.T) {
	d, err := NewPodDialer(&rest.Config{Host: "https://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	var upgrades atomic.Int32
	d.upgrade = func(string) (streamhttp.Connection, error) {
		upgrades.Add(1)
		return &fakeConn{closed: make(chan bool)}, nil
	}
	const pods, bound = 3000, 256
	for i := range pods {
		c, err := d.DialPod(t.Context(), "web", fmt.Sprintf("fake-%d", i), 80)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
	}
	d.mu.Lock()
	n := len(d.links)
	d.mu.Unlock()
	if n > bound {
		t.Errorf("%d pod connections kept for one tenant (%d upgrades), bound %d", n, upgrades.Load(), bound)
	}
}

// hostileKubelet serves the port-forward subresource and hands each pair
// of streams (data, error) to pair.
func hostileKubelet(t *testing.T, pair func(data, errs streamhttp.Stream)) *httptest.Server {
	t.Helper()
	return kubeletWith(t, pair).Server
}

// stacksWith counts the goroutines whose stack contains fn.
func stacksWith(fn string) int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			n++
		}
	}
	return n
}

// TestAtkErrorStreamReaderLeak: podConn.Close resets the data stream but
// only forgets the error stream; the goroutine reading the error stream
// waits until the kubelet closes it. A hostile kubelet (the tenant's)
// never does, so every connection ever made to its pods leaves a
// goroutine and a spdystream stream behind for as long as the pod's link
// is kept busy.
func TestAtkErrorStreamReaderLeak(t *testing.T) {
	k := hostileKubelet(t, func(data, errs streamhttp.Stream) {
		_, _ = io.Copy(io.Discard, data) // until the gateway resets it
		// errs is never closed
	})
	d, err := NewPodDialer(&rest.Config{Host: k.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	before := stacksWith("(*podLink).open.func1")
	const conns = 30
	for range conns {
		c, err := d.DialPod(t.Context(), "web", "p", 80)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
		_ = c.Close()
	}
	time.Sleep(300 * time.Millisecond)
	if n := stacksWith("(*podLink).open.func1") - before; n > 0 {
		t.Errorf("%d of %d closed connections still have their error-stream reader", n, conns)
	}
}

// TestHoldsKubeletFloodBounded: spdystream has no flow control (a data
// frame is up to 16 MiB, and frames of a stream nobody reads are queued).
// A hostile kubelet (or API server) pushing into a connection whose
// client reads nothing: the connection always reads its stream into a
// buffer of at most maxBuffered bytes, and is reset once its reader is
// that far behind; what the kubelet goes on sending after the reset is
// dropped by spdystream, not kept.
func TestHoldsKubeletFloodBounded(t *testing.T) {
	const frame = 1<<24 - 1
	const frames = 10
	chunk := make([]byte, frame)
	k := hostileKubelet(t, func(data, errs streamhttp.Stream) {
		defer errs.Close()
		for range frames {
			if _, err := data.Write(chunk); err != nil {
				return
			}
		}
	})
	d, err := NewPodDialer(&rest.Config{Host: k.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := d.DialPod(t.Context(), "web", "p", 80)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc := c.(*podConn)
	deadline := time.Now().Add(8 * time.Second)
	for {
		pc.bmu.Lock()
		held, end := pc.buf.Len(), pc.end
		pc.bmu.Unlock()
		if held > maxBuffered {
			t.Fatalf("%d bytes held for a reader that reads nothing, bound %d", held, maxBuffered)
		}
		if end != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the flooded connection was not reset")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// What was held is read, then the reset.
	if n, err := io.Copy(io.Discard, c); err == nil || n > maxBuffered {
		t.Fatalf("a flooded connection read %d bytes, then %v", n, err)
	}
}

// countingWriter counts what a hostile server managed to send.
func sendUpTo(w io.Writer, n int, sent *atomic.Int64) {
	chunk := []byte(strings.Repeat("a", 1<<20))
	for i := 0; i < n; i++ {
		m, err := w.Write(chunk)
		sent.Add(int64(m))
		if err != nil {
			return
		}
	}
}

// TestHoldsUpgradeRefusalBounded (R21): the tenant's API server refuses
// the port-forward upgrade with an endless body. What the agent keeps of
// it is bounded (maxAnswer); net/http discards the rest while it closes
// the answer, within the dialer's timeout.
func TestHoldsUpgradeRefusalBounded(t *testing.T) {
	var sent atomic.Int64
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		sendUpTo(w, 64, &sent)
	}))
	defer s.Close()
	d, err := NewPodDialer(&rest.Config{Host: s.URL, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.DialPod(t.Context(), "web", "p", 80)
	if err == nil {
		t.Fatal("a refused upgrade dialled")
	}
	if len(err.Error()) > 4096 {
		t.Errorf("the refusal's error text is %d bytes", len(err.Error()))
	}
}

// hostileAPI is a tenant API server whose Service shop in web carries
// extra bytes of annotation and whose EndpointSlice list has slices
// items, whatever limit the client asks for.
func hostileAPI(t *testing.T, extraMiB, slices int, sent *atomic.Int64) kubernetes.Interface {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/namespaces/web/services/shop":
			_, _ = io.WriteString(w, `{"kind":"Service","apiVersion":"v1","metadata":{"name":"shop","namespace":"web","annotations":{"x":"`)
			sendUpTo(w, extraMiB, sent)
			_, _ = io.WriteString(w, `"}},"spec":{"ports":[{"port":80,"protocol":"TCP"}]}}`)
		case "/apis/discovery.k8s.io/v1/namespaces/web/endpointslices":
			items := make([]string, slices)
			for i := range items {
				items[i] = fmt.Sprintf(`{"metadata":{"name":"s%d","namespace":"web"},"addressType":"IPv4","ports":[{"port":8080}],`+
					`"endpoints":[{"addresses":["10.0.0.1"],"targetRef":{"kind":"Pod","name":"pod-%d"}}]}`, i, i)
			}
			fmt.Fprintf(w, `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{},"items":[%s]}`, strings.Join(items, ","))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(s.Close)
	// The client the agent reads a tenant with: its answers bounded.
	b, err := NewKubeBackend(&rest.Config{Host: s.URL, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return b.cs
}

// TestHoldsTenantAPIAnswerBounded (R21): a Service of 64 MiB from the
// tenant's API server is refused as too large, not decoded.
func TestHoldsTenantAPIAnswerBounded(t *testing.T) {
	var sent atomic.Int64
	cs := hostileAPI(t, 64, 1, &sent)
	if eps, err := ReadyEndpoints(t.Context(), cs, "web", "shop", 80); err == nil {
		t.Errorf("a 64 MiB Service was read: %d endpoints", len(eps))
	}
}

// TestHoldsEndpointSliceLimit (R21): maxSlices is only asked of the
// tenant's API server (ListOptions.Limit); a hostile one answers more
// items, and only maxSlices are used.
func TestHoldsEndpointSliceLimit(t *testing.T) {
	var sent atomic.Int64
	cs := hostileAPI(t, 0, 500, &sent)
	eps, err := ReadyEndpoints(t.Context(), cs, "web", "shop", 80)
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) > maxSlices {
		t.Errorf("%d endpoints from %d slices used, maxSlices is %d", len(eps), len(eps), maxSlices)
	}
}

// TestHoldsHostForms: Host and SNI oddities reach the route only when
// they name it; nothing else is forwarded.
func TestHoldsHostForms(t *testing.T) {
	port, pod := podPort(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "pod host=%s", r.Host)
	})
	defer pod.Close()
	routes, ts := atkGateway(t, &localBackend{eps: map[string][]Endpoint{"web/shop:80": {{Namespace: "web", Pod: "p", Port: port}}}})
	routes.Set("vm-a", []Route{{Hostname: "shop.gw.test", DID: "did:plc:alice", Namespace: "web", Service: "shop", Port: 80}})
	for _, tc := range []struct {
		sni, req string
		code     int
	}{
		{"shop.gw.test", "GET / HTTP/1.1\r\nHost: shop.gw.test:8443\r\n\r\n", 200},
		{"shop.gw.test", "GET / HTTP/1.1\r\nHost: SHOP.GW.TEST.\r\n\r\n", 200},
		{"SHOP.gw.test", "GET / HTTP/1.1\r\nHost: shop.gw.test\r\n\r\n", 200},
		{"", "GET / HTTP/1.1\r\nHost: shop.gw.test\r\n\r\n", 421},                                 // no SNI
		{"shop.gw.test", "GET / HTTP/1.1\r\nHost: other.gw.test\r\n\r\n", 421},                    // another host
		{"shop.gw.test", "GET / HTTP/1.1\r\nHost: [::1]:443\r\n\r\n", 421},                        // IPv6
		{"shop.gw.test", "GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n", 421},                            // IPv6, no port
		{"shop.gw.test", "GET http://other.gw.test/ HTTP/1.1\r\nHost: shop.gw.test\r\n\r\n", 421}, // absolute form
		{"shop.gw.test", "GET / HTTP/1.1\r\nHost: shop.gw.test..\r\n\r\n", 421},
		{"shop.gw.test", "GET / HTTP/1.0\r\n\r\n", 421}, // no Host at all
		{"", "GET / HTTP/1.0\r\n\r\n", 404},             // neither
		{"other.gw.test", "GET / HTTP/1.1\r\nHost: other.gw.test\r\n\r\n", 404},
	} {
		resp, body := rawTLS(t, ts, tc.sni, tc.req)
		if resp.StatusCode != tc.code {
			t.Errorf("SNI %q %q: %d %q, want %d", tc.sni, tc.req, resp.StatusCode, body, tc.code)
		}
		if tc.code != 200 && strings.HasPrefix(body, "pod") {
			t.Errorf("SNI %q %q: forwarded", tc.sni, tc.req)
		}
	}
	// Non-ASCII Host that folds to the route (Kelvin sign, long s): never
	// forwarded to another route, never a panic.
	for _, h := range []string{"\u017fhop.gw.test", "shop.gw.tes\u212a", "shop.gw.test\x00"} {
		resp, body := rawTLS(t, ts, "shop.gw.test", "GET / HTTP/1.1\r\nHost: "+h+"\r\n\r\n")
		if resp.StatusCode == 200 && !strings.Contains(body, "host=shop.gw.test") {
			t.Errorf("Host %q: %d %q", h, resp.StatusCode, body)
		}
	}
}

// TestHoldsAtprotoDIDPathVariants: the gateway, not the tenant, answers
// every spelling of /.well-known/atproto-did a resolver could send.
func TestHoldsAtprotoDIDPathVariants(t *testing.T) {
	port, pod := podPort(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "did:plc:mallory") })
	defer pod.Close()
	routes, ts := atkGateway(t, &localBackend{eps: map[string][]Endpoint{"web/shop:80": {{Namespace: "web", Pod: "p", Port: port}}}})
	routes.Set("vm-a", []Route{{Hostname: "shop.gw.test", DID: "did:plc:alice", Namespace: "web", Service: "shop", Port: 80}})
	for _, p := range []string{"/.well-known/atproto-did", "/.well-known/atproto-did?x=1", "/.well-known/%61tproto-did", "http://shop.gw.test/.well-known/atproto-did"} {
		for _, m := range []string{"GET", "HEAD"} {
			resp, body := rawTLS(t, ts, "shop.gw.test", m+" "+p+" HTTP/1.1\r\nHost: shop.gw.test\r\n\r\n")
			if resp.StatusCode != 200 || (m == "GET" && body != "did:plc:alice") {
				t.Errorf("%s %s: %d %q", m, p, resp.StatusCode, body)
			}
		}
	}
}

// TestHoldsReasonStrippedOnUpgrade: a tenant's 101 cannot carry the
// gateway's reason header either.
func TestHoldsReasonStrippedOnUpgrade(t *testing.T) {
	port, pod := podPort(t, func(w http.ResponseWriter, _ *http.Request) {
		c, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n" + ReasonHeader + ": NoRoute\r\n\r\n")
		_ = rw.Flush()
	})
	defer pod.Close()
	routes, ts := atkGateway(t, &localBackend{eps: map[string][]Endpoint{"web/shop:80": {{Namespace: "web", Pod: "p", Port: port}}}})
	routes.Set("vm-a", []Route{{Hostname: "shop.gw.test", Namespace: "web", Service: "shop", Port: 80}})
	resp, _ := rawTLS(t, ts, "shop.gw.test", "GET /ws HTTP/1.1\r\nHost: shop.gw.test\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get(ReasonHeader) != "" {
		t.Errorf("101: %d, reason %q", resp.StatusCode, resp.Header.Get(ReasonHeader))
	}
}

// TestAtkTenantHeadersUnbounded: the upstream transport sets no
// MaxResponseHeaderBytes, so http.Transport's default (10 MiB) applies:
// a tenant's answer carries ~10 MiB of headers, which the agent holds and
// sends on, per request (the gateway's own clients are held to 64 KiB).
func TestAtkTenantHeadersUnbounded(t *testing.T) {
	port, pod := podPort(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Big", strings.Repeat("a", 8<<20))
	})
	defer pod.Close()
	routes, ts := atkGateway(t, &localBackend{eps: map[string][]Endpoint{"web/shop:80": {{Namespace: "web", Pod: "p", Port: port}}}})
	routes.Set("vm-a", []Route{{Hostname: "shop.gw.test", Namespace: "web", Service: "shop", Port: 80}})
	resp, _ := rawTLS(t, ts, "shop.gw.test", "GET / HTTP/1.1\r\nHost: shop.gw.test\r\n\r\n")
	if n := len(resp.Header.Get("X-Big")); n > 1<<20 {
		t.Errorf("a tenant's %d MiB header was taken and sent on (%d)", n>>20, resp.StatusCode)
	}
}

// TestAtkTransportInflatesTenantGzip: the upstream transport keeps
// http.Transport's compression: for a client that sent no
// Accept-Encoding it asks the pod for gzip itself and inflates the answer
// in the agent. A tenant answers a 64 KiB gzip bomb and the agent spends
// CPU and the bidder's egress sending 64 MiB (1000x); the client also gets
// another body than the pod sent ("the request goes as it came").
func TestAtkTransportInflatesTenantGzip(t *testing.T) {
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	_, _ = zw.Write(make([]byte, 64<<20))
	_ = zw.Close()
	var asked atomic.Value
	port, pod := podPort(t, func(w http.ResponseWriter, r *http.Request) {
		asked.Store(r.Header.Get("Accept-Encoding"))
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			_, _ = w.Write(bomb.Bytes())
			return
		}
		_, _ = io.WriteString(w, "plain")
	})
	defer pod.Close()
	routes, ts := atkGateway(t, &localBackend{eps: map[string][]Endpoint{"web/shop:80": {{Namespace: "web", Pod: "p", Port: port}}}})
	routes.Set("vm-a", []Route{{Hostname: "shop.gw.test", Namespace: "web", Service: "shop", Port: 80}})
	c, err := tls.Dial("tcp", ts.Listener.Addr().String(), &tls.Config{ServerName: "shop.gw.test", InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}) //nolint:gosec // test certificate
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: shop.gw.test\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if v, _ := asked.Load().(string); v != "" || n > 1<<20 {
		t.Errorf("the client asked for no encoding; the pod was asked for %q and the client got %d MiB from a %d KiB answer", v, n>>20, bomb.Len()>>10)
	}
}

// TestHoldsRoutesIsolated: one tenant's Set never removes or replaces
// another's claim, and an upstream host names its tenant, so pooled
// connections are never shared between tenants.
func TestHoldsRoutesIsolated(t *testing.T) {
	var r Routes
	r.Set("vm-a", []Route{{Hostname: "a.gw.test", DID: "did:plc:alice", Rank: 1}})
	r.Set("vm-b", []Route{{Hostname: "A.GW.TEST", DID: "did:plc:bob", Rank: 2}, {Hostname: "b.gw.test", DID: "did:plc:bob", Rank: 2}})
	r.Set("vm-b", []Route{{Hostname: "b.gw.test", DID: "did:plc:bob", Rank: 2}})
	if got, _ := r.Get("a.gw.test"); got.DID != "did:plc:alice" || got.Tenant != "vm-a" {
		t.Fatalf("a.gw.test: %+v", got)
	}
	// Tenant names cannot collide in the synthetic host.
	if hexName("a.b") == hexName("a")+"."+hexName("b") || strings.Contains(hexName("x.y:z"), ".") {
		t.Fatal("tenant names collide in upstream hosts")
	}
}
