package framework

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// MountCerts are the certificates of the mount topology (kcp shard,
// kcp-front-proxy, knotless-mountproxy, the provider's probe), written as
// files under Dir:
//   - the shard trusts kcp-front-proxy's client certificate through its
//     requestheader CA (ShardRequestHeaderCAFile);
//   - kcp-front-proxy authenticates users by client certificates of UserCA;
//   - the shim serves a certificate of ShimServingCA (kcp-front-proxy's
//     backend_server_ca for /tenants/) and trusts client certificates of
//     ShimRequestCA: kcp-front-proxy's proxy certificate
//     (CN kcp-front-proxy) and the probe's (CN knotless-probe).
type MountCerts struct {
	Dir                                   string
	UserCA, ShimServingCA, ShimRequestCA  *CA `json:"-"`
	ShardRequestHeaderCAFile, UserCAFile  string
	FPToShard, FPServing, FPToShim, Probe KeyPair
	ShimServing                           KeyPair
	ShimServingCAFile, ShimRequestCAFile  string
	FPServingCAFile                       string
	// Identity header names kcp-front-proxy uses towards the shim, each
	// random on its own per run: kcp v0.28.1's front proxy appends its
	// groups and extras to any the caller sent under the same names and
	// passes requests without a client certificate on untouched, so the
	// names are a secret of the deployment (docs/mountproxy.md).
	UserHeader, GroupHeader, ExtraHeaderPrefix string
	// External: the certificates of an existing kcp's topology
	// (External.MountCerts); the shim's serving key is not the suite's.
	External bool
}

// AllowedNetworks is the --allow-private-networks of the provider and the
// shim in e2e and make dev: every process listens on 127.0.0.1, which is
// the only private address they may reach (R18); tests use other loopback
// addresses (127.0.0.2) as places that must not be reached.
const AllowedNetworks = "127.0.0.1/32"

// KeyPair is a certificate and key file.
type KeyPair struct{ Cert, Key string }

// NewMountCerts creates the CAs and certificates under dir.
func NewMountCerts(dir string) (*MountCerts, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	m := &MountCerts{Dir: dir}
	var tags [3]string
	for i := range tags {
		var err error
		if tags[i], err = randomHex(8); err != nil {
			return nil, err
		}
	}
	m.UserHeader, m.GroupHeader, m.ExtraHeaderPrefix = "X-Knotless-"+tags[0]+"-User", "X-Knotless-"+tags[1]+"-Group", "X-Knotless-"+tags[2]+"-Extra-"
	shardRH, err := NewCA("knotless-shard-requestheader")
	if err != nil {
		return nil, err
	}
	if m.UserCA, err = NewCA("knotless-users"); err != nil {
		return nil, err
	}
	fpServing, err := NewCA("knotless-front-proxy-serving")
	if err != nil {
		return nil, err
	}
	if m.ShimServingCA, err = NewCA("knotless-mountproxy-serving"); err != nil {
		return nil, err
	}
	if m.ShimRequestCA, err = NewCA("knotless-mountproxy-requestheader"); err != nil {
		return nil, err
	}
	m.ShardRequestHeaderCAFile, err = m.writeCA("shard-requestheader-ca.crt", shardRH)
	if err != nil {
		return nil, err
	}
	if m.FPServingCAFile, err = m.writeCA("front-proxy-serving-ca.crt", fpServing); err != nil {
		return nil, err
	}
	if m.UserCAFile, err = m.writeCA("user-ca.crt", m.UserCA); err != nil {
		return nil, err
	}
	if m.ShimServingCAFile, err = m.writeCA("mountproxy-serving-ca.crt", m.ShimServingCA); err != nil {
		return nil, err
	}
	if m.ShimRequestCAFile, err = m.writeCA("mountproxy-requestheader-ca.crt", m.ShimRequestCA); err != nil {
		return nil, err
	}
	for _, c := range []struct {
		out  *KeyPair
		ca   *CA
		name string
		host []string
	}{
		{&m.FPToShard, shardRH, "kcp-front-proxy", nil},
		{&m.FPServing, fpServing, "kcp-front-proxy-serving", []string{"127.0.0.1", "localhost"}},
		{&m.FPToShim, m.ShimRequestCA, "kcp-front-proxy", nil},
		{&m.Probe, m.ShimRequestCA, "knotless-probe", nil},
		{&m.ShimServing, m.ShimServingCA, "knotless-mountproxy", []string{"127.0.0.1", "localhost"}},
	} {
		kp, err := m.issue(c.ca, c.name, c.host...)
		if err != nil {
			return nil, err
		}
		*c.out = kp
	}
	return m, nil
}

func (m *MountCerts) writeCA(name string, ca *CA) (string, error) {
	p := filepath.Join(m.Dir, name)
	return p, os.WriteFile(p, ca.PEM, 0o600)
}

// issue writes a certificate of ca for name under Dir.
func (m *MountCerts) issue(ca *CA, name string, hosts ...string) (KeyPair, error) {
	c, err := ca.Issue(name, hosts...)
	if err != nil {
		return KeyPair{}, err
	}
	return m.WritePair(fmt.Sprintf("%s-%s", ca.Cert.Subject.CommonName, name), c)
}

// WritePair writes a certificate and its key as <base>.crt and <base>.key
// (replacing them atomically, as a rotation does).
func (m *MountCerts) WritePair(base string, c tls.Certificate) (KeyPair, error) {
	crt, key, err := PEMs(c)
	if err != nil {
		return KeyPair{}, err
	}
	kp := KeyPair{Cert: filepath.Join(m.Dir, base+".crt"), Key: filepath.Join(m.Dir, base+".key")}
	for p, b := range map[string][]byte{kp.Cert: crt, kp.Key: key} {
		if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
			return KeyPair{}, err
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			return KeyPair{}, err
		}
	}
	return kp, nil
}

// UserKubeconfig writes a kubeconfig that reaches kcp through the front
// proxy at fpURL (workspace root) as user in groups, with a client
// certificate of the user CA.
func (m *MountCerts) UserKubeconfig(path, fpURL, user string, groups ...string) error {
	c, err := m.UserCA.IssueUser(user, groups...)
	if err != nil {
		return err
	}
	crt, key, err := PEMs(c)
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(m.FPServingCAFile)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["root"] = &clientcmdapi.Cluster{Server: fpURL + "/clusters/root", CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: crt, ClientKeyData: key}
	cfg.Contexts["root"] = &clientcmdapi.Context{Cluster: "root", AuthInfo: user}
	cfg.CurrentContext = "root"
	return clientcmd.WriteToFile(*cfg, path)
}

// RotateShimServing replaces the shim's serving certificate files with a
// new certificate of the same CA and returns it.
func (m *MountCerts) RotateShimServing() (tls.Certificate, error) {
	if m.External {
		return tls.Certificate{}, errors.New("the shim of an existing kcp has its own serving certificate")
	}
	c, err := m.ShimServingCA.Issue("knotless-mountproxy", "127.0.0.1", "localhost")
	if err != nil {
		return tls.Certificate{}, err
	}
	_, err = m.WritePair(strings.TrimSuffix(filepath.Base(m.ShimServing.Cert), ".crt"), c)
	return c, err
}

// ShardArgs are the kcp shard's flags that trust kcp-front-proxy's client
// certificate and its X-Remote-* headers.
func (m *MountCerts) ShardArgs() []string {
	return []string{
		"--requestheader-client-ca-file", m.ShardRequestHeaderCAFile,
		"--requestheader-username-headers", "X-Remote-User",
		"--requestheader-group-headers", "X-Remote-Group",
		"--requestheader-extra-headers-prefix", "X-Remote-Extra-",
		"--requestheader-allowed-names", "kcp-front-proxy",
	}
}

// FrontProxy is a running kcp-front-proxy.
type FrontProxy struct {
	*Process
	URL   string
	certs *MountCerts
}

// UserConfig returns a config that reaches the workspace at path through
// the front proxy as user, authenticated by a client certificate of the
// user CA (so kcp-front-proxy sends the user's identity in X-Remote-*).
func (fp *FrontProxy) UserConfig(user, path string) (*rest.Config, error) {
	c, err := fp.certs.UserCA.Issue(user)
	if err != nil {
		return nil, err
	}
	crt, key, err := PEMs(c)
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host:            fp.URL + "/clusters/" + path,
		TLSClientConfig: rest.TLSClientConfig{CAFile: fp.certs.FPServingCAFile, CertData: crt, KeyData: key},
		QPS:             50, Burst: 100,
	}, nil
}

// FrontProxyConfig writes kcp-front-proxy's mapping file and root
// kubeconfig into dir for the kcp whose admin kubeconfig and base URL are
// given, with the mappings /clusters/ (the shard) and /tenants/ (the shim
// at shimAddr, host:port, with the random identity header names) and "/"
// (the shard), and
// returns kcp-front-proxy's flags but for --secure-port.
func FrontProxyConfig(dir, kubeconfig, kcpURL string, m *MountCerts, shimAddr string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// kcp-front-proxy reads the shards and root identities as the shard
	// admin (context shard-base of kcp's admin kubeconfig).
	raw, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return nil, err
	}
	raw.CurrentContext = "shard-base"
	if err := clientcmdapi.MinifyConfig(raw); err != nil {
		return nil, err
	}
	if err := clientcmdapi.FlattenConfig(raw); err != nil {
		return nil, err
	}
	rootKC := filepath.Join(dir, "root.kubeconfig")
	if err := clientcmd.WriteToFile(*raw, rootKC); err != nil {
		return nil, err
	}
	shardCA := filepath.Join(filepath.Dir(kubeconfig), "apiserver.crt")
	type entry struct {
		Path              string `json:"path"`
		Backend           string `json:"backend"`
		BackendServerCA   string `json:"backend_server_ca"`
		ProxyClientCert   string `json:"proxy_client_cert"`
		ProxyClientKey    string `json:"proxy_client_key"`
		UserHeader        string `json:"user_header,omitempty"`
		GroupHeader       string `json:"group_header,omitempty"`
		ExtraHeaderPrefix string `json:"extra_header_prefix,omitempty"`
	}
	mapping, err := yaml.Marshal([]entry{
		{Path: "/clusters/", Backend: kcpURL, BackendServerCA: shardCA, ProxyClientCert: m.FPToShard.Cert, ProxyClientKey: m.FPToShard.Key},
		// Everything else (/version, /openapi, ...) to the shard as well;
		// without a "/" mapping such paths hit a nil handler.
		{Path: "/", Backend: kcpURL, BackendServerCA: shardCA, ProxyClientCert: m.FPToShard.Cert, ProxyClientKey: m.FPToShard.Key},
		{
			Path: "/tenants/", Backend: "https://" + shimAddr, BackendServerCA: m.ShimServingCAFile, ProxyClientCert: m.FPToShim.Cert, ProxyClientKey: m.FPToShim.Key,
			UserHeader: m.UserHeader, GroupHeader: m.GroupHeader, ExtraHeaderPrefix: m.ExtraHeaderPrefix,
		},
	})
	if err != nil {
		return nil, err
	}
	mappingFile := filepath.Join(dir, "mapping.yaml")
	if err := os.WriteFile(mappingFile, mapping, 0o600); err != nil {
		return nil, err
	}
	return []string{
		"--bind-address", "127.0.0.1",
		"--mapping-file", mappingFile,
		"--root-directory", dir,
		"--root-kubeconfig", rootKC,
		"--shards-kubeconfig", rootKC,
		"--client-ca-file", m.UserCAFile,
		"--tls-cert-file", m.FPServing.Cert,
		"--tls-private-key-file", m.FPServing.Key,
	}, nil
}

// StartFrontProxy starts kcp-front-proxy in front of k's shard (see
// FrontProxyConfig) and waits until it serves.
func StartFrontProxy(ctx context.Context, g *Group, bin, dir string, k *KCP, m *MountCerts, shimAddr string) (*FrontProxy, error) {
	args, err := FrontProxyConfig(filepath.Join(dir, "front-proxy"), k.Kubeconfig, k.BaseURL, m, shimAddr)
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	p, err := Start(dir, "kcp-front-proxy", bin, append(args, "--secure-port", strconv.Itoa(port), "--v", "2"), nil)
	if err != nil {
		return nil, err
	}
	g.Add(p)
	fp := &FrontProxy{Process: p, URL: fmt.Sprintf("https://127.0.0.1:%d", port), certs: m}
	// Ready when a request through it reaches the shard: the proxy opens
	// its port only after it resolved the root identities. An admin token
	// passes through kcp-front-proxy unauthenticated to the shard.
	admin, err := k.Config()
	if err != nil {
		return nil, err
	}
	cfg := &rest.Config{Host: fp.URL + "/clusters/root", BearerToken: admin.BearerToken, TLSClientConfig: rest.TLSClientConfig{CAFile: m.FPServingCAFile}}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	return fp, Eventually(ctx, 2*time.Minute, "kcp-front-proxy to serve", func(ctx context.Context) (bool, string, error) {
		if p.Exited() {
			return false, "", fmt.Errorf("kcp-front-proxy exited: %w\n%s", ErrExited, p.Tail(20))
		}
		resp, err := hc.Get(cfg.Host + "/version")
		if err != nil {
			return false, err.Error(), nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status, nil
	})
}

// MountProxy is a running knotless-mountproxy.
type MountProxy struct {
	*Process
	// Addr is host:port of the shim's HTTPS listener.
	Addr       string
	ProbePort  int
	MetricPort int
	Bin        string
	dir        string
	args       []string
	// metricsURL is an existing shim's metrics endpoint.
	metricsURL string
}

// MountProxyArgs are the provider's flags that make it probe tenants
// through the shim at addr, and name mountURL (kcp-front-proxy) as the
// base of TenantCluster status.URL.
func (m *MountCerts) MountProxyArgs(addr, mountURL string) []string {
	return []string{
		"--mountproxy-url", "https://" + addr,
		"--mount-url", mountURL,
		"--mountproxy-ca-file", m.ShimServingCAFile,
		"--mountproxy-client-cert-file", m.Probe.Cert,
		"--mountproxy-client-key-file", m.Probe.Key,
		"--mountproxy-user-header", m.UserHeader,
		"--mountproxy-group-header", m.GroupHeader,
	}
}

// StartMountProxy starts knotless-mountproxy on addr for the provider
// workspace ws behind the front proxy at fpURL and waits until it is
// healthy.
func StartMountProxy(ctx context.Context, g *Group, bin, dir, kubeconfig, ws, addr, fpURL string, m *MountCerts) (*MountProxy, error) {
	mp := &MountProxy{Addr: addr, Bin: bin, dir: dir, args: append([]string{"--kubeconfig", kubeconfig, "--workspace", ws}, m.ShimArgs(addr, fpURL)...)}
	return mp, mp.Restart(ctx, g)
}

// ShimArgs are knotless-mountproxy's flags for serving on addr with these
// certificates and header names, behind the front proxy at fpURL (an
// address no tenant may have).
func (m *MountCerts) ShimArgs(addr, fpURL string) []string {
	return []string{
		"--allow-private-networks", AllowedNetworks,
		"--reserved-addresses", fpURL,
		"--bind-address", addr,
		"--tls-cert-file", m.ShimServing.Cert,
		"--tls-private-key-file", m.ShimServing.Key,
		"--requestheader-client-ca-file", m.ShimRequestCAFile,
		"--requestheader-username-headers", m.UserHeader,
		"--requestheader-group-headers", m.GroupHeader,
		"--requestheader-extra-headers-prefix", m.ExtraHeaderPrefix,
	}
}

// Restart starts the shim again with the same flags.
func (mp *MountProxy) Restart(ctx context.Context, g *Group) error {
	var err error
	if mp.ProbePort, err = FreePort(); err != nil {
		return err
	}
	if mp.MetricPort, err = FreePort(); err != nil {
		return err
	}
	proc, err := Start(mp.dir, "knotless-mountproxy", mp.Bin, append([]string{
		"--health-probe-bind-address", "127.0.0.1:" + strconv.Itoa(mp.ProbePort),
		"--metrics-bind-address", "127.0.0.1:" + strconv.Itoa(mp.MetricPort),
	}, mp.args...), nil)
	if err != nil {
		return err
	}
	g.Add(proc)
	mp.Process = proc
	return Eventually(ctx, 2*time.Minute, "knotless-mountproxy to be healthy", func(ctx context.Context) (bool, string, error) {
		if proc.Exited() {
			return false, "", fmt.Errorf("knotless-mountproxy exited: %w\n%s", ErrExited, proc.Tail(20))
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", mp.ProbePort))
		if err != nil {
			return false, err.Error(), nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status, nil
	})
}

// Metrics returns the shim's Prometheus text.
func (mp *MountProxy) Metrics() (string, error) {
	target := fmt.Sprintf("http://127.0.0.1:%d/metrics", mp.MetricPort)
	if mp.Process == nil {
		if mp.metricsURL == "" {
			return "", errors.New("the existing shim's metrics are unknown: set KNOTLESS_E2E_SHIM_METRICS_URL")
		}
		target = strings.TrimSuffix(mp.metricsURL, "/") + "/metrics"
	}
	resp, err := http.Get(target)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
