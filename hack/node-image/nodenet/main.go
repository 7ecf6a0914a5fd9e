// Command nodenet is the pod network of the knotless node image: the default
// CNI that `kind create cluster` installs from /kind/manifests/default-cni.yaml
// (in kind's own images that is kindnetd, which cannot be pulled here).
//
// It runs as a DaemonSet pod on every node. It reads its node's podCIDRs
// from the API server (the controller manager allocates them) and writes a
// CNI configuration for the plugins Debian's containernetworking-plugins
// package installs on the node: ptp (a veth per pod and a /32 route on the
// node, so every packet is routed through the node's iptables, as kindnet
// does), host-local IPAM on the node's podCIDRs, masquerade for traffic that
// leaves them, and portmap for hostPort. It then checks every 30 s and
// rewrites the file only when it would change.
//
// What it does not do: routes to other nodes' podCIDRs and network policy
// (kindnetd does both). A knotless kind cluster is a single node; on a
// multi-node cluster pods on different nodes cannot reach each other, and
// nodenet logs that.
//
// Configuration (environment): NODE_NAME (downward API); CONTROL_PLANE_ENDPOINT
// (host:port, which kind patches in so the network does not wait for
// kube-proxy), else KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT;
// CNI_CONF_DIR (default /etc/cni/net.d); MTU (default: the MTU of the
// node's default-route interface, else 1500).
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	saDir    = "/var/run/secrets/kubernetes.io/serviceaccount"
	confName = "10-knotless-nodenet.conflist"
)

type node struct {
	Spec struct {
		PodCIDR  string   `json:"podCIDR"`
		PodCIDRs []string `json:"podCIDRs"`
	} `json:"spec"`
}

type nodeList struct {
	Items []json.RawMessage `json:"items"`
}

func main() {
	log.SetFlags(log.LstdFlags | log.LUTC)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx)
	stop() // before log.Fatal, which runs no deferred call
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	name := os.Getenv("NODE_NAME")
	if name == "" {
		return errors.New("NODE_NAME is not set")
	}
	dir := envOr("CNI_CONF_DIR", "/etc/cni/net.d")
	client, base, err := apiClient()
	if err != nil {
		return err
	}
	mtu := mtu()
	warnedMulti := false
	for {
		cidrs, err := podCIDRs(ctx, client, base, name)
		switch {
		case err != nil:
			log.Printf("reading node %s: %v", name, err)
		case len(cidrs) == 0:
			log.Printf("node %s has no podCIDR yet", name)
		default:
			changed, err := writeConf(dir, cidrs, mtu)
			if err != nil {
				log.Printf("writing %s: %v", filepath.Join(dir, confName), err)
			} else if changed {
				log.Printf("wrote %s for %s (mtu %d)", filepath.Join(dir, confName), strings.Join(cidrs, ","), mtu)
			}
			if n, err := nodeCount(ctx, client, base); err == nil && n > 1 && !warnedMulti {
				log.Printf("%d nodes: nodenet routes no traffic between nodes; pods on different nodes cannot reach each other", n)
				warnedMulti = true
			}
		}
		wait := 30 * time.Second
		if err != nil || len(cidrs) == 0 {
			wait = 2 * time.Second
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// apiClient returns an HTTP client trusting the cluster CA and the API
// server's base URL.
func apiClient() (*http.Client, string, error) {
	ca, err := os.ReadFile(filepath.Join(saDir, "ca.crt"))
	if err != nil {
		return nil, "", err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, "", errors.New("no certificate in the service account's ca.crt")
	}
	hostPort := os.Getenv("CONTROL_PLANE_ENDPOINT")
	if hostPort == "" {
		host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			return nil, "", errors.New("neither CONTROL_PLANE_ENDPOINT nor KUBERNETES_SERVICE_HOST/PORT is set")
		}
		hostPort = net.JoinHostPort(host, port)
	}
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
		// No client of knotless follows a redirect (R18), this one included.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return client, "https://" + hostPort, nil
}

func get(ctx context.Context, client *http.Client, url string, into any) error {
	// The token is read on every call: the kubelet rotates it.
	token, err := os.ReadFile(filepath.Join(saDir, "token"))
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(b.String()))
	}
	return json.NewDecoder(resp.Body).Decode(into)
}

func podCIDRs(ctx context.Context, client *http.Client, base, name string) ([]string, error) {
	var n node
	if err := get(ctx, client, base+"/api/v1/nodes/"+name, &n); err != nil {
		return nil, err
	}
	if len(n.Spec.PodCIDRs) > 0 {
		return n.Spec.PodCIDRs, nil
	}
	if n.Spec.PodCIDR != "" {
		return []string{n.Spec.PodCIDR}, nil
	}
	return nil, nil
}

func nodeCount(ctx context.Context, client *http.Client, base string) (int, error) {
	var l nodeList
	if err := get(ctx, client, base+"/api/v1/nodes", &l); err != nil {
		return 0, err
	}
	return len(l.Items), nil
}

// conf is the CNI configuration for the node's podCIDRs.
func conf(cidrs []string, mtu int) ([]byte, error) {
	var ranges [][]map[string]string
	var routes []map[string]string
	for _, c := range cidrs {
		ip, _, err := net.ParseCIDR(c)
		if err != nil {
			return nil, fmt.Errorf("podCIDR %q: %w", c, err)
		}
		ranges = append(ranges, []map[string]string{{"subnet": c}})
		if ip.To4() != nil {
			routes = append(routes, map[string]string{"dst": "0.0.0.0/0"})
		} else {
			routes = append(routes, map[string]string{"dst": "::/0"})
		}
	}
	c := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "knotless-nodenet",
		"plugins": []any{
			map[string]any{
				"type":   "ptp",
				"ipMasq": true,
				"mtu":    mtu,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": "/run/cni-ipam-state",
					"ranges":  ranges,
					"routes":  routes,
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	return json.MarshalIndent(c, "", "  ")
}

// writeConf writes the configuration atomically; it reports whether the
// file changed.
func writeConf(dir string, cidrs []string, mtu int) (bool, error) {
	want, err := conf(cidrs, mtu)
	if err != nil {
		return false, err
	}
	path := filepath.Join(dir, confName)
	if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, want) {
		return false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, want, 0o644); err != nil {
		return false, err
	}
	return true, os.Rename(tmp, path)
}

// mtu is $MTU, else the MTU of the interface of the node's IPv4 default
// route (the pod runs in the node's network namespace), else 1500.
func mtu() int {
	if v, err := strconv.Atoi(os.Getenv("MTU")); err == nil && v > 0 {
		return v
	}
	routes, err := os.ReadFile("/proc/net/route")
	if err == nil {
		for _, line := range strings.Split(string(routes), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) > 2 && f[1] == "00000000" {
				if ifc, err := net.InterfaceByName(f[0]); err == nil && ifc.MTU > 0 {
					return ifc.MTU
				}
			}
		}
	}
	return 1500
}
