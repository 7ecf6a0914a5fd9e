package vault

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const (
	ws          = "2x7uf0bml0q9ms3b"
	ns          = "shop"
	secretValue = "s3cr3t-VALUE-do-not-leak"
)

var repoRef = KVRef{Mount: "secret", Path: "knotless/" + ws + "/" + ns + "/repo", Key: "password"}

// logSink collects log lines for leak checks.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (s *logSink) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.lines = append(s.lines, prefix+" "+args)
	}, funcr.Options{Verbosity: 10})
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

func newAppRoleClient(t *testing.T, fv *fakeVault, logs *logSink, opts ...Option) *Client {
	t.Helper()
	if logs == nil {
		logs = &logSink{}
	}
	c, err := New(Config{
		Address: fv.srv.URL,
		AppRole: AppRoleConfig{RoleID: fv.roleID, SecretID: fv.secretID},
		Prefix:  "knotless",
	}, append([]Option{WithLogger(logs.logger())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitFor polls cond until it holds, failing after a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startClient runs c.Start until the test ends and checks that it returns.
func startClient(t *testing.T, c *Client) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Start returned %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Start did not return after its context ended")
		}
	})
}

func readN(t *testing.T, c *Client, n int) []error {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			v, err := c.ReadKV(context.Background(), ws, ns, repoRef)
			if err == nil && v != secretValue {
				err = fmt.Errorf("got a wrong value")
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	return errs
}

func noErrors(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
	}
}

func TestConcurrentCallersShareOneLogin(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	fv.put("secret/"+repoRef.Path, map[string]any{"password": secretValue})
	fv.set(func(f *fakeVault) { f.loginDelay = 200 * time.Millisecond })
	c := newAppRoleClient(t, fv, nil)
	var skew atomic.Int64
	c.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }

	// No token yet.
	noErrors(t, readN(t, c, 100))
	if got := fv.logins.Load(); got != 1 {
		t.Fatalf("100 callers without a token: %d logins at the server, want 1", got)
	}
	if got := c.Logins(); got != 1 {
		t.Fatalf("Logins() = %d, want 1", got)
	}

	// The cached token has expired (by the client's clock).
	skew.Store(int64(2 * time.Hour))
	noErrors(t, readN(t, c, 100))
	if got := fv.logins.Load(); got != 2 {
		t.Fatalf("100 callers with an expired token: %d logins in total, want 2", got)
	}
	if got := c.Logins(); got != 2 {
		t.Fatalf("Logins() = %d, want 2", got)
	}
}

func TestForbiddenReadLogsInAgainAndRetriesOnce(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	fv.put("secret/"+repoRef.Path, map[string]any{"password": secretValue})
	c := newAppRoleClient(t, fv, nil)
	ctx := context.Background()

	if _, err := c.ReadKV(ctx, ws, ns, repoRef); err != nil {
		t.Fatal(err)
	}
	fv.revokeAll() // the token goes stale behind the client's back
	reads := fv.reads.Load()
	v, err := c.ReadKV(ctx, ws, ns, repoRef)
	if err != nil || v != secretValue {
		t.Fatalf("read after revocation: %v", err)
	}
	if got := fv.logins.Load(); got != 2 {
		t.Errorf("logins = %d, want 2 (one re-login)", got)
	}
	if got := fv.reads.Load() - reads; got != 2 {
		t.Errorf("reads for one ReadKV = %d, want 2 (the refused one and one retry)", got)
	}

	// Many callers see the same stale token: still one re-login.
	fv.revokeAll()
	noErrors(t, readN(t, c, 50))
	if got := fv.logins.Load(); got != 3 {
		t.Errorf("logins after 50 callers hit a stale token = %d, want 3", got)
	}
}

func TestForbiddenAfterRetryIsUnauthorized(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	c := newAppRoleClient(t, fv, nil)
	// Login works, but every token is revoked before it can be used: the
	// read is refused, the client logs in once more, and the retry is
	// refused as well.
	fv.set(func(f *fakeVault) { f.ttl = time.Nanosecond })
	_, err := c.ReadKV(context.Background(), ws, ns, repoRef)
	if !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("err = %v, want ErrUnauthorized", err)
	}
	if l, r := fv.logins.Load(), fv.reads.Load(); l != 2 || r != 2 {
		t.Errorf("logins=%d reads=%d, want 2 and 2 (exactly one retry)", l, r)
	}
}

func TestPolicyDenialDoesNotLogInAgain(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	fv.put("secret/"+repoRef.Path, map[string]any{"password": secretValue})
	c := newAppRoleClient(t, fv, nil)
	ctx := context.Background()
	if _, err := c.ReadKV(ctx, ws, ns, repoRef); err != nil {
		t.Fatal(err)
	}
	// The fake policy covers only the mount "secret".
	for range 3 {
		_, err := c.ReadKV(ctx, ws, ns, KVRef{Mount: "other", Path: repoRef.Path, Key: "password"})
		if !errors.Is(err, ErrUnauthorized) {
			t.Fatalf("err = %v, want ErrUnauthorized", err)
		}
	}
	if got := fv.logins.Load(); got != 1 {
		t.Errorf("logins = %d, want 1: a policy denial must not cause logins", got)
	}
	if got := fv.lookups.Load(); got != 3 {
		t.Errorf("lookups = %d, want 3 (one check per denial)", got)
	}
}

func TestLeaderContextEndsFollowerLogsIn(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	fv.put("secret/"+repoRef.Path, map[string]any{"password": secretValue})
	fv.set(func(f *fakeVault) { f.loginDelay = 500 * time.Millisecond })
	c := newAppRoleClient(t, fv, nil)

	leaderCtx, cancel := context.WithCancel(context.Background())
	leaderErr := make(chan error, 1)
	go func() {
		_, err := c.ReadKV(leaderCtx, ws, ns, repoRef)
		leaderErr <- err
	}()
	waitFor(t, "the leader's login to reach the server", func() bool { return fv.loginsStarted.Load() == 1 })
	followerErr := make(chan error, 1)
	go func() {
		_, err := c.ReadKV(context.Background(), ws, ns, repoRef)
		followerErr <- err
	}()
	waitFor(t, "the follower to wait for the flight", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.flight != nil
	})
	cancel()
	if err := <-leaderErr; !errors.Is(err, context.Canceled) {
		t.Errorf("leader: %v, want context.Canceled", err)
	}
	if err := <-followerErr; err != nil {
		t.Errorf("follower: %v (it must log in with its own context)", err)
	}
}

func TestRenewalAtTwoThirdsOfTTL(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	fv.put("secret/"+repoRef.Path, map[string]any{"password": secretValue})
	fv.set(func(f *fakeVault) { f.ttl = 3 * time.Second })
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	c := newAppRoleClient(t, fv, nil, WithMetrics(m))
	startClient(t, c)

	if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); err != nil {
		t.Fatal(err)
	}
	// Three renewals take ~6 s; the 3 s token is still the first one.
	waitFor(t, "three renewals", func() bool { return fv.renewals.Load() >= 3 })
	if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); err != nil {
		t.Fatal(err)
	}
	if got := fv.logins.Load(); got != 1 {
		t.Errorf("logins = %d, want 1: renewal must keep the token alive", got)
	}
	if got := testutil.ToFloat64(m.Renewals); got < 3 {
		t.Errorf("renewals_total = %v, want >= 3", got)
	}
}

func TestNotRenewableTokenIsForgotten(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	fv.put("secret/"+repoRef.Path, map[string]any{"password": secretValue})
	fv.set(func(f *fakeVault) { f.ttl = 3 * time.Second; f.renewable = false })
	c := newAppRoleClient(t, fv, nil)
	startClient(t, c)

	if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the token to be forgotten", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.tok == nil
	})
	if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); err != nil {
		t.Fatal(err)
	}
	if l, r := fv.logins.Load(), fv.renewals.Load(); l != 2 || r != 0 {
		t.Errorf("logins=%d renewals=%d, want 2 and 0", l, r)
	}
}

func TestFailedRenewalForgetsToken(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	fv.put("secret/"+repoRef.Path, map[string]any{"password": secretValue})
	fv.set(func(f *fakeVault) { f.ttl = 3 * time.Second; f.failRenew = true })
	reg := prometheus.NewRegistry()
	m, _ := NewMetrics(reg)
	c := newAppRoleClient(t, fv, nil, WithMetrics(m))
	startClient(t, c)

	if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a renewal attempt", func() bool { return fv.renewals.Load() >= 1 })
	waitFor(t, "the token to be forgotten", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.tok == nil
	})
	if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); err != nil {
		t.Fatal(err)
	}
	if got := fv.logins.Load(); got != 2 {
		t.Errorf("logins = %d, want 2", got)
	}
	if got := testutil.ToFloat64(m.RenewalErrors); got < 1 {
		t.Errorf("renewal_errors_total = %v, want >= 1", got)
	}
}

func newStaticClient(t *testing.T, fv *fakeVault, token string, logs *logSink) *Client {
	t.Helper()
	if logs == nil {
		logs = &logSink{}
	}
	c, err := New(Config{Address: fv.srv.URL, Token: token}, WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestStaticToken(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	fv.put("secret/"+repoRef.Path, map[string]any{"password": secretValue})
	fv.addToken("hvs.static-root", 0, false)
	c := newStaticClient(t, fv, "hvs.static-root", nil)
	startClient(t, c)
	noErrors(t, readN(t, c, 20))
	if got := c.Logins(); got != 1 {
		t.Errorf("Logins() = %d, want 1 (one lookup-self)", got)
	}
	fv.revokeAll()
	_, err := c.ReadKV(context.Background(), ws, ns, repoRef)
	if !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("err = %v, want ErrUnauthorized", err)
	}
	if got := fv.logins.Load(); got != 0 {
		t.Errorf("AppRole logins = %d with a static token", got)
	}
}

func TestStaticTokenRenewalFailureKeepsToken(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	fv.put("secret/"+repoRef.Path, map[string]any{"password": secretValue})
	fv.addToken("hvs.static", time.Hour, true)
	fv.set(func(f *fakeVault) { f.failRenew = true })
	c := newStaticClient(t, fv, "hvs.static", nil)
	var skew atomic.Int64
	c.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	startClient(t, c)
	if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); err != nil {
		t.Fatal(err)
	}
	// Jump to the renewal point.
	skew.Store(int64(41 * time.Minute))
	c.kick <- struct{}{}
	waitFor(t, "a renewal attempt", func() bool { return fv.renewals.Load() == 1 })
	waitFor(t, "renewal to be given up", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.tok != nil && c.tok.noRenew
	})
	if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); err != nil {
		t.Fatalf("static token must stay in use: %v", err)
	}
	if got := c.Logins(); got != 1 {
		t.Errorf("Logins() = %d, want 1", got)
	}
}

func TestStaticTokenRenewal(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	fv.put("secret/"+repoRef.Path, map[string]any{"password": secretValue})
	fv.addToken("hvs.static", 3*time.Second, true)
	c := newStaticClient(t, fv, "hvs.static", nil)
	startClient(t, c)
	if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two renewals", func() bool { return fv.renewals.Load() >= 2 })
	if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); err != nil {
		t.Fatal(err)
	}
}

func TestTenancyRefusals(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	c := newAppRoleClient(t, fv, nil)
	mine := "knotless/" + ws + "/" + ns + "/"
	cases := []struct {
		name, workspace, namespace string
		ref                        KVRef
	}{
		{"foreign workspace prefix", ws, ns, KVRef{"secret", "knotless/otherws/" + ns + "/repo", "password"}},
		{"other namespace of the workspace", ws, ns, KVRef{"secret", "knotless/" + ws + "/other/repo", "password"}},
		{"workspace-wide path without namespace", ws, ns, KVRef{"secret", "knotless/" + ws + "/repo", "password"}},
		{"dot-dot into a foreign workspace", ws, ns, KVRef{"secret", mine + "../../otherws/repo", "password"}},
		{"dot-dot into another namespace", ws, ns, KVRef{"secret", mine + "../other/repo", "password"}},
		{"dot-dot at the end", ws, ns, KVRef{"secret", mine + "repo/..", "password"}},
		{"dot segment", ws, ns, KVRef{"secret", mine + "./repo", "password"}},
		{"absolute path", ws, ns, KVRef{"secret", "/" + mine + "repo", "password"}},
		{"empty key", ws, ns, KVRef{"secret", mine + "repo", ""}},
		{"empty mount", ws, ns, KVRef{"", mine + "repo", "password"}},
		{"mount with slash", ws, ns, KVRef{"secret/data", mine + "repo", "password"}},
		{"mount dot-dot", ws, ns, KVRef{"..", mine + "repo", "password"}},
		{"empty segment", ws, ns, KVRef{"secret", "knotless//" + ws + "/" + ns + "/repo", "password"}},
		{"trailing slash", ws, ns, KVRef{"secret", mine + "repo/", "password"}},
		{"namespace prefix only", ws, ns, KVRef{"secret", "knotless/" + ws + "/" + ns, "password"}},
		{"namespace prefix with slash", ws, ns, KVRef{"secret", mine, "password"}},
		{"other tenancy prefix", ws, ns, KVRef{"secret", "other/" + ws + "/" + ns + "/repo", "password"}},
		{"no prefix", ws, ns, KVRef{"secret", ws + "/" + ns + "/repo", "password"}},
		{"encoded dot-dot", ws, ns, KVRef{"secret", mine + "%2e%2e/x", "password"}},
		{"query", ws, ns, KVRef{"secret", mine + "repo?version=1", "password"}},
		{"fragment", ws, ns, KVRef{"secret", mine + "repo#x", "password"}},
		{"backslash", ws, ns, KVRef{"secret", mine + `..\x`, "password"}},
		{"space", ws, ns, KVRef{"secret", mine + "re po", "password"}},
		{"empty path", ws, ns, KVRef{"secret", "", "password"}},
		{"empty workspace", "", ns, KVRef{"secret", "knotless//" + ns + "/repo", "password"}},
		{"workspace dot-dot", "..", ns, KVRef{"secret", "knotless/../" + ns + "/repo", "password"}},
		{"workspace with colon path", "root:org", ns, KVRef{"secret", "knotless/root:org/" + ns + "/repo", "password"}},
		{"empty namespace", ws, "", KVRef{"secret", "knotless/" + ws + "//repo", "password"}},
		{"namespace dot-dot", ws, "..", KVRef{"secret", "knotless/" + ws + "/../repo", "password"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.ReadKV(context.Background(), tc.workspace, tc.namespace, tc.ref)
			var fe *ForbiddenPathError
			if !errors.As(err, &fe) || !errors.Is(err, ErrForbiddenPath) {
				t.Fatalf("err = %v, want a *ForbiddenPathError", err)
			}
			if Reason(err) != ReasonForbiddenPath {
				t.Errorf("Reason = %s", Reason(err))
			}
		})
	}
	if got := fv.requests.Load(); got != 0 {
		t.Fatalf("%d requests reached Vault for refused references, want 0", got)
	}
	// Control: the workspace's own path passes the check.
	if err := CheckRef("knotless", ws, ns, repoRef); err != nil {
		t.Fatal(err)
	}
	if err := CheckRef("/org/knotless/", ws, ns, KVRef{"kv", "org/knotless/" + ws + "/" + ns + "/a/b", "k"}); err != nil {
		t.Fatalf("multi-segment prefix: %v", err)
	}
}

func TestErrorsAndLogsNeverCarrySecrets(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	fv.put("secret/"+repoRef.Path, map[string]any{"password": secretValue, "nested": map[string]any{"x": secretValue}})
	logs := &logSink{}
	c := newAppRoleClient(t, fv, logs)
	ctx := context.Background()
	var errs []error
	collect := func(_ string, err error) {
		if err == nil {
			t.Fatal("expected an error")
		}
		errs = append(errs, err)
	}

	if v, err := c.ReadKV(ctx, ws, ns, repoRef); err != nil || v != secretValue {
		t.Fatal(err)
	}
	_, err := c.ReadKV(ctx, ws, ns, KVRef{"secret", repoRef.Path, "missing"})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `"missing"`) || !strings.Contains(err.Error(), repoRef.Path) {
		t.Errorf("missing key: %v (want ErrNotFound naming path and key)", err)
	}
	collect("missing key", err)
	_, err = c.ReadKV(ctx, ws, ns, KVRef{"secret", "knotless/" + ws + "/" + ns + "/absent", "password"})
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("missing secret: %v", err)
	}
	collect("missing secret", err)
	_, err = c.ReadKV(ctx, ws, ns, KVRef{"secret", repoRef.Path, "nested"})
	if !errors.Is(err, ErrInvalidValue) {
		t.Errorf("object value: %v", err)
	}
	collect("object value", err)
	_, err = c.ReadKV(ctx, ws, ns, KVRef{"secret", "knotless/otherws/repo", "password"})
	collect("forbidden", err)
	_, err = c.ReadKV(ctx, ws, ns, KVRef{"other", repoRef.Path, "password"})
	collect("policy", err)

	// A server that echoes the secret ID in its error.
	fv.revokeAll()
	fv.set(func(f *fakeVault) { f.echoSecret = true })
	c.approle.SecretID = fv.secretID + "-wrong"
	_, err = c.ReadKV(ctx, ws, ns, repoRef)
	if !errors.Is(err, ErrUnauthorized) {
		t.Errorf("bad secret ID: %v", err)
	}
	collect("login", err)

	// A server error whose body carries a secret.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(500)
		_, _ = w.Write([]byte(`{"oops":"` + secretValue + `"}`))
	}))
	defer srv.Close()
	c2, err := New(Config{Address: srv.URL, Token: "hvs.tok-DO-NOT-LEAK"}, WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c2.ReadKV(ctx, ws, ns, repoRef)
	if !errors.Is(err, ErrUnreachable) {
		t.Errorf("500: %v", err)
	}
	collect("500", err)

	tokens := []string{"hvs.fake-token-1", "hvs.fake-token-2", "hvs.tok-DO-NOT-LEAK", fv.secretID}
	for _, err := range errs {
		for _, s := range append([]string{secretValue}, tokens...) {
			for _, text := range []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err)} {
				if strings.Contains(text, s) {
					t.Errorf("error leaks %q: %s", s, text)
				}
			}
		}
	}
	for _, s := range append([]string{secretValue}, tokens...) {
		if strings.Contains(logs.String(), s) {
			t.Errorf("logs leak %q:\n%s", s, logs)
		}
	}
}

// TestRedirectsAreNotFollowed: a Vault (or something at its address) that
// redirects gets no second request carrying the token elsewhere (R18).
func TestRedirectsAreNotFollowed(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer target.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	c, err := New(Config{Address: srv.URL, Token: "hvs.redirected", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); err == nil {
		t.Fatal("a redirected read succeeded")
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the redirect target got %d requests", n)
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c, err := New(Config{Address: "http://" + addr, Token: "hvs.x", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ReadKV(context.Background(), ws, ns, repoRef)
	if !errors.Is(err, ErrUnreachable) || Reason(err) != ReasonUnreachable {
		t.Fatalf("err = %v, want ErrUnreachable", err)
	}
}

func TestDisabled(t *testing.T) {
	t.Parallel()
	c, err := New(Config{Token: "x"})
	if err != nil || c != nil {
		t.Fatalf("New without address = %v, %v; want nil, nil", c, err)
	}
	if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); !errors.Is(err, ErrDisabled) {
		t.Fatalf("nil client ReadKV: %v", err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if Reason(ErrDisabled) != ReasonDisabled {
		t.Fatal(Reason(ErrDisabled))
	}
}

func TestConfigAndFlags(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	secretFile := filepath.Join(dir, "secret-id")
	if err := os.WriteFile(tokenFile, []byte("hvs.from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secretFile, []byte("sid\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	var cfg Config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	BindFlags(fs, &cfg)
	if cfg.Prefix != "knotless" || cfg.AppRole.MountPath != "approle" || cfg.Timeout != 10*time.Second {
		t.Fatalf("defaults: %+v", cfg)
	}
	if err := fs.Parse([]string{"--vault-address=http://127.0.0.1:1", "--vault-token-file=" + tokenFile, "--vault-prefix=tenants"}); err != nil {
		t.Fatal(err)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.static != "hvs.from-file" || c.Prefix() != "tenants" {
		t.Fatalf("token from file/prefix not applied")
	}

	t.Setenv("VAULT_TOKEN", "hvs.from-env")
	c, err = New(Config{Address: "http://127.0.0.1:1"})
	if err != nil || c.static != "hvs.from-env" {
		t.Fatalf("VAULT_TOKEN fallback: %v", err)
	}

	var ar Config
	fs = flag.NewFlagSet("test", flag.ContinueOnError)
	BindFlags(fs, &ar)
	if err := fs.Parse([]string{"--vault-address=https://vault:8200", "--vault-approle-role-id=r", "--vault-approle-secret-id-file=" + secretFile, "--vault-approle-mount=ar/prod"}); err != nil {
		t.Fatal(err)
	}
	c, err = New(ar)
	if err != nil || c.static != "" || c.approle.RoleID != "r" || c.approle.MountPath != "ar/prod" {
		t.Fatalf("AppRole config: %v", err)
	}

	bad := []Config{
		{Address: "http://v", Token: "t", AppRole: AppRoleConfig{RoleID: "r", SecretID: "s"}},
		{Address: "http://v", AppRole: AppRoleConfig{RoleID: "r"}},
		{Address: "http://v", AppRole: AppRoleConfig{RoleID: "r", SecretIDFile: filepath.Join(dir, "absent")}},
		{Address: "http://v", TokenFile: filepath.Join(dir, "absent")},
		{Address: "vault:8200", Token: "t"},
		{Address: "http://v", Token: "t", Prefix: "a/../b"},
		{Address: "http://v", CAFile: filepath.Join(dir, "absent"), Token: "t"},
	}
	for i, cfg := range bad {
		if _, err := New(cfg); err == nil {
			t.Errorf("bad config %d accepted", i)
		} else if strings.Contains(err.Error(), "hvs.") {
			t.Errorf("config error leaks a token: %v", err)
		}
	}
}

func TestCAFileReloads(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	fv.put("secret/"+repoRef.Path, map[string]any{"password": secretValue})
	fv.addToken("hvs.static", 0, false)
	srv := httptest.NewTLSServer(fv)
	defer srv.Close()

	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, otherCA(t), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Address: srv.URL, CAFile: caFile, Token: "hvs.static"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("with a foreign CA: %v, want ErrUnreachable", err)
	}
	if fv.requests.Load() != 0 {
		t.Fatal("a request passed an untrusted TLS handshake")
	}
	good := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, good, 0o600); err != nil {
		t.Fatal(err)
	}
	if v, err := c.ReadKV(context.Background(), ws, ns, repoRef); err != nil || v != secretValue {
		t.Fatalf("after the CA file changed: %v", err)
	}
}

func otherCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	fv := newFakeVault(t)
	fv.put("secret/"+repoRef.Path, map[string]any{"password": secretValue})
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	again, err := NewMetrics(reg)
	if err != nil || again.Logins != m.Logins {
		t.Fatalf("second NewMetrics on the same registry: %v", err)
	}
	c := newAppRoleClient(t, fv, nil, WithMetrics(m))
	ctx := context.Background()
	_, _ = c.ReadKV(ctx, ws, ns, repoRef)
	_, _ = c.ReadKV(ctx, ws, ns, KVRef{"secret", repoRef.Path, "nope"})
	_, _ = c.ReadKV(ctx, "other", ns, repoRef)
	if got := testutil.ToFloat64(m.Logins); got != 1 {
		t.Errorf("logins_total = %v", got)
	}
	for result, want := range map[string]float64{ResultOK: 1, ResultNotFound: 1, ResultForbiddenPath: 1} {
		if got := testutil.ToFloat64(m.Reads.WithLabelValues(result)); got != want {
			t.Errorf("reads_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "knotless_vault_reads_total", "knotless_vault_logins_total"); err != nil || n != 4 {
		t.Errorf("gathered %d series, err %v", n, err)
	}
}
