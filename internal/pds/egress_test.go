package pds_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/pds/pdstest"
)

// local allows the loopback address the test servers listen on.
var local = netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil)

// countingServer counts requests and those that carried pdstest.Password.
type countingServer struct {
	*httptest.Server
	requests, passwords atomic.Int32
}

func newCountingServer(t *testing.T, answer http.HandlerFunc) *countingServer {
	t.Helper()
	s := &countingServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.requests.Add(1)
		if strings.Contains(string(b), pdstest.Password) {
			s.passwords.Add(1)
		}
		answer(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func unauthorized(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, `{"error":"AuthenticationRequired"}`, http.StatusUnauthorized)
}

func TestCheckURL(t *testing.T) {
	for _, tc := range []struct {
		url    string
		policy *netpolicy.Policy
		want   error // nil, pds.ErrInsecureURL, or a *pds.SpecError (any)
	}{
		{"https://pds.example.com", nil, nil},
		{"https://pds.example.com/", nil, nil},
		{"https://127.0.0.1:2583", nil, nil}, // the dial policy decides about the address
		{"http://pds.example.com", nil, pds.ErrInsecureURL},
		{"HTTP://pds.example.com", local, pds.ErrInsecureURL},
		{"http://127.0.0.1:2583", nil, pds.ErrInsecureURL},
		{"http://127.0.0.2:2583", local, pds.ErrInsecureURL},
		{"http://[::1]:2583", local, pds.ErrInsecureURL},
		{"http://10.0.0.1", local, pds.ErrInsecureURL},
		{"http://127.0.0.1:2583", local, nil},
		{"http://localhost:2583", local, nil},
		{"ftp://pds.example.com", nil, &pds.SpecError{}},
		{"https://pds.example.com/xrpc", nil, &pds.SpecError{}},
	} {
		err := pds.CheckURL(tc.url, tc.policy)
		var spec *pds.SpecError
		switch want := tc.want.(type) { //nolint:errorlint // tc.want names the expected error kind; it is not an error being handled
		case nil:
			if err != nil {
				t.Errorf("CheckURL(%s) = %v, want nil", tc.url, err)
			}
		case *pds.SpecError:
			if !errors.As(err, &spec) {
				t.Errorf("CheckURL(%s) = %v, want a SpecError", tc.url, err)
			}
		default:
			if !errors.Is(err, want) {
				t.Errorf("CheckURL(%s) = %v, want %v", tc.url, err, want)
			}
			if err != nil && strings.Contains(err.Error(), "/32") {
				t.Errorf("CheckURL(%s) reveals the policy: %v", tc.url, err)
			}
		}
	}
}

// TestConnectSendsCredentialsOverHTTPOnlyToAllowedHosts: plain http to a
// host the policy does not allow gets no request even when the network
// would carry it (a client whose dialer reaches the server whatever the
// name).
func TestConnectSendsCredentialsOverHTTPOnlyToAllowedHosts(t *testing.T) {
	srv := newCountingServer(t, unauthorized)
	anywhere := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
		},
	}}
	ctx := context.Background()
	for _, host := range []string{"http://pds.example.com", "http://127.0.0.2:2583"} {
		_, err := pds.Connect(ctx, host, pdstest.Handle, pdstest.Password, pds.Options{Store: &countingStore{}, HTTPClient: anywhere, Policy: local})
		if !errors.Is(err, pds.ErrInsecureURL) {
			t.Fatalf("%s: want ErrInsecureURL, got %v", host, err)
		}
	}
	if n := srv.requests.Load(); n != 0 {
		t.Fatalf("%d requests reached the server over plain http", n)
	}
	// Control: localhost is allowed, so the same client logs in there.
	_, err := pds.Connect(ctx, "http://localhost:1", pdstest.Handle, pdstest.Password, pds.Options{Store: &countingStore{}, HTTPClient: anywhere, Policy: local})
	if !errors.Is(err, pds.ErrAuthentication) || srv.passwords.Load() != 1 {
		t.Fatalf("control: want the login to arrive, got %v and %d logins", err, srv.passwords.Load())
	}
}

// TestConnectNeverFollowsRedirects: even a caller's client that would
// follow redirects does not: a 307 from createSession is ErrRedirect and
// the target never sees the password.
func TestConnectNeverFollowsRedirects(t *testing.T) {
	target := newCountingServer(t, unauthorized)
	redirector := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	})
	for name, opts := range map[string]pds.Options{
		"default client":  {Policy: local},
		"caller's client": {Policy: local, HTTPClient: &http.Client{}},
	} {
		opts.Store = &countingStore{}
		_, err := pds.Connect(context.Background(), redirector.URL, pdstest.Handle, pdstest.Password, opts)
		if !errors.Is(err, pds.ErrRedirect) {
			t.Fatalf("%s: want ErrRedirect, got %v", name, err)
		}
		checkNoSecrets(t, err)
	}
	if n := target.requests.Load(); n != 0 {
		t.Fatalf("the redirect was followed: %d requests (%d with the password) reached the target", n, target.passwords.Load())
	}
}

// TestConnectDialRefusedByPolicy: the default client dials only addresses
// the policy allows; a refusal matches netpolicy.ErrDenied, not
// ErrUnreachable.
func TestConnectDialRefusedByPolicy(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	for name, policy := range map[string]*netpolicy.Policy{
		"public only":      nil,
		"reserved address": netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, []netip.AddrPort{netip.MustParseAddrPort(srv.Listener.Addr().String())}),
	} {
		_, err := pds.Connect(context.Background(), srv.URL, pdstest.Handle, pdstest.Password, pds.Options{Store: &countingStore{}, Policy: policy})
		if !errors.Is(err, netpolicy.ErrDenied) || errors.Is(err, pds.ErrUnreachable) {
			t.Fatalf("%s: want netpolicy.ErrDenied (and not ErrUnreachable), got %v", name, err)
		}
		checkNoSecrets(t, err)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("%d requests reached a refused address", n)
	}
}
