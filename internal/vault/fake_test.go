package vault

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeVault is a small Vault: AppRole login, token lookup-self and
// renew-self, and KV v2 reads, with tokens that expire for real and a
// policy that allows reads below secret/data/knotless/ only.
type fakeVault struct {
	srv *httptest.Server

	roleID, secretID string

	mu         sync.Mutex
	ttl        time.Duration // of issued tokens
	renewable  bool
	failRenew  bool          // renew-self answers 403
	loginDelay time.Duration // keeps a login in flight
	echoSecret bool          // a failed login echoes the secret ID (a misbehaving server)
	tokens     map[string]*fakeToken
	secrets    map[string]map[string]any // "<mount>/<path>" → data
	n          int

	requests      atomic.Int64
	logins        atomic.Int64 // login requests
	loginsStarted atomic.Int64
	lookups       atomic.Int64
	renewals      atomic.Int64 // renew-self requests
	reads         atomic.Int64
}

type fakeToken struct {
	ttl       time.Duration // 0: never expires
	expires   time.Time
	renewable bool
}

func newFakeVault(t *testing.T) *fakeVault {
	t.Helper()
	f := &fakeVault{
		roleID:    "role-1",
		secretID:  "secret-id-XYZZY-42",
		ttl:       time.Hour,
		renewable: true,
		tokens:    map[string]*fakeToken{},
		secrets:   map[string]map[string]any{},
	}
	f.srv = httptest.NewServer(f)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeVault) put(mountPath string, data map[string]any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.secrets[mountPath] = data
}

// addToken registers a token that is not obtained by login (a static one).
func (f *fakeVault) addToken(value string, ttl time.Duration, renewable bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tok := &fakeToken{ttl: ttl, renewable: renewable}
	if ttl > 0 {
		tok.expires = time.Now().Add(ttl)
	}
	f.tokens[value] = tok
}

// revokeAll makes every token stale.
func (f *fakeVault) revokeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens = map[string]*fakeToken{}
}

func (f *fakeVault) set(fn func(f *fakeVault)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func vaultErrors(w http.ResponseWriter, status int, msgs ...string) {
	if msgs == nil {
		msgs = []string{}
	}
	writeJSON(w, status, map[string]any{"errors": msgs})
}

// valid returns the request's token if it is known and not expired.
func (f *fakeVault) valid(r *http.Request) (string, *fakeToken) {
	v := r.Header.Get("X-Vault-Token")
	tok, ok := f.tokens[v]
	if !ok || (tok.ttl > 0 && time.Now().After(tok.expires)) {
		return "", nil
	}
	return v, tok
}

func (f *fakeVault) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.requests.Add(1)
	p := strings.TrimPrefix(r.URL.Path, "/v1/")
	switch {
	case p == "auth/approle/login" && (r.Method == http.MethodPost || r.Method == http.MethodPut):
		f.logins.Add(1)
		f.loginsStarted.Add(1)
		var body struct {
			RoleID   string `json:"role_id"`
			SecretID string `json:"secret_id"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.mu.Lock()
		delay, echo := f.loginDelay, f.echoSecret
		f.mu.Unlock()
		time.Sleep(delay)
		if body.RoleID != f.roleID || body.SecretID != f.secretID {
			msg := "invalid role or secret ID"
			if echo {
				msg += ": " + body.SecretID
			}
			vaultErrors(w, http.StatusBadRequest, msg)
			return
		}
		f.mu.Lock()
		f.n++
		value := fmt.Sprintf("hvs.fake-token-%d", f.n)
		tok := &fakeToken{ttl: f.ttl, expires: time.Now().Add(f.ttl), renewable: f.renewable}
		f.tokens[value] = tok
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"data": nil, "auth": map[string]any{
			"client_token": value, "accessor": "acc-" + value, "policies": []string{"default", "knotless"},
			"lease_duration": int(tok.ttl / time.Second), "renewable": tok.renewable,
		}})

	case p == "auth/token/lookup-self" && r.Method == http.MethodGet:
		f.lookups.Add(1)
		f.mu.Lock()
		_, tok := f.valid(r)
		f.mu.Unlock()
		if tok == nil {
			vaultErrors(w, http.StatusForbidden, "permission denied")
			return
		}
		ttl := 0
		if tok.ttl > 0 {
			ttl = int(time.Until(tok.expires) / time.Second)
		}
		writeJSON(w, http.StatusOK, map[string]any{"data": map[string]any{"ttl": ttl, "renewable": tok.renewable, "policies": []string{"default"}}})

	case p == "auth/token/renew-self" && (r.Method == http.MethodPost || r.Method == http.MethodPut):
		f.renewals.Add(1)
		f.mu.Lock()
		defer f.mu.Unlock()
		v, tok := f.valid(r)
		if tok == nil || f.failRenew {
			vaultErrors(w, http.StatusForbidden, "permission denied")
			return
		}
		if !tok.renewable {
			vaultErrors(w, http.StatusBadRequest, "lease is not renewable")
			return
		}
		tok.expires = time.Now().Add(tok.ttl)
		writeJSON(w, http.StatusOK, map[string]any{"data": nil, "auth": map[string]any{
			"client_token": v, "lease_duration": int(tok.ttl / time.Second), "renewable": true,
		}})

	case strings.Contains(p, "/data/") && r.Method == http.MethodGet:
		f.reads.Add(1)
		mount, path, _ := strings.Cut(p, "/data/")
		f.mu.Lock()
		_, tok := f.valid(r)
		data, ok := f.secrets[mount+"/"+path]
		f.mu.Unlock()
		if tok == nil || mount != "secret" || !strings.HasPrefix(path, "knotless/") {
			vaultErrors(w, http.StatusForbidden, "permission denied")
			return
		}
		if !ok {
			vaultErrors(w, http.StatusNotFound)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"data": map[string]any{
			"data": data, "metadata": map[string]any{"version": 1},
		}})

	default:
		vaultErrors(w, http.StatusNotFound, "no handler for route "+p)
	}
}
