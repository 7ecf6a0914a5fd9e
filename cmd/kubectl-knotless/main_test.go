package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientauthv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"

	"github.com/knotless-dev/knotless/internal/serviceauth"
)

// fakePDS answers createSession and getServiceAuth the way a PDS does
// (the e2e suite runs a real one); it records what it was asked.
func fakePDS(t *testing.T, asked *[]string) *httptest.Server {
	t.Helper()
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*asked = append(*asked, r.URL.Path+"?"+r.URL.RawQuery)
		switch r.URL.Path {
		case "/xrpc/com.atproto.server.createSession":
			var in struct{ Identifier, Password string }
			_ = json.NewDecoder(r.Body).Decode(&in)
			if in.Identifier != "me.test" || in.Password != "app-pw" {
				http.Error(w, `{"error":"AuthenticationRequired"}`, http.StatusUnauthorized)
				return
			}
			_ = json.NewEncoder(w).Encode(map[string]string{"accessJwt": "access", "refreshJwt": "refresh", "did": "did:plc:me", "handle": "me.test"})
		case "/xrpc/com.atproto.server.getServiceAuth":
			if r.Header.Get("Authorization") != "Bearer access" {
				http.Error(w, `{"error":"AuthenticationRequired"}`, http.StatusUnauthorized)
				return
			}
			_ = json.NewEncoder(w).Encode(map[string]string{"token": "service-token"})
		default:
			http.NotFound(w, r)
		}
	}))
}

func TestTokenPrintsAnExecCredentialForTheAudience(t *testing.T) {
	var asked []string
	srv := fakePDS(t, &asked)
	defer srv.Close()
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("app-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := token(t.Context(), []string{"--pds", srv.URL, "--identifier", "me.test", "--password-file", pw, "--audience", "did:plc:b#knotless_tenant_x"}, &out); err != nil {
		t.Fatal(err)
	}
	var cred clientauthv1.ExecCredential
	if err := json.Unmarshal(out.Bytes(), &cred); err != nil || cred.Kind != "ExecCredential" || cred.APIVersion != "client.authentication.k8s.io/v1" ||
		cred.Status == nil || cred.Status.Token != "service-token" || cred.Status.ExpirationTimestamp == nil {
		t.Fatalf("%s: %v", out.String(), err)
	}
	if left := time.Until(cred.Status.ExpirationTimestamp.Time); left <= 0 || left > tokenTTL {
		t.Errorf("expires in %s", left)
	}
	if len(asked) != 2 || !strings.Contains(asked[1], "aud=did%3Aplc%3Ab%23knotless_tenant_x") || !strings.Contains(asked[1], "lxm="+serviceauth.Method) {
		t.Errorf("asked %v", asked)
	}
}

// A PDS that redirects the login does not get the password sent on.
func TestTokenFollowsNoRedirect(t *testing.T) {
	var asked []string
	target := fakePDS(t, &asked)
	defer target.Close()
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer redirector.Close()
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("app-pw"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := token(t.Context(), []string{"--pds", redirector.URL, "--identifier", "me.test", "--password-file", pw, "--audience", "did:plc:b#knotless_tenant_x"}, &bytes.Buffer{})
	if err == nil || len(asked) != 0 {
		t.Fatalf("err %v, the redirect target was asked %v", err, asked)
	}
}

func TestKubeconfigArguments(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"cc", "--lease", "at://did:plc:b/dev.knotless.market.lease/x", "--pds", "p", "--identifier", "i", "--password-file", "f"},
		{"cc", "extra", "--pds", "p", "--identifier", "i", "--password-file", "f"},
		{"cc", "--pds", "p", "--identifier", "i", "--password-file", "f", "extra"},
		{"cc"},
		{"--lease", "not-an-at-uri", "--pds", "p", "--identifier", "i", "--password-file", "f"},
	} {
		if err := kubeconfig(t.Context(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

// The app password never goes over plain http to another machine.
func TestTokenRefusesPlainHTTPToAnotherHost(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("app-pw"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := token(t.Context(), []string{"--pds", "http://pds.example", "--identifier", "me.test", "--password-file", pw, "--audience", "did:plc:b#knotless_tenant_x"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--pds") {
		t.Fatalf("err %v", err)
	}
}
