package sshgateway

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/crypto/ssh"
)

func signer(t *testing.T) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type gatewayFixture struct {
	addr    string
	host    ssh.Signer
	mu      sync.Mutex
	seen    []Session
	sizes   []Size
	allowed map[string]bool // DID -> may exec
}

// serve starts a Server whose users are alice.test (did:plc:alice, key
// aliceKey) and bob.test (did:plc:bob, no keys); its Exec prints the
// session and exits 3 for DIDs it lets in, ErrRefused otherwise.
func serve(t *testing.T, aliceKey ssh.PublicKey) *gatewayFixture {
	t.Helper()
	f := &gatewayFixture{host: signer(t), allowed: map[string]bool{"did:plc:alice": true}}
	srv := &Server{HostKey: f.host, Log: logr.Discard(),
		Lookup: func(_ context.Context, user string) (string, []ssh.PublicKey, error) {
			switch user {
			case "alice.test", "did:plc:alice":
				return "did:plc:alice", []ssh.PublicKey{aliceKey}, nil
			case "bob.test":
				return "did:plc:bob", nil, ErrNoKeys
			}
			return "", nil, errors.New("does not resolve")
		},
		Exec: func(_ context.Context, s Session) (int, error) {
			if !f.allowed[s.DID] {
				return 0, ErrRefused
			}
			if s.TTY {
				// Wait for a resize, as a shell would draw.
				select {
				case sz := <-s.Resize:
					f.mu.Lock()
					f.sizes = append(f.sizes, sz)
					f.mu.Unlock()
				case <-time.After(5 * time.Second):
				}
			}
			f.mu.Lock()
			f.seen = append(f.seen, Session{DID: s.DID, Namespace: s.Namespace, Pod: s.Pod, Command: s.Command, TTY: s.TTY})
			f.mu.Unlock()
			fmt.Fprintf(s.Stdout, "%s in %s/%s/%s: %s", s.DID, s.Tenant, s.Namespace, s.Pod, strings.Join(s.Command, " "))
			return 3, nil
		}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	f.addr = ln.Addr().String()
	return f
}

func (f *gatewayFixture) dial(user string, key ssh.Signer) (*ssh.Client, error) {
	return ssh.Dial("tcp", f.addr, &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(key)},
		HostKeyCallback: ssh.FixedHostKey(f.host.PublicKey()), Timeout: 5 * time.Second})
}

// run is the output, stderr and exit status of cmd in a session of c.
func run(t *testing.T, c *ssh.Client, cmd string, pty bool) (string, string, int) {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out, errOut bytes.Buffer
	s.Stdout, s.Stderr = &out, &errOut
	if pty {
		if err := s.RequestPty("xterm", 40, 120, ssh.TerminalModes{}); err != nil {
			t.Fatal(err)
		}
		go func() {
			time.Sleep(100 * time.Millisecond)
			_ = s.WindowChange(50, 132)
		}()
	}
	err = s.Run(cmd)
	var exit *ssh.ExitError
	switch {
	case err == nil:
		return out.String(), errOut.String(), 0
	case errors.As(err, &exit):
		return out.String(), errOut.String(), exit.ExitStatus()
	}
	t.Fatalf("run %q: %v", cmd, err)
	return "", "", -1
}

// TestServer: a key the user publishes lets the session in as its DID
// (by handle or DID); the target and command reach Exec; its exit status
// is the session's. Refused: a key not published, a user with no keys or
// that does not resolve, a DID the tenant does not let in (with one line
// that says so), a session without a target.
func TestServer(t *testing.T) {
	alice := signer(t)
	f := serve(t, alice.PublicKey())
	for _, user := range []string{"alice.test", "did:plc:alice"} {
		c, err := f.dial(user, alice)
		if err != nil {
			t.Fatalf("%s with the published key: %v", user, err)
		}
		out, _, code := run(t, c, "l1/web/shop-0 id -u", false)
		if out != "did:plc:alice in l1/web/shop-0: id -u" || code != 3 {
			t.Errorf("%s: %q exit %d", user, out, code)
		}
		c.Close()
	}
	if c, err := f.dial("alice.test", signer(t)); err == nil {
		c.Close()
		t.Error("a key alice does not publish was let in")
	}
	for _, user := range []string{"bob.test", "nobody.test"} {
		if c, err := f.dial(user, alice); err == nil {
			c.Close()
			t.Errorf("%s was let in with alice's key", user)
		}
	}
	c, err := f.dial("alice.test", alice)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, stderr, code := run(t, c, "", false); code != 2 || !strings.Contains(stderr, "name the pod") {
		t.Errorf("no target: exit %d, %q", code, stderr)
	}
	if _, stderr, code := run(t, c, "web/shop-0", false); code != 2 || !strings.Contains(stderr, "<tenant>/<namespace>/<pod>") {
		t.Errorf("a bad target: exit %d, %q", code, stderr)
	}
	f.allowed["did:plc:alice"] = false
	if _, stderr, code := run(t, c, "l1/web/shop-0 id", false); code != 1 || !strings.Contains(stderr, "refused") {
		t.Errorf("a DID the tenant does not let in: exit %d, %q", code, stderr)
	}
}

// TestServerPty: a terminal's request and its window changes reach
// Exec.
func TestServerPty(t *testing.T) {
	alice := signer(t)
	f := serve(t, alice.PublicKey())
	c, err := f.dial("alice.test", alice)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, _, code := run(t, c, "l1/web/shop-0", true); code != 3 {
		t.Fatalf("exit %d", code)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.seen) != 1 || !f.seen[0].TTY || len(f.seen[0].Command) != 0 || len(f.sizes) != 1 || f.sizes[0] != (Size{Width: 120, Height: 40}) {
		t.Errorf("sessions %+v, sizes %+v", f.seen, f.sizes)
	}
}

func TestParseKeys(t *testing.T) {
	alice := signer(t)
	line := string(bytes.TrimSpace(ssh.MarshalAuthorizedKey(alice.PublicKey())))
	rec := func(keys ...string) json.RawMessage {
		b, _ := json.Marshal(map[string]any{"$type": "dev.knotless.gateway.sshKeys", "keys": keys, "createdAt": "2026-06-02T18:00:00.000Z"})
		return b
	}
	keys, err := parseKeys(rec("not a key", `command="rm -rf /" `+line, line+" alice@laptop"))
	if err != nil || len(keys) != 1 || !bytes.Equal(keys[0].Marshal(), alice.PublicKey().Marshal()) {
		t.Fatalf("keys %v, %v: want alice's plain line only", keys, err)
	}
	if _, err := parseKeys(rec("not a key")); !errors.Is(err, ErrNoKeys) {
		t.Errorf("no valid key: %v", err)
	}
	if _, err := parseKeys(json.RawMessage(`{"$type":"dev.knotless.gateway.sshKeys","keys":"x"}`)); !errors.Is(err, ErrNoKeys) {
		t.Errorf("an invalid record: %v", err)
	}
}
