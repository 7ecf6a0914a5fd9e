package pds_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/pds/pdstest"
)

// fakePLC is a PLC directory on loopback serving one DID document, which a
// test may change, or an endless body.
type fakePLC struct {
	srv *httptest.Server

	mu       sync.Mutex
	doc      map[string]any // nil: 404
	endless  bool
	requests int
}

func newFakePLC(t *testing.T) *fakePLC {
	t.Helper()
	p := &fakePLC{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		doc, endless := p.doc, p.endless
		p.requests++
		p.mu.Unlock()
		switch {
		case endless:
			_, _ = w.Write([]byte(`{"id":"` + pdstest.DID + `","alsoKnownAs":["`))
			chunk := []byte(strings.Repeat("a", 64<<10))
			for range 4096 { // 256 MiB
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		case doc == nil || r.URL.Path != "/"+pdstest.DID:
			http.NotFound(w, r)
		default:
			_ = json.NewEncoder(w).Encode(doc)
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// set serves the account's document naming pdsURL and handle.
func (p *fakePLC) set(pdsURL, handle string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.doc = map[string]any{
		"id":          pdstest.DID,
		"alsoKnownAs": []string{"at://" + handle},
		"service":     []map[string]string{{"id": "#atproto_pds", "type": "AtprotoPersonalDataServer", "serviceEndpoint": pdsURL}},
	}
}

func (p *fakePLC) connect(ctx context.Context, f *pdstest.PDS, store pds.SessionStore) (*pds.Client, error) {
	return pds.Connect(ctx, f.URL(), pdstest.Handle, pdstest.Password, pds.Options{
		Policy: local, Store: store, Directory: pds.NewDirectory(p.srv.URL, local, 5*time.Second, time.Hour),
	})
}

// R20: the DID a PDS answers a login with counts only when its DID
// document, resolved through the PLC directory, names that PDS and the
// session's handle. The reference PDS's documents name it
// http://localhost:<port> while repos reach it at 127.0.0.1.
func TestConnectChecksTheDIDDocument(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	for _, tc := range []struct {
		name     string
		set      func(p *fakePLC)
		mismatch bool
	}{
		{"honest", func(p *fakePLC) { p.set(f.URL(), pdstest.Handle) }, false},
		{"localhost names the loopback PDS", func(p *fakePLC) {
			p.set(strings.Replace(f.URL(), "127.0.0.1", "localhost", 1), "ALICE.test")
		}, false},
		{"another PDS", func(p *fakePLC) { p.set("https://pds.elsewhere.example", pdstest.Handle) }, true},
		// Issue 29: another PDS on the same machine (a loopback one in a
		// dev or e2e set-up) claims an account of the PDS on another port.
		{"another port of the loopback host", func(p *fakePLC) { p.set(otherPort(t, f.URL(), "localhost"), pdstest.Handle) }, true},
		{"another port of the same address", func(p *fakePLC) { p.set(otherPort(t, f.URL(), "127.0.0.1"), pdstest.Handle) }, true},
		{"another handle", func(p *fakePLC) { p.set(f.URL(), "bob.test") }, true},
		{"no document", func(*fakePLC) {}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newFakePLC(t)
			tc.set(p)
			store := &pds.MemoryStore{}
			c, err := p.connect(ctx, f, store)
			if !tc.mismatch {
				if err != nil {
					t.Fatalf("Connect: %v", err)
				}
				if did, _ := c.Info(); did != pdstest.DID {
					t.Fatalf("DID %s", did)
				}
				return
			}
			if !errors.Is(err, pds.ErrDIDMismatch) || c != nil {
				t.Fatalf("Connect = %v, %v; want ErrDIDMismatch", c, err)
			}
			if strings.Contains(err.Error(), p.srv.URL) {
				t.Fatalf("the error names the PLC directory: %v", err)
			}
			// A stored session that resumes is checked too, with no new login.
			logins := f.Calls("com.atproto.server.createSession")
			if _, err := p.connect(ctx, f, store); !errors.Is(err, pds.ErrDIDMismatch) {
				t.Fatalf("resumed session: %v, want ErrDIDMismatch", err)
			}
			if n := f.Calls("com.atproto.server.createSession"); n != logins {
				t.Fatalf("%d logins, want %d", n, logins)
			}
		})
	}
}

// otherPort is u (an http://127.0.0.1:<port> URL) on host at another
// port.
func otherPort(t *testing.T, u, host string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(parsed.Port())
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s://%s:%d", parsed.Scheme, host, port%65535+1)
}

// A document that does not match is looked up again past the cache once:
// an account that moved to this PDS connects at once.
func TestConnectRereadsAMismatchedCachedDocument(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	p := newFakePLC(t)
	p.set("https://pds.elsewhere.example", pdstest.Handle)
	dir := pds.NewDirectory(p.srv.URL, local, 5*time.Second, time.Hour)
	opts := pds.Options{Policy: local, Store: &pds.MemoryStore{}, Directory: dir}
	if _, err := pds.Connect(ctx, f.URL(), pdstest.Handle, pdstest.Password, opts); !errors.Is(err, pds.ErrDIDMismatch) {
		t.Fatalf("Connect: %v, want ErrDIDMismatch", err)
	}
	p.set(f.URL(), pdstest.Handle)
	if _, err := pds.Connect(ctx, f.URL(), pdstest.Handle, pdstest.Password, opts); err != nil {
		t.Fatalf("Connect after the move: %v", err)
	}
}

// R21: a PLC directory answering an endless document costs MaxDIDDocument,
// not the provider's memory, and the account is ErrDIDUnresolvable
// (ErrResponseTooLarge), promptly. An unreachable directory is
// ErrDIDUnresolvable too.
func TestConnectWithHugeOrMissingDIDDocument(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := pdstest.New(t)
	p := newFakePLC(t)
	p.endless = true
	var err error
	start := time.Now()
	alloc := allocDuring(func() { _, err = p.connect(ctx, f, &pds.MemoryStore{}) })
	if !errors.Is(err, pds.ErrDIDUnresolvable) || !errors.Is(err, pds.ErrResponseTooLarge) {
		t.Fatalf("Connect: %v, want ErrDIDUnresolvable and ErrResponseTooLarge", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s", d)
	}
	if alloc > 8<<20 {
		t.Errorf("allocated %d MiB resolving a DID document limited to %d KiB", alloc>>20, pds.MaxDIDDocument>>10)
	}
	t.Logf("refused after %s, %d KiB allocated", time.Since(start).Round(time.Millisecond), alloc>>10)

	p.srv.Close()
	if _, err := p.connect(ctx, f, &pds.MemoryStore{}); !errors.Is(err, pds.ErrDIDUnresolvable) || errors.Is(err, pds.ErrDIDMismatch) {
		t.Fatalf("Connect with the PLC down: %v, want ErrDIDUnresolvable", err)
	}
}

// TestSameHost: a DID document's PDS and the PDS a repo reaches are one
// host when their names agree and so do their effective ports (the
// scheme's default when none is given). Loopback names are one name (a
// local PDS names itself localhost while repos reach 127.0.0.1), but
// never two ports of it: another port of the same machine is another
// PDS, which could otherwise pass off every account of the first
// (issue 29).
func TestSameHost(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"https://pds.example", "https://PDS.example.:443", true},
		{"https://pds.example", "https://pds.example/", true},
		{"http://pds.example", "http://pds.example:80", true},
		{"http://localhost:2583", "http://127.0.0.1:2583", true},
		{"http://localhost:2583", "https://127.0.0.1:2583", true},
		{"http://[::1]:2583", "http://127.0.0.2:2583", true},
		{"http://app.localhost", "http://localhost:80", true},
		{"https://localhost", "https://[::1]:443", true},
		{"http://localhost:2583", "http://127.0.0.1:40000", false},
		{"http://[::1]:1", "http://127.0.0.2", false},
		{"http://localhost", "https://localhost", false},
		{"https://pds.example", "https://pds.example:8443", false},
		{"https://pds.example", "http://pds.example", false},
		{"https://pds.example", "https://pds.example.evil", false},
		{"https://localhost.evil", "http://127.0.0.1", false},
		{"https://pds.example", "", false},
		{"ftp://pds.example", "https://pds.example", false},
		{"https://pds.example:0", "https://pds.example:0", false},
		{"https://pds.example:99999", "https://pds.example:99999", false},
		{"https://pds.example:x", "https://pds.example:x", false},
	} {
		if got := pds.SameHost(tc.a, tc.b); got != tc.want {
			t.Errorf("SameHost(%q, %q) = %v", tc.a, tc.b, got)
		}
		if got := pds.SameHost(tc.b, tc.a); got != tc.want {
			t.Errorf("SameHost(%q, %q) = %v", tc.b, tc.a, got)
		}
	}
}
