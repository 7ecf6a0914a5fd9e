package framework

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
)

// GuestArgs returns the provider's flags for GuestIdentityGrants: the
// admission webhook on a free port of 127.0.0.1 with a serving
// certificate of its own CA (under Dir/webhook), and kcp-front-proxy at
// guestServer (https://host:port) as the tenants reach it, its
// certificate checked for 127.0.0.1 when guestServer's host is another.
func (m *MountCerts) GuestArgs(guestServer string) ([]string, error) {
	dir := filepath.Join(m.Dir, "webhook")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := NewCA("knotless-admission-webhook")
	if err != nil {
		return nil, err
	}
	c, err := ca.Issue("knotless-provider-webhook", "127.0.0.1")
	if err != nil {
		return nil, err
	}
	crt, key, err := PEMs(c)
	if err != nil {
		return nil, err
	}
	caFile := filepath.Join(dir, "ca.crt")
	for p, b := range map[string][]byte{filepath.Join(dir, "tls.crt"): crt, filepath.Join(dir, "tls.key"): key, caFile: ca.PEM} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return nil, err
		}
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	args := []string{"--guest-kcp-server", guestServer, "--guest-kcp-ca-file", m.FPServingCAFile,
		"--admission-webhook-bind-address", addr, "--admission-webhook-cert-dir", dir,
		"--admission-webhook-url", "https://" + addr, "--admission-webhook-ca-file", caFile}
	if u, err := url.Parse(guestServer); err == nil && u.Hostname() != "127.0.0.1" {
		args = append(args, "--guest-kcp-tls-server-name", "127.0.0.1")
	}
	return args, nil
}

// GuestServer returns kcp-front-proxy's address as workloads in kind
// tenants reach it: a TCP relay on the docker bridge's address of this
// machine (docker0) to fpURL, which listens on 127.0.0.1 only, for as
// long as ctx lives. Without docker0 it is fpURL itself.
func GuestServer(ctx context.Context, fpURL string) (string, error) {
	ifc, err := net.InterfaceByName("docker0")
	if err != nil {
		return fpURL, nil
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return "", err
	}
	var ip net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			ip = n.IP
		}
	}
	if ip == nil {
		return fpURL, nil
	}
	u, err := url.Parse(fpURL)
	if err != nil {
		return "", err
	}
	l, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		return "", err
	}
	go func() { <-ctx.Done(); l.Close() }()
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			go relay(in, u.Host)
		}
	}()
	return fmt.Sprintf("https://%s", l.Addr()), nil
}

func relay(in net.Conn, target string) {
	defer in.Close()
	out, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer out.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
	go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
	<-done
}
