/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package sshgateway is knotless-agent's SSH gateway: `ssh
// <handle-or-did>@<gateway> -- <namespace>/<pod> [command]` opens an exec
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

	"github.com/go-logr/logr"
	"golang.org/x/crypto/ssh"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Bounds of a connection.
const (
	handshakeTimeout = 10 * time.Second
	maxSessions      = 4
	maxCommand       = 8 << 10
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
	// Namespace and Pod are the target.
	Namespace, Pod string
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

func (s *Server) config() *ssh.ServerConfig {
	cfg := &ssh.ServerConfig{
		MaxAuthTries: 6,
		PublicKeyCallback: func(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
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
	cfg := s.config()
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
			s.serveConn(ctx, c, cfg)
		}()
	}
}

// serveConn is one client: the handshake within handshakeTimeout, then
// its sessions, at most maxSessions at once.
func (s *Server) serveConn(ctx context.Context, c net.Conn, cfg *ssh.ServerConfig) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	conn, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	go ssh.DiscardRequests(reqs)
	did := conn.Permissions.Extensions[ExtensionDID]
	slots := make(chan struct{}, maxSessions)
	var wg sync.WaitGroup
	defer wg.Wait()
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			_ = nc.Reject(ssh.ResourceShortage, "too many sessions")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			<-slots
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			s.session(ctx, did, ch, creqs)
		}()
	}
}

// session serves one session channel: pty-req and window-change are
// kept, exec (or shell) starts the exec; env and the rest are refused.
func (s *Server) session(ctx context.Context, did string, ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
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
			if len(req.Payload) >= 8 {
				offer(resize, Size{Width: uint16(binary.BigEndian.Uint32(req.Payload)), Height: uint16(binary.BigEndian.Uint32(req.Payload[4:]))})
			}
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
			go func() {
				// Later requests: window changes go to the exec.
				for r := range reqs {
					if r.Type == "window-change" && len(r.Payload) >= 8 {
						offer(resize, Size{Width: uint16(binary.BigEndian.Uint32(r.Payload)), Height: uint16(binary.BigEndian.Uint32(r.Payload[4:]))})
					}
					if r.WantReply {
						_ = r.Reply(false, nil)
					}
				}
			}()
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

// run parses line (<namespace>/<pod> [command...]) and runs the exec;
// what the user sees of a refusal is one line on stderr.
func (s *Server) run(ctx context.Context, did, line string, tty bool, resize chan Size, ch ssh.Channel) int {
	ns, pod, cmd, err := ParseTarget(line)
	if err != nil {
		fmt.Fprintf(ch.Stderr(), "knotless: %v\r\n", err)
		return 2
	}
	start := time.Now()
	code, err := s.Exec(ctx, Session{DID: did, Namespace: ns, Pod: pod, Command: cmd, TTY: tty, Resize: resize, Stdin: ch, Stdout: ch, Stderr: ch.Stderr()})
	s.Log.Info("ssh session", "did", did, "namespace", ns, "pod", pod, "took", time.Since(start).String(), "code", code, "refused", errors.Is(err, ErrRefused))
	if errors.Is(err, ErrRefused) {
		fmt.Fprintf(ch.Stderr(), "knotless: %s/%s: refused: no such pod, or %s may not exec into it\r\n", ns, pod, did)
		return 1
	}
	if err != nil {
		fmt.Fprintf(ch.Stderr(), "knotless: the exec failed\r\n")
		return 1
	}
	return code
}

// ParseTarget splits a session's command: <namespace>/<pod>, then the
// command's words (none: a shell).
func ParseTarget(line string) (ns, pod string, cmd []string, err error) {
	words := strings.Fields(line)
	if len(words) == 0 {
		return "", "", nil, errors.New("name the pod: ssh <you>@<gateway> -- <namespace>/<pod> [command]")
	}
	ns, pod, ok := strings.Cut(words[0], "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(pod)) > 0 {
		return "", "", nil, errors.New("the target is <namespace>/<pod>")
	}
	return ns, pod, words[1:], nil
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
