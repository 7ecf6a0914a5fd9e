package framework

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// KCP is a kcp server used by the e2e suite.
type KCP struct {
	// Kubeconfig is an admin kubeconfig (kcp-admin in a started kcp).
	Kubeconfig string
	// Process is nil when the suite uses an existing kcp.
	Process *Process
	// Tokens maps user names to bearer tokens accepted by a started kcp.
	Tokens map[string]string
	// BaseURL is the server URL without a /clusters suffix.
	BaseURL string
	// Users, for an existing kcp, issues user certificates that
	// kcp-front-proxy accepts (External's client CA); nil otherwise.
	Users *FrontProxy
	name  string
	start func() (*Process, error)
}

// StartKCP starts `kcp start` from bin in dir on a free port, or, when
// KNOTLESS_E2E_KUBECONFIG is set, uses that kcp instead. extraArgs are
// added to kcp's flags.
func StartKCP(ctx context.Context, g *Group, bin, dir string, extraArgs ...string) (*KCP, error) {
	if kc := os.Getenv("KNOTLESS_E2E_KUBECONFIG"); kc != "" {
		k := &KCP{Kubeconfig: kc}
		cfg, err := k.Config()
		if err != nil {
			return nil, err
		}
		// The kubeconfig's server may name a workspace (…/clusters/root).
		k.BaseURL = cfg.Host
		if i := strings.Index(k.BaseURL, "/clusters/"); i >= 0 {
			k.BaseURL = k.BaseURL[:i]
		}
		return k, nil
	}
	return startKCP(ctx, g, bin, dir, "kcp", extraArgs)
}

// StartTenantKCP starts a second, independent `kcp start` in dir: a tenant
// apiserver with its own self-signed serving certificate.
func StartTenantKCP(ctx context.Context, g *Group, bin, dir string) (*KCP, error) {
	return startKCP(ctx, g, bin, dir, "tenant-kcp", nil)
}

func startKCP(ctx context.Context, g *Group, bin, dir, name string, extraArgs []string) (*KCP, error) {
	// kcp's embedded etcd listens on fixed ports unless told otherwise; a
	// second kcp on the machine (make dev, another run) would collide.
	var ports [3]int
	for i := range ports {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	port := ports[0]
	root := filepath.Join(dir, name)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	k := &KCP{Tokens: map[string]string{}}
	tokenFile := filepath.Join(dir, name+"-tokens.csv")
	var csv string
	// Users the started kcp authenticates by token. They have no rights
	// until a test grants them some.
	for i, u := range []string{"alice", "bob", "carol"} {
		tok := fmt.Sprintf("e2e-token-%s-%d", u, time.Now().UnixNano())
		k.Tokens[u] = tok
		csv += fmt.Sprintf("%s,%s,%d,\"e2e\"\n", tok, u, 1000+i)
	}
	if err := os.WriteFile(tokenFile, []byte(csv), 0o600); err != nil {
		return nil, err
	}
	k.start = func() (*Process, error) {
		return Start(dir, name, bin, append([]string{
			"start",
			"--root-directory", root,
			"--bind-address", "127.0.0.1",
			"--secure-port", strconv.Itoa(port),
			"--feature-gates", "WorkspaceMounts=true",
			"--token-auth-file", tokenFile,
			"--embedded-etcd-client-port", strconv.Itoa(ports[1]),
			"--embedded-etcd-peer-port", strconv.Itoa(ports[2]),
		}, extraArgs...), nil)
	}
	k.name = name
	k.Kubeconfig = filepath.Join(root, "admin.kubeconfig")
	k.BaseURL = fmt.Sprintf("https://127.0.0.1:%d", port)
	return k, k.Restart(ctx, g)
}

// Restart starts a kcp this suite started again (after Stop), with the
// same flags, ports and data, and waits until it is ready.
func (k *KCP) Restart(ctx context.Context, g *Group) error {
	p, err := k.start()
	if err != nil {
		return err
	}
	g.Add(p)
	k.Process = p
	return Eventually(ctx, 3*time.Minute, k.name+" to be ready", func(ctx context.Context) (bool, string, error) {
		if p.Exited() {
			return false, "", fmt.Errorf("%s exited: %w", k.name, ErrExited)
		}
		if _, err := os.Stat(k.Kubeconfig); err != nil {
			return false, "no admin.kubeconfig yet", nil
		}
		cfg, err := k.Config()
		if err != nil {
			return false, err.Error(), nil
		}
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			return false, err.Error(), nil
		}
		resp, err := hc.Get(k.BaseURL + "/readyz")
		if err != nil {
			return false, err.Error(), nil
		}
		resp.Body.Close()
		return resp.StatusCode == 200, "readyz " + resp.Status, nil
	})
}

// Config returns the admin rest config (of the kubeconfig's current
// context).
func (k *KCP) Config() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200
	return cfg, nil
}

// UserConfig returns a rest config that authenticates as a token user.
func (k *KCP) UserConfig(user string) (*rest.Config, error) {
	tok, ok := k.Tokens[user]
	if !ok && k.Users != nil {
		return k.Users.UserConfig(user, "root")
	}
	if !ok {
		return nil, fmt.Errorf("no token user %q (an existing kcp has none: set KNOTLESS_E2E_FRONT_PROXY_URL and its client CA)", user)
	}
	admin, err := k.Config()
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host:            admin.Host,
		BearerToken:     tok,
		TLSClientConfig: rest.TLSClientConfig{CAData: admin.CAData, CAFile: admin.CAFile},
		QPS:             50, Burst: 100,
	}, nil
}
