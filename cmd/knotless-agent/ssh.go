package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"golang.org/x/crypto/ssh"
	"golang.org/x/net/netutil"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/knotless-dev/knotless/cmd/knotless-agent/options"
	"github.com/knotless-dev/knotless/internal/gateway"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/sshgateway"
)

// hostKeyFile is the SSH gateway's host key in --ssh-dir.
const hostKeyFile = "ssh_host_ed25519_key"

// Bounds of the SSH gateway's clients.
const (
	sshConns      = 256
	sshConnsPerIP = 8
)

// sshHostKey is the SSH gateway's host key, read from dir, or made
// (ed25519) and kept there on first start.
func sshHostKey(dir string) (ssh.Signer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--ssh-dir: %w", err)
	}
	path := filepath.Join(dir, hostKeyFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, gerr := ed25519.GenerateKey(rand.Reader)
		if gerr != nil {
			return nil, gerr
		}
		block, merr := ssh.MarshalPrivateKey(priv, "knotless-agent ssh gateway")
		if merr != nil {
			return nil, merr
		}
		b = pem.EncodeToMemory(block)
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			return nil, fmt.Errorf("--ssh-dir: %w", err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return nil, fmt.Errorf("--ssh-dir: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("--ssh-dir: %w", err)
	}
	key, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("--ssh-dir: %s: %w", path, err)
	}
	return key, nil
}

// serveSSH adds the SSH gateway to mgr: on --ssh-address, sessions of
// the DIDs whose keys their repos publish, into pods of the targets the
// gatewayroute controller keeps, through the tenants' admin.
func serveSSH(mgr manager.Manager, o *options.Options, key ssh.Signer, targets *sshgateway.Targets, tenants *tenantBackends, dir identity.Directory, policy *netpolicy.Policy) error {
	keys := &sshgateway.Keys{Directory: dir, Client: pds.NewHTTPClient(policy, nil, 10*time.Second), TTL: o.SSHKeyTTL}
	exe := &sshgateway.Executor{Targets: targets, Admin: tenants.admin}
	log := ctrl.Log.WithName("ssh-gateway")
	srv := &sshgateway.Server{HostKey: key, Lookup: keys.Lookup, Exec: exe.Exec, Log: log}
	ln, err := net.Listen("tcp", o.SSHAddress)
	if err != nil {
		return fmt.Errorf("--ssh-address: %w", err)
	}
	ln = gateway.LimitPerIP(netutil.LimitListener(ln, sshConns), sshConnsPerIP)
	log.Info("serving SSH sessions", "address", ln.Addr().String(), "hostKey", ssh.FingerprintSHA256(key.PublicKey()))
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error { return srv.Serve(ctx, ln) }))
}
