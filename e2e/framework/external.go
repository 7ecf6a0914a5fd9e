package framework

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// External is the mount topology of an existing kcp (the one
// KNOTLESS_E2E_KUBECONFIG names), read from the environment, so the
// mount tests run against it instead of skipping:
//
//	KNOTLESS_E2E_FRONT_PROXY_URL        kcp-front-proxy (https://host:port), with a /tenants/ mapping to the shim
//	KNOTLESS_E2E_FRONT_PROXY_CA_FILE    CA of kcp-front-proxy's serving certificate
//	KNOTLESS_E2E_CLIENT_CA_FILE, _KEY_FILE
//	                                    a CA kcp-front-proxy accepts client certificates of (its --client-ca-file):
//	                                    the suite issues its users' certificates (alice, bob) with it
//	KNOTLESS_E2E_SHIM_URL               knotless-mountproxy as the suite reaches it (https://host:port)
//	KNOTLESS_E2E_SHIM_CA_FILE           CA of the shim's serving certificate
//	KNOTLESS_E2E_SHIM_CLIENT_CA_FILE, _KEY_FILE
//	                                    the shim's requestheader CA: the suite issues kcp-front-proxy's
//	                                    (CN kcp-front-proxy) and the probe's (CN knotless-probe) certificates
//	KNOTLESS_E2E_SHIM_USER_HEADER, _GROUP_HEADER, _EXTRA_HEADER_PREFIX
//	                                    the identity header names of the /tenants/ mapping and the shim
//	KNOTLESS_E2E_SHIM_METRICS_URL       optional: the shim's metrics endpoint (http://host:port)
//
// The shim must serve the suite's provider workspace
// (KNOTLESS_E2E_PROVIDER_WORKSPACE) and reach the tenants the tests start
// on 127.0.0.1 of the machine that runs the suite (run it there, e.g.
// docker run --network host as hack/kind-e2e.sh does).
type External struct {
	FrontProxyURL, FrontProxyCAFile string
	ClientCA                        *CA
	ShimURL, ShimCAFile             string
	ShimClientCA                    *CA
	ShimMetricsURL                  string
	UserHeader, GroupHeader, Extra  string
}

// ExternalFromEnv reads the External topology; nil when
// KNOTLESS_E2E_FRONT_PROXY_URL is not set. Every other variable is then
// required.
func ExternalFromEnv() (*External, error) {
	fp := os.Getenv("KNOTLESS_E2E_FRONT_PROXY_URL")
	if fp == "" {
		return nil, nil
	}
	var missing []string
	get := func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			missing = append(missing, name)
		}
		return v
	}
	x := &External{
		FrontProxyURL:    strings.TrimSuffix(fp, "/"),
		FrontProxyCAFile: get("KNOTLESS_E2E_FRONT_PROXY_CA_FILE"),
		ShimURL:          strings.TrimSuffix(get("KNOTLESS_E2E_SHIM_URL"), "/"),
		ShimCAFile:       get("KNOTLESS_E2E_SHIM_CA_FILE"),
		ShimMetricsURL:   os.Getenv("KNOTLESS_E2E_SHIM_METRICS_URL"),
		UserHeader:       get("KNOTLESS_E2E_SHIM_USER_HEADER"),
		GroupHeader:      get("KNOTLESS_E2E_SHIM_GROUP_HEADER"),
		Extra:            get("KNOTLESS_E2E_SHIM_EXTRA_HEADER_PREFIX"),
	}
	clientCA, clientKey := get("KNOTLESS_E2E_CLIENT_CA_FILE"), get("KNOTLESS_E2E_CLIENT_CA_KEY_FILE")
	shimCA, shimKey := get("KNOTLESS_E2E_SHIM_CLIENT_CA_FILE"), get("KNOTLESS_E2E_SHIM_CLIENT_CA_KEY_FILE")
	if len(missing) > 0 {
		return nil, fmt.Errorf("KNOTLESS_E2E_FRONT_PROXY_URL is set, so the mount topology of the existing kcp is used; missing: %s (e2e/framework/external.go)", strings.Join(missing, ", "))
	}
	var err error
	if x.ClientCA, err = LoadCA(clientCA, clientKey); err != nil {
		return nil, fmt.Errorf("KNOTLESS_E2E_CLIENT_CA_FILE: %w", err)
	}
	if x.ShimClientCA, err = LoadCA(shimCA, shimKey); err != nil {
		return nil, fmt.Errorf("KNOTLESS_E2E_SHIM_CLIENT_CA_FILE: %w", err)
	}
	if u, err := url.Parse(x.ShimURL); err != nil || u.Scheme != "https" || u.Port() == "" {
		return nil, errors.New("KNOTLESS_E2E_SHIM_URL must be https://host:port")
	}
	return x, nil
}

// ShimAddr is the shim's host:port.
func (x *External) ShimAddr() string { return strings.TrimPrefix(x.ShimURL, "https://") }

// MountCerts returns the suite's view of the external topology's
// certificates, issuing kcp-front-proxy's and the probe's client
// certificates of the shim's requestheader CA into dir. The shim's own
// serving certificate is not the suite's: rotation tests skip.
func (x *External) MountCerts(dir string) (*MountCerts, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	servingCA, err := os.ReadFile(x.ShimCAFile)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(servingCA)
	if block == nil {
		return nil, errors.New("KNOTLESS_E2E_SHIM_CA_FILE holds no PEM certificate")
	}
	servingCert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, err
	}
	m := &MountCerts{
		Dir:               dir,
		UserCA:            x.ClientCA,
		ShimServingCA:     &CA{Cert: servingCert, PEM: servingCA},
		ShimRequestCA:     x.ShimClientCA,
		UserCAFile:        filepath.Join(dir, "user-ca.crt"),
		ShimServingCAFile: x.ShimCAFile,
		ShimRequestCAFile: filepath.Join(dir, "mountproxy-requestheader-ca.crt"),
		FPServingCAFile:   x.FrontProxyCAFile,
		UserHeader:        x.UserHeader, GroupHeader: x.GroupHeader, ExtraHeaderPrefix: x.Extra,
		External: true,
	}
	if err := os.WriteFile(m.UserCAFile, x.ClientCA.PEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(m.ShimRequestCAFile, x.ShimClientCA.PEM, 0o600); err != nil {
		return nil, err
	}
	for _, c := range []struct {
		out  *KeyPair
		name string
	}{{&m.FPToShim, "kcp-front-proxy"}, {&m.Probe, "knotless-probe"}} {
		if *c.out, err = m.issue(x.ShimClientCA, c.name); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// FrontProxy returns the existing kcp-front-proxy (no process).
func (x *External) FrontProxy(m *MountCerts) *FrontProxy {
	return &FrontProxy{URL: x.FrontProxyURL, certs: m}
}

// MountProxy returns the existing shim (no process; Metrics needs
// KNOTLESS_E2E_SHIM_METRICS_URL).
func (x *External) MountProxy() *MountProxy {
	return &MountProxy{Addr: x.ShimAddr(), metricsURL: x.ShimMetricsURL}
}

// LoadCA reads a CA certificate and its private key (PEM: PKCS#8, PKCS#1
// or EC) to issue certificates with.
func LoadCA(certFile, keyFile string) (*CA, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%s is not a CA certificate", certFile)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: the key cannot sign", keyFile)
	}
	raw, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: signer, PEM: raw}, nil
}
