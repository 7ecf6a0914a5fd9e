package vault

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	vault "github.com/hashicorp/vault-client-go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// devVault is a real `vault server -dev` child process.
type devVault struct {
	addr  string
	root  string
	admin *vault.Client
}

// startDevVault starts bin/vault (built by the project's tool module) or
// skips the test.
func startDevVault(t *testing.T) *devVault {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test against a real Vault dev server: skipped in -short mode")
	}
	bin, err := filepath.Abs(filepath.Join("..", "..", "bin", "vault"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("integration test against a real Vault dev server: %s is absent (build it with the hack/tools/vault tool module)", bin)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	root := "root-" + hex.EncodeToString(b)
	dv := &devVault{addr: fmt.Sprintf("http://127.0.0.1:%d", port), root: root}

	logPath := filepath.Join(t.TempDir(), "vault.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "server", "-dev",
		"-dev-root-token-id="+root,
		"-dev-listen-address="+strings.TrimPrefix(dv.addr, "http://"),
		"-dev-no-store-token")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "VAULT_TOKEN=", "VAULT_ADDR=")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited //nolint:errcheck // waits for the exit; the error is "signal: killed"
		logFile.Close()
		if t.Failed() {
			raw, _ := os.ReadFile(logPath)
			lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
			t.Logf("last lines of the Vault dev server's log (%s):\n%s", logPath, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})

	dv.admin, err = vault.New(vault.WithAddress(dv.addr), vault.WithRequestTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := dv.admin.Read(context.Background(), "sys/health")
		if err == nil {
			break
		}
		select {
		case werr := <-exited:
			exited <- werr
			t.Fatalf("vault server exited before it was ready: %v", werr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("vault server not ready at %s: %v", dv.addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return dv
}

func (dv *devVault) write(t *testing.T, path string, body map[string]any) *vault.Response[map[string]any] {
	t.Helper()
	resp, err := dv.admin.Write(context.Background(), path, body, vault.WithToken(dv.root))
	if err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	return resp
}

func (dv *devVault) read(t *testing.T, path string) *vault.Response[map[string]any] {
	t.Helper()
	resp, err := dv.admin.Read(context.Background(), path, vault.WithToken(dv.root))
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return resp
}

// appRole creates a role with the given token TTL and returns its role ID
// and a fresh secret ID.
func (dv *devVault) appRole(t *testing.T, name, ttl string) (string, string) {
	t.Helper()
	dv.write(t, "auth/approle/role/"+name, map[string]any{
		"token_policies": "knotless", "token_ttl": ttl, "token_max_ttl": "4h",
	})
	roleID, _ := dv.read(t, "auth/approle/role/"+name+"/role-id").Data["role_id"].(string)
	// Auth.AppRoleWriteSecretId of vault-client-go cannot decode this
	// answer; the generic Write can.
	secretID, _ := dv.write(t, "auth/approle/role/"+name+"/secret-id", map[string]any{}).Data["secret_id"].(string)
	if roleID == "" || secretID == "" {
		t.Fatal("no role_id or secret_id in Vault's answers")
	}
	return roleID, secretID
}

func TestRealVault(t *testing.T) {
	dv := startDevVault(t)
	const value = "app-password-from-real-vault"
	policy := `path "secret/data/knotless/*" {
  capabilities = ["read"]
}`
	dv.write(t, "sys/auth/approle", map[string]any{"type": "approle"})
	dv.write(t, "sys/policies/acl/knotless", map[string]any{"policy": policy})
	dv.write(t, "sys/mounts/kv2", map[string]any{"type": "kv", "options": map[string]any{"version": "2"}})
	dv.write(t, "secret/data/"+repoRef.Path, map[string]any{"data": map[string]any{"password": value, "port": 8080}})
	dv.write(t, "secret/data/knotless/otherws/repo", map[string]any{"data": map[string]any{"password": "other"}})
	dv.write(t, "secret/data/knotless/"+ws+"/other/repo", map[string]any{"data": map[string]any{"password": "other"}})
	dv.write(t, "kv2/data/"+repoRef.Path, map[string]any{"data": map[string]any{"password": value}})

	roleID, secretID := dv.appRole(t, "knotless-provider", "1h")
	secretIDFile := filepath.Join(t.TempDir(), "secret-id")
	if err := os.WriteFile(secretIDFile, []byte(secretID+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	newClient := func(t *testing.T, roleID, secretIDFile string, opts ...Option) *Client {
		t.Helper()
		c, err := New(Config{
			Address: dv.addr,
			AppRole: AppRoleConfig{RoleID: roleID, SecretIDFile: secretIDFile},
		}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	t.Run("AppRole read, revocation, one re-login", func(t *testing.T) {
		logs := &logSink{}
		m, err := NewMetrics(prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		c := newClient(t, roleID, secretIDFile, WithLogger(logs.logger()), WithMetrics(m))
		startClient(t, c)
		ctx := context.Background()

		got, err := c.ReadKV(ctx, ws, ns, repoRef)
		if err != nil || got != value {
			t.Fatalf("ReadKV: %q, %v", got, err)
		}
		if n := c.Logins(); n != 1 {
			t.Fatalf("Logins() = %d, want 1", n)
		}
		if got, err := c.ReadKV(ctx, ws, ns, KVRef{"secret", repoRef.Path, "port"}); err != nil || got != "8080" {
			t.Errorf("number value: %q, %v", got, err)
		}

		c.mu.Lock()
		tok := c.tok.value
		c.mu.Unlock()
		dv.write(t, "auth/token/revoke", map[string]any{"token": tok})

		got, err = c.ReadKV(ctx, ws, ns, repoRef)
		if err != nil || got != value {
			t.Fatalf("ReadKV after revocation: %v", err)
		}
		if n := c.Logins(); n != 2 {
			t.Fatalf("Logins() after revocation = %d, want 2", n)
		}

		_, err = c.ReadKV(ctx, ws, ns, KVRef{"secret", repoRef.Path, "absent"})
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("missing key: %v", err)
		}
		_, err = c.ReadKV(ctx, ws, ns, KVRef{"secret", "knotless/" + ws + "/" + ns + "/absent", "password"})
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("missing secret: %v", err)
		}
		_, err = c.ReadKV(ctx, ws, ns, KVRef{"secret", "knotless/otherws/repo", "password"})
		if !errors.Is(err, ErrForbiddenPath) {
			t.Errorf("foreign workspace: %v", err)
		}
		_, err = c.ReadKV(ctx, ws, ns, KVRef{"secret", "knotless/" + ws + "/other/repo", "password"})
		if !errors.Is(err, ErrForbiddenPath) {
			t.Errorf("other namespace of the same workspace: %v", err)
		}
		// kv2 is not in the policy: a denial, not a stale token.
		_, err = c.ReadKV(ctx, ws, ns, KVRef{"kv2", repoRef.Path, "password"})
		if !errors.Is(err, ErrUnauthorized) {
			t.Errorf("path outside the policy: %v", err)
		}
		t.Logf("policy denial: %v", err)
		if n := c.Logins(); n != 2 {
			t.Errorf("Logins() = %d after a policy denial, want still 2", n)
		}
		if strings.Contains(logs.String(), value) || strings.Contains(logs.String(), secretID) || strings.Contains(logs.String(), tok) {
			t.Errorf("logs leak a secret:\n%s", logs)
		}
		if got := testutil.ToFloat64(m.Logins); got != 2 {
			t.Errorf("logins_total = %v", got)
		}
	})

	t.Run("100 concurrent callers, one login", func(t *testing.T) {
		c := newClient(t, roleID, secretIDFile)
		errs := make(chan error, 100)
		start := make(chan struct{})
		for range 100 {
			go func() {
				<-start
				v, err := c.ReadKV(context.Background(), ws, ns, repoRef)
				if err == nil && v != value {
					err = errors.New("wrong value")
				}
				errs <- err
			}()
		}
		close(start)
		for range 100 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if n := c.Logins(); n != 1 {
			t.Fatalf("Logins() = %d, want 1", n)
		}
	})

	t.Run("renewal keeps a short token alive", func(t *testing.T) {
		shortRole, shortSecret := dv.appRole(t, "short", "3s")
		f := filepath.Join(t.TempDir(), "secret-id")
		if err := os.WriteFile(f, []byte(shortSecret), 0o600); err != nil {
			t.Fatal(err)
		}
		m, _ := NewMetrics(prometheus.NewRegistry())
		c := newClient(t, shortRole, f, WithMetrics(m))
		startClient(t, c)
		if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "three renewals", func() bool { return testutil.ToFloat64(m.Renewals) >= 3 })
		if _, err := c.ReadKV(context.Background(), ws, ns, repoRef); err != nil {
			t.Fatal(err)
		}
		if n := c.Logins(); n != 1 {
			t.Errorf("Logins() = %d, want 1", n)
		}
	})

	t.Run("static root token", func(t *testing.T) {
		c, err := New(Config{Address: dv.addr, Token: dv.root})
		if err != nil {
			t.Fatal(err)
		}
		if v, err := c.ReadKV(context.Background(), ws, ns, repoRef); err != nil || v != value {
			t.Fatalf("ReadKV: %v", err)
		}
	})

	t.Run("wrong secret ID", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "secret-id")
		wrong := "00000000-0000-0000-0000-" + strconv.Itoa(123456789012)
		if err := os.WriteFile(f, []byte(wrong), 0o600); err != nil {
			t.Fatal(err)
		}
		c := newClient(t, roleID, f)
		_, err := c.ReadKV(context.Background(), ws, ns, repoRef)
		if !errors.Is(err, ErrUnauthorized) || bytes.Contains([]byte(err.Error()), []byte(wrong)) {
			t.Fatalf("err = %v, want ErrUnauthorized without the secret ID", err)
		}
		t.Logf("wrong secret ID: %v", err)
	})
}
