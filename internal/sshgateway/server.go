/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package sshgateway is knotless-agent's SSH gateway: `ssh
// <handle-or-did>@<gateway> -- <tenant>/<namespace>/<pod> [command]` opens an exec
// into a pod of a tenant the agent runs, as that DID. The session's key
// must be one the DID publishes in its own repo
// (dev.knotless.gateway.sshKeys, read with its proof: Keys), so no key is
// registered with the bidder; what the session may do is the tenant's own
// RBAC for the DID (create pods/exec, checked, then the exec itself is
// made as the DID).
package sshgateway

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/go-logr/logr"
	"golang.org/x/crypto/ssh"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Bounds of a connection.
const (
	handshakeTimeout = 10 * time.Second
	// idleTimeout closes a connection that has no session this long
	// (any ATProto account passes authentication: sessions are what is
	// authorized).
	idleTimeout = 15 * time.Second
	maxSessions = 4
	maxCommand  = 8 << 10
)

// ExtensionDID carries the authenticated DID in ssh.Permissions.
const ExtensionDID = "knotless-did"

// ErrRefused: the session is not let in (no such target, pod, or right).
// Its message is all the user sees.
var ErrRefused = errors.New("refused")

// Size is a terminal's size.
type Size struct{ Width, Height uint16 }

// Session is one exec asked for.
type Session struct {
	// DID is the authenticated user.
	DID string
	// Tenant is the record key of the tenant's lease; Namespace and Pod
	// are the target in it.
	Tenant, Namespace, Pod string
	// Command is what runs (empty: a shell).
	Command []string
	// TTY: the client asked for a terminal; Resize sends its sizes.
	TTY    bool
	Resize <-chan Size
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Server is the SSH gateway.
type Server struct {
	// HostKey is the gateway's host key.
	HostKey ssh.Signer
	// Lookup returns a user's DID and published keys (Keys.Lookup).
	Lookup func(ctx context.Context, user string) (string, []ssh.PublicKey, error)
	// Exec runs a session and returns its exit status; ErrRefused (or
	// an error wrapping it) when the session is not let in.
	Exec func(ctx context.Context, s Session) (int, error)
	Log  logr.Logger

	wg sync.WaitGroup
}

// config is a connection's configuration: its keys are looked up with
// ctx, for the user of its first attempt only (a client cannot make the
// agent look up a new user at each attempt).
func (s *Server) config(ctx context.Context) *ssh.ServerConfig {
	first := ""
	cfg := &ssh.ServerConfig{
		MaxAuthTries: 6,
		PublicKeyCallback: func(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if first == "" {
				first = meta.User()
			} else if meta.User() != first {
				return nil, errors.New("one user per connection")
			}
			ctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
			defer cancel()
			did, keys, err := s.Lookup(ctx, meta.User())
			if err != nil {
				s.Log.V(1).Info("ssh: no keys", "user", meta.User(), "error", err.Error())
				return nil, errors.New("no such key")
			}
			for _, k := range keys {
				if bytes.Equal(k.Marshal(), key.Marshal()) {
					return &ssh.Permissions{Extensions: map[string]string{ExtensionDID: did}}, nil
				}
			}
			return nil, errors.New("no such key")
		},
		ServerVersion: "SSH-2.0-knotless",
	}
	cfg.AddHostKey(s.HostKey)
	return cfg
}

// Serve accepts connections on ln until ctx ends, then closes them and
// waits for their goroutines.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	defer s.wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(ctx, c)
		}()
	}
}

// serveConn is one client: the handshake within handshakeTimeout, then
// its sessions, at most maxSessions at once; it is closed after
// idleTimeout without a session, and when ctx ends (in its handshake
// too).
func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	conn, chans, reqs, err := ssh.NewServerConn(c, s.config(ctx))
	if err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { ssh.DiscardRequests(reqs) })
	did := conn.Permissions.Extensions[ExtensionDID]
	var mu sync.Mutex
	active := 0
	idle := time.AfterFunc(idleTimeout, func() { _ = conn.Close() })
	defer idle.Stop()
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		mu.Lock()
		full := active >= maxSessions
		if !full {
			active++
			idle.Stop()
		}
		mu.Unlock()
		if full {
			_ = nc.Reject(ssh.ResourceShortage, "too many sessions")
			continue
		}
		end := func() {
			mu.Lock()
			if active--; active == 0 {
				idle.Reset(idleTimeout)
			}
			mu.Unlock()
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			end()
			continue
		}
		wg.Go(func() {
			defer end()
			s.session(ctx, did, ch, creqs)
		})
	}
}

// session serves one session channel: pty-req and window-change are
// kept, exec (or shell) starts the exec; env and the rest are refused.
// The exec runs with a context of the session's own, ended when the
// client closes the session.
func (s *Server) session(ctx context.Context, did string, ch ssh.Channel, reqs <-chan *ssh.Request) {
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ch.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resize := make(chan Size, 4)
	tty := false
	for req := range reqs {
		switch req.Type {
		case "pty-req":
			tty = true
			if w, h, ok := ptySize(req.Payload); ok {
				offer(resize, Size{Width: w, Height: h})
			}
			_ = req.Reply(true, nil)
		case "window-change":
			offerWindow(resize, req.Payload)
			_ = req.Reply(false, nil)
		case "exec", "shell":
			var line string
			if req.Type == "exec" {
				var p struct{ Command string }
				if ssh.Unmarshal(req.Payload, &p) != nil || len(p.Command) > maxCommand {
					_ = req.Reply(false, nil)
					continue
				}
				line = p.Command
			}
			_ = req.Reply(true, nil)
			wg.Go(func() {
				// Later requests: window changes go to the exec; the
				// end of the requests (the client closed the session)
				// ends the exec.
				defer cancel()
				for r := range reqs {
					if r.Type == "window-change" {
						offerWindow(resize, r.Payload)
					}
					if r.WantReply {
						_ = r.Reply(false, nil)
					}
				}
			})
			code := s.run(ctx, did, line, tty, resize, ch)
			_, _ = ch.SendRequest("exit-status", false, binary.BigEndian.AppendUint32(nil, uint32(code)))
			return
		default:
			if req.WantReply {
				_ = req.Reply(false, nil)
			}
		}
	}
}

// offerWindow offers the size of a window-change request.
func offerWindow(ch chan Size, payload []byte) {
	if len(payload) >= 8 {
		offer(ch, Size{Width: uint16(binary.BigEndian.Uint32(payload)), Height: uint16(binary.BigEndian.Uint32(payload[4:]))})
	}
}

// run parses line (<tenant>/<namespace>/<pod> [command...]) and runs the exec;
// what the user sees of a refusal is one line on stderr.
func (s *Server) run(ctx context.Context, did, line string, tty bool, resize chan Size, ch ssh.Channel) int {
	tenant, ns, pod, cmd, err := ParseTarget(line)
	if err != nil {
		fmt.Fprintf(ch.Stderr(), "knotless: %v\r\n", err)
		return 2
	}
	start := time.Now()
	code, err := s.Exec(ctx, Session{DID: did, Tenant: tenant, Namespace: ns, Pod: pod, Command: cmd, TTY: tty, Resize: resize, Stdin: ch, Stdout: ch, Stderr: ch.Stderr()})
	s.Log.Info("ssh session", "did", did, "tenant", tenant, "namespace", ns, "pod", pod, "took", time.Since(start).String(), "code", code, "refused", errors.Is(err, ErrRefused))
	if errors.Is(err, ErrRefused) {
		fmt.Fprintf(ch.Stderr(), "knotless: %s/%s/%s: refused: no such pod, or %s may not exec into it\r\n", tenant, ns, pod, did)
		return 1
	}
	if err != nil {
		fmt.Fprintf(ch.Stderr(), "knotless: the exec failed\r\n")
		return 1
	}
	return code
}

// ParseTarget splits a session's command: <tenant>/<namespace>/<pod>
// (the tenant: its lease's record key, which its SshGateway's status
// shows), then the command's words (none: a shell).
func ParseTarget(line string) (tenant, ns, pod string, cmd []string, err error) {
	words := strings.Fields(line)
	if len(words) == 0 {
		return "", "", "", nil, errors.New("name the pod: ssh <you>@<gateway> -- <tenant>/<namespace>/<pod> [command]")
	}
	parts := strings.Split(words[0], "/")
	if len(parts) != 3 || !recordKey(parts[0]) || len(validation.IsDNS1123Label(parts[1])) > 0 || len(validation.IsDNS1123Subdomain(parts[2])) > 0 {
		return "", "", "", nil, errors.New("the target is <tenant>/<namespace>/<pod>")
	}
	return parts[0], parts[1], parts[2], words[1:], nil
}

// recordKey: s is a record key (what a lease's is).
func recordKey(s string) bool {
	_, err := syntax.ParseRecordKey(s)
	return err == nil
}

// ptySize is the width and height of a pty-req.
func ptySize(payload []byte) (uint16, uint16, bool) {
	var p struct {
		Term          string
		Width, Height uint32
		PxW, PxH      uint32
		Modes         string
	}
	if ssh.Unmarshal(payload, &p) != nil {
		return 0, 0, false
	}
	return uint16(p.Width), uint16(p.Height), true
}

// offer sends sz unless the queue is full (the newest size wins later).
func offer(ch chan Size, sz Size) {
	select {
	case ch <- sz:
	default:
	}
}
