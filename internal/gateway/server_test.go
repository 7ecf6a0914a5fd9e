package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// localBackend is a tenant whose pods are ports of this host.
type localBackend struct {
	eps map[string][]Endpoint // "ns/name:port" → endpoints
}

func (b *localBackend) Endpoints(_ context.Context, ns, name string, port int32) ([]Endpoint, error) {
	eps := b.eps[fmt.Sprintf("%s/%s:%d", ns, name, port)]
	if len(eps) == 0 {
		return nil, &NoEndpoints{ReasonNoReadyEndpoint, "service " + ns + "/" + name + " has no ready endpoint"}
	}
	return eps, nil
}

func (b *localBackend) DialPod(ctx context.Context, _, _ string, port int32) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", "127.0.0.1:"+strconv.Itoa(int(port)))
}

// app is the tenant's HTTP server; it echoes a websocket-style upgrade.
func app(t *testing.T) int32 {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "echo" {
			c, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
			_ = rw.Flush()
			line, _ := rw.ReadString('\n')
			_, _ = rw.WriteString("echo: " + line)
			_ = rw.Flush()
			return
		}
		w.Header().Set(ReasonHeader, "forged by the tenant")
		fmt.Fprintf(w, "app %s %s xff=%s", r.Host, r.URL.Path, r.Header.Get("X-Forwarded-For"))
	}))
	t.Cleanup(s.Close)
	p, _ := strconv.Atoi(s.URL[strings.LastIndex(s.URL, ":")+1:])
	return int32(p)
}

func gateway(t *testing.T) (*Routes, *localBackend, *httptest.Server) {
	t.Helper()
	routes := &Routes{}
	b := &localBackend{eps: map[string][]Endpoint{}}
	srv := &Server{Routes: routes, Tenant: func(_ context.Context, tenant string) (Backend, error) {
		if tenant == "gone" {
			return nil, errors.New("no such tenant")
		}
		return b, nil
	}}
	ts := httptest.NewUnstartedServer(srv)
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
	})
	return routes, b, ts
}

// call makes a request for host through the gateway.
func call(t *testing.T, ts *httptest.Server, host, path string, h2 bool) (*http.Response, string) {
	t.Helper()
	tr := ts.Client().Transport.(*http.Transport).Clone()
	tr.TLSClientConfig.ServerName = host
	tr.ForceAttemptHTTP2 = h2
	if !h2 {
		tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	}
	tr.TLSClientConfig.InsecureSkipVerify = true //nolint:gosec // httptest's certificate names no test host
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	req, _ := http.NewRequest(http.MethodGet, ts.URL+path, nil)
	req.Host = host
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestServer(t *testing.T) {
	routes, b, ts := gateway(t)
	port := app(t)
	routes.Set("vm-a", []Route{{Hostname: "Shop.Example.test", DID: "did:plc:alice", Namespace: "web", Service: "shop", Port: 80}})
	b.eps["web/shop:80"] = []Endpoint{{Namespace: "web", Pod: "shop-1", Port: port}}

	// Forwarded to the pod, with the Host kept and X-Forwarded-For set,
	// over HTTP/1.1 and HTTP/2; a tenant cannot forge the gateway's
	// reason header.
	for _, h2 := range []bool{false, true} {
		resp, body := call(t, ts, "shop.example.test", "/cart", h2)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(body, "app shop.example.test /cart xff=127.0.0.1") {
			t.Fatalf("h2=%v: %d %q", h2, resp.StatusCode, body)
		}
		if want := map[bool]int{false: 1, true: 2}[h2]; resp.ProtoMajor != want {
			t.Fatalf("answered over %s, want HTTP/%d", resp.Proto, want)
		}
		if resp.Header.Get(ReasonHeader) != "" {
			t.Fatal("the tenant's answer carries the gateway's reason header")
		}
	}

	// The hostname can be the requester's handle.
	if resp, body := call(t, ts, "shop.example.test", "/.well-known/atproto-did", false); resp.StatusCode != http.StatusOK || body != "did:plc:alice" {
		t.Fatalf("atproto-did: %d %q", resp.StatusCode, body)
	}

	// No route, no ready endpoint, a pod that does not answer, a tenant
	// not reached: the gateway's own answers, with their reasons.
	routes.Set("vm-b", []Route{
		{Hostname: "empty.example.test", Namespace: "web", Service: "none", Port: 80},
		{Hostname: "dead.example.test", Namespace: "web", Service: "dead", Port: 80},
	})
	routes.Set("gone", []Route{{Hostname: "gone.example.test", Namespace: "web", Service: "shop", Port: 80}})
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := int32(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
	b.eps["web/dead:80"] = []Endpoint{{Namespace: "web", Pod: "dead-1", Port: closed}}
	for host, want := range map[string]struct {
		code   int
		reason string
	}{
		"nobody.example.test": {http.StatusNotFound, ReasonNoRoute},
		"empty.example.test":  {http.StatusServiceUnavailable, ReasonNoReadyEndpoint},
		"dead.example.test":   {http.StatusBadGateway, ReasonUpstreamFailed},
		"gone.example.test":   {http.StatusServiceUnavailable, ReasonTenantUnreachable},
	} {
		resp, body := call(t, ts, host, "/", false)
		if resp.StatusCode != want.code || resp.Header.Get(ReasonHeader) != want.reason {
			t.Errorf("%s: %d %s %q, want %d %s", host, resp.StatusCode, resp.Header.Get(ReasonHeader), body, want.code, want.reason)
		}
	}

	// The tenant's routes go: 404.
	routes.Set("vm-a", nil)
	if resp, _ := call(t, ts, "shop.example.test", "/", false); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a removed route answers %d", resp.StatusCode)
	}
}

func TestServerMisdirected(t *testing.T) {
	routes, b, ts := gateway(t)
	port := app(t)
	routes.Set("vm-a", []Route{{Hostname: "shop.example.test", Namespace: "web", Service: "shop", Port: 80}})
	b.eps["web/shop:80"] = []Endpoint{{Namespace: "web", Pod: "shop-1", Port: port}}
	// A connection made (SNI) for one host asks for another.
	tr := ts.Client().Transport.(*http.Transport).Clone()
	tr.TLSClientConfig.ServerName = "other.example.test"
	tr.TLSClientConfig.InsecureSkipVerify = true //nolint:gosec // httptest's certificate names no test host
	req, _ := http.NewRequest(http.MethodGet, ts.URL+"/", nil)
	req.Host = "shop.example.test"
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("SNI for another host: %d, want 421", resp.StatusCode)
	}
}

func TestServerUpgrade(t *testing.T) {
	routes, b, ts := gateway(t)
	port := app(t)
	routes.Set("vm-a", []Route{{Hostname: "ws.example.test", Namespace: "web", Service: "ws", Port: 80}})
	b.eps["web/ws:80"] = []Endpoint{{Namespace: "web", Pod: "ws-1", Port: port}}
	// An upgraded connection (websockets) goes through both ways.
	c, err := tls.Dial("tcp", ts.Listener.Addr().String(), &tls.Config{ServerName: "ws.example.test", InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}) //nolint:gosec // httptest's certificate
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: ws.example.test\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	fmt.Fprintf(c, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo: ping\n" {
		t.Fatalf("through the upgraded connection: %q %v", line, err)
	}
}

// TestRoutesHolders: a served hostname stays with its holder whatever
// claims come later; when the holder lets it go, the lowest rank takes
// it after HolderGrace; holders survive a restart, and a restored holder
// keeps its hostname (unserved) until its tenant is set again, or for
// HolderGrace.
func TestRoutesHolders(t *testing.T) {
	var saved map[string]string
	now := time.Now()
	r := Routes{Saved: func(h map[string]string) { saved = h }, Now: func() time.Time { return now }}
	r.Set("vm-new", []Route{{Hostname: "a.example.test", DID: "did:plc:bob", Rank: 20}})
	r.Set("vm-old", []Route{{Hostname: "a.example.test", DID: "did:plc:alice", Rank: 10}})
	r.Set("vm-mid", []Route{{Hostname: "A.example.test", DID: "did:plc:carol", Rank: 15}})
	if got, _ := r.Get("A.example.test"); got.DID != "did:plc:bob" {
		t.Fatalf("a later claim took a served hostname: %+v", got)
	}
	if saved["a.example.test"] != "vm-new" {
		t.Fatalf("saved holders %v", saved)
	}
	r.Set("vm-new", nil)
	if got, ok := r.Get("a.example.test"); ok {
		t.Fatalf("the holder let go a moment ago, and %+v took it", got)
	}
	now = now.Add(HolderGrace)
	if got, _ := r.Get("a.example.test"); got.DID != "did:plc:alice" {
		t.Fatalf("after the holder left (and its grace), the lowest rank: %+v", got)
	}

	// A restart: vm-old held it; vm-mid is set first, and waits.
	r2 := Routes{Now: func() time.Time { return now }}
	r2.Restore(saved)
	r2.Restore(map[string]string{"a.example.test": "vm-old"})
	r2.Set("vm-mid", []Route{{Hostname: "a.example.test", DID: "did:plc:carol", Rank: 15}})
	if got, ok := r2.Get("a.example.test"); ok {
		t.Fatalf("a restored holder's hostname went to another tenant: %+v", got)
	}
	r2.Set("vm-old", []Route{{Hostname: "a.example.test", DID: "did:plc:alice", Rank: 10}})
	if got, _ := r2.Get("a.example.test"); got.DID != "did:plc:alice" {
		t.Fatalf("the restored holder: %+v", got)
	}
	r2.Set("vm-old", nil)
	now = now.Add(HolderGrace)
	if got, _ := r2.Get("a.example.test"); got.DID != "did:plc:carol" {
		t.Fatalf("the remaining claim: %+v", got)
	}
	r2.Set("vm-mid", nil)
	if _, ok := r2.Get("a.example.test"); ok {
		t.Fatal("a route without claims")
	}
}
